"""Replay bundles: config, name sanitisation, sub-model extraction, replay in a subprocess."""

from __future__ import annotations

import json
import os
import pathlib
import runpy
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnx_sbs_nb.align.post.replay import (
    ReplayConfig,
    safe_child,
    safe_dirname,
    write_replay_bundle,
)
from onnx_sbs_nb.align.post.submodel import extract_submodel, prefix_model, submodel_inputs
from onnx_sbs_nb.records import KIND_WEIGHT, Record

from ...models import CausalAttention
from ...onnx_values import onnx_values

# --------------------------------------------------------------------------- helpers


def fx_values(ep: torch.export.ExportedProgram, args: tuple) -> dict[str, torch.Tensor]:
    """Every tensor the exported program computes, by fx node name."""
    values: dict[str, torch.Tensor] = {}

    class Recorder(torch.fx.Interpreter):
        def run_node(self, n):
            result = super().run_node(n)
            if isinstance(result, torch.Tensor):
                values[n.name] = result.detach()
            return result

    with torch.no_grad():
        Recorder(ep.module()).run(*args)
    return values


def run_onnx(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def corrupt_initializer(model: onnx.ModelProto, name: str, delta: float) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for i, init in enumerate(m.graph.initializer):
        if init.name == name:
            arr = numpy_helper.to_array(init).copy()
            arr.flat[0] += delta
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, name))
            return m
    raise KeyError(name)


def run_replay_here(folder: pathlib.Path, capsys, *extra: str) -> dict:
    """replay.py run in this process (cheaper: a fresh interpreter imports torch again)."""
    script = runpy.run_path(str(folder / "replay.py"), run_name="replay_bundle")
    capsys.readouterr()
    assert script["main"](["--json", *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def run_replay(folder: pathlib.Path, *extra: str) -> dict:
    """replay.py run in a fresh interpreter, from its own folder, as a user would."""
    out = subprocess.run(
        [sys.executable, "replay.py", "--json", *extra],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = torch.nn.Linear(4, 8)
        self.l2 = torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.l2(torch.relu(self.l1(x)))


def _export(module: torch.nn.Module, args: tuple):
    torch.manual_seed(0)
    ep = torch.export.export(module.eval(), args)
    onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return ep, onx


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    args = (torch.randn(2, 4),)
    ep, onx = _export(MLP(), args)
    return ep, onx, args


@pytest.fixture(scope="module")
def attention():
    torch.manual_seed(0)
    args = (torch.randn(2, 5, 16),)
    ep, onx = _export(CausalAttention(), args)
    return ep, onx, args


def node_named(model: onnx.ModelProto, output: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if output in n.output)


# --------------------------------------------------------------------------- ReplayConfig


def test_replay_config_json_round_trip(tmp_path):
    cfg = ReplayConfig(names=["node_linear", "relu"], op_types=["Gemm"], threshold=1e-3,
                       prefix_model=True, max_nodes=3)  # fmt: skip
    assert ReplayConfig.from_json(cfg.to_json()) == cfg
    path = cfg.save(tmp_path / "cfg.json")
    assert ReplayConfig.load(path) == cfg
    assert json.loads(path.read_text())["op_types"] == ["Gemm"]


def test_replay_config_rejects_bad_input_clearly():
    with pytest.raises(ValueError, match="unknown ReplayConfig keys.*colour"):
        ReplayConfig.from_json('{"names": [], "colour": 1}')
    with pytest.raises(TypeError, match="names must be a list of str"):
        ReplayConfig(names="node_linear")
    with pytest.raises(TypeError, match="threshold"):
        ReplayConfig(threshold="big")
    with pytest.raises(ValueError, match="max_nodes"):
        ReplayConfig(max_nodes=-1)
    with pytest.raises(ValueError, match="must be an object"):
        ReplayConfig.from_json("[1, 2]")


def test_replay_config_selects_by_name_op_type_and_threshold():
    def r(name, op, err, err2=None, kind="node", idx=0):
        return Record(onnx_name=name, ep_name="fx_" + name, onnx_op_type=op, err_abs=err,
                      err_abs2=err2, kind=kind, onnx_id_node=idx)  # fmt: skip

    gemm = r("linear", "Gemm", 0.5, idx=1)
    relu = r("relu", "Relu", 1e-6, idx=2)
    inherited = r("add", "Add", 0.5, err2=0.0, idx=3)
    weight = r("w", "initializer", 1.0, kind=KIND_WEIGHT, idx=-1)
    assert not ReplayConfig().selects(gemm)  # empty config selects nothing
    assert ReplayConfig(names=["linear"]).selects(gemm)
    assert ReplayConfig(names=["fx_relu"]).selects(relu)  # fx name
    assert ReplayConfig(names=["node_relu"]).selects(relu, node_name="node_relu")
    assert not ReplayConfig(names=["node_relu"]).selects(relu)
    assert ReplayConfig(op_types=["Relu"]).selects(relu)
    assert not ReplayConfig(op_types=["Relu"]).selects(gemm)
    # threshold alone: on own error when the node was rerun
    thr = ReplayConfig(threshold=1e-3)
    assert thr.selects(gemm) and not thr.selects(relu) and not thr.selects(inherited)
    assert thr.selects(r("n", "Add", float("nan"), idx=9))
    # names/op types AND threshold
    assert not ReplayConfig(op_types=["Relu"], threshold=1e-3).selects(relu)
    assert not ReplayConfig(names=["w"], threshold=0.0).selects(weight)  # no ONNX node
    records = [gemm, r("linear", "Gemm", 0.6, idx=1), relu, inherited, r("x", "Gemm", 2, idx=5)]
    picked = ReplayConfig(op_types=["Gemm"], max_nodes=5).select(records)
    assert [p.onnx_id_node for p in picked] == [1, 5]  # one per node
    assert len(ReplayConfig(op_types=["Gemm"], max_nodes=1).select(records)) == 1


# --------------------------------------------------------------------------- sanitising

HOSTILE = [
    "../x",
    "../../etc/passwd",
    "/abs/path",
    "<img src=x onerror=alert(1)>",
    "a" * 5000,
    "ñøde/ü\u202e\u0000nul",
    "",
    ".",
    "..",
    "C:\\windows\\system32",
    "~/.bashrc",
]


@pytest.mark.parametrize("name", HOSTILE)
def test_safe_dirname_is_plain_bounded_and_unique(name):
    d = safe_dirname(name)
    assert d and len(d) <= 80
    assert all(c.isascii() and (c.isalnum() or c in "._-") for c in d)
    assert not d.startswith(".")
    assert d != safe_dirname(name + "x")


def test_safe_dirname_keeps_names_that_sanitise_alike_apart():
    assert safe_dirname("a/b") != safe_dirname("a_b") != safe_dirname("a:b")


def test_safe_child_refuses_a_symlink_pointing_outside(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / safe_dirname("evil")).symlink_to(outside, target_is_directory=True)
    with pytest.raises(ValueError, match="not directly inside"):
        safe_child(root, "evil")


def _relu_model(node_name: str) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name=node_name)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _tree(path: pathlib.Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def test_bundles_for_hostile_names_stay_inside_root(tmp_path):
    base = tmp_path / "base"
    root = base / "deep" / "root"
    root.mkdir(parents=True)
    (base / "sentinel").write_text("keep")
    before = _tree(base)
    x = torch.tensor([-1.0, 0.0, 2.0])
    folders = set()
    for name in HOSTILE:
        folder = write_replay_bundle(
            root,
            model=_relu_model(name),
            node_name=name,
            torch_inputs={"x": x},
            onnx_inputs={"x": x.numpy()},
            expected={"y": torch.relu(x)},
            mapping={"x": "x", "y": "relu"},
        )
        assert folder.parent == root.resolve()
        folders.add(folder.name)
        loaded = onnx.load(str(folder / "model.onnx"))
        assert loaded.graph.node[0].name == name
    assert len(folders) == len(HOSTILE)
    after = _tree(base)
    outside = {p for p in after - before if not p.startswith("deep/root/")}
    assert outside == set()
    assert (base / "sentinel").read_text() == "keep"


# --------------------------------------------------------------------------- sub-models


def test_submodel_inputs_walks_back_to_values_with_partners(mlp):
    _, onx, _ = mlp
    gemm2 = node_named(onx, "linear_1")
    # relu has a partner: the sub-model starts there; weights stay initializers
    assert submodel_inputs(onx, gemm2.name, lambda n: n in {"x", "relu"}) == ["relu"]
    # relu has none: walk back through Relu to linear
    assert submodel_inputs(onx, gemm2.name, lambda n: n in {"x", "linear"}) == ["linear"]
    assert submodel_inputs(onx, gemm2.name, lambda n: False) == ["x"]
    with pytest.raises(ValueError, match="no node named 'nope'"):
        submodel_inputs(onx, "nope", lambda n: True)


def test_extract_submodel_mlp_matches_the_full_model(mlp):
    ep, onx, args = mlp
    feeds = {"x": args[0].numpy()}
    full = onnx_values(onx, feeds)
    gemm2 = node_named(onx, "linear_1")
    sub = extract_submodel(onx, gemm2.name, ["linear"], {"linear": (TensorProto.FLOAT, [2, 8])})
    assert [i.name for i in sub.graph.input] == ["linear"]
    assert {i.name for i in sub.graph.initializer} == {"l2.weight", "l2.bias"}
    assert [n.op_type for n in sub.graph.node] == ["Relu", "Gemm"]
    dims = [d.dim_value for d in sub.graph.output[0].type.tensor_type.shape.dim]
    assert dims == [2, 3]
    (got,) = run_onnx(sub, {"linear": full["linear"]})
    np.testing.assert_allclose(got, full["linear_1"], rtol=1e-6)

    pre = prefix_model(onx, gemm2.name)
    assert [i.name for i in pre.graph.input] == ["x"]
    np.testing.assert_allclose(run_onnx(pre, feeds)[0], full["linear_1"], rtol=1e-6)
    with pytest.raises(ValueError, match="initializers"):
        extract_submodel(onx, gemm2.name, ["l2.weight", "relu"])


def test_extract_submodel_attention_with_sdpa(attention):
    ep, onx, args = attention
    values = fx_values(ep, args)
    sdpa = node_named(onx, "scaled_dot_product_attention")
    inputs = submodel_inputs(onx, sdpa.name, lambda n: n in values)
    assert inputs and all(n in values for n in inputs)
    shapes = {n: (TensorProto.FLOAT, list(values[n].shape)) for n in inputs}
    sub = extract_submodel(onx, sdpa.name, inputs, shapes)
    assert len(sub.graph.node) > 1  # the decomposition's unpaired values are inside
    (got,) = run_onnx(sub, {n: values[n].numpy() for n in inputs})
    np.testing.assert_allclose(
        got, values["scaled_dot_product_attention"].numpy(), atol=1e-5, rtol=1e-4
    )


def _function_model() -> onnx.ModelProto:
    """y = Neg(LocalGelu(x + w)); LocalGelu calls LocalScale (a nested local function)."""
    scale = helper.make_function(
        "local",
        "LocalScale",
        ["a"],
        ["b"],
        [
            helper.make_node("Constant", [], ["half"], value_float=0.5),
            helper.make_node("Mul", ["a", "half"], ["b"]),
        ],
        opset_imports=[helper.make_opsetid("", 18)],
    )
    gelu = helper.make_function(
        "local",
        "LocalGelu",
        ["a"],
        ["b"],
        [
            helper.make_node("Tanh", ["a"], ["t"]),
            helper.make_node("LocalScale", ["t"], ["s"], domain="local"),
            helper.make_node("Add", ["a", "s"], ["b"]),
        ],
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
    )
    unused = helper.make_function(
        "local", "Unused", ["a"], ["b"], [helper.make_node("Identity", ["a"], ["b"])],
        opset_imports=[helper.make_opsetid("", 18)],
    )  # fmt: skip
    w = numpy_helper.from_array(np.arange(4, dtype=np.float32), "w")
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "w"], ["xw"], name="add"),
            helper.make_node("LocalGelu", ["xw"], ["g"], name="gelu", domain="local"),
            helper.make_node("Neg", ["g"], ["y"], name="neg"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        initializer=[w],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
        functions=[scale, gelu, unused],
    )
    onnx.checker.check_model(model)
    return model


def test_extract_submodel_keeps_local_functions_transitively():
    model = _function_model()
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    full = onnx_values(model, {"x": x})
    sub = extract_submodel(model, "gelu", ["xw"], {"xw": (TensorProto.FLOAT, [2, 4])})
    assert sorted(f.name for f in sub.functions) == ["LocalGelu", "LocalScale"]
    assert {o.domain for o in sub.opset_import} == {"", "local"}
    np.testing.assert_allclose(run_onnx(sub, {"xw": full["xw"]})[0], full["g"], rtol=1e-6)
    # from the graph input: the initializer comes along, no function is dropped
    sub2 = extract_submodel(model, "neg", ["x"], {"x": (TensorProto.FLOAT, [2, 4])})
    assert [i.name for i in sub2.graph.initializer] == ["w"]
    np.testing.assert_allclose(run_onnx(sub2, {"x": x})[0], full["y"], rtol=1e-6)
    # a node that needs no function carries none
    assert not extract_submodel(model, "neg", ["g"], {"g": (TensorProto.FLOAT, [2, 4])}).functions


def test_extract_submodel_loads_external_data(tmp_path, mlp):
    _, onx, args = mlp
    path = tmp_path / "ext" / "model.onnx"
    path.parent.mkdir()
    copy = onnx.ModelProto()
    copy.CopyFrom(onx)  # saving with external data rewrites the proto it is given
    onnx.save_model(copy, str(path), save_as_external_data=True, location="model.onnx.data",
                    size_threshold=0)  # fmt: skip
    shallow = onnx.load(str(path), load_external_data=False)
    gemm2 = node_named(shallow, "linear_1")
    with pytest.raises(ValueError, match="base_dir"):
        extract_submodel(shallow, gemm2.name, ["relu"])
    sub = extract_submodel(shallow, gemm2.name, ["relu"], base_dir=path.parent)
    for init in sub.graph.initializer:
        assert init.data_location == TensorProto.DEFAULT and not init.external_data
    full = onnx_values(onx, {"x": args[0].numpy()})
    # the sub-model runs from bytes, with no folder to find data in
    np.testing.assert_allclose(run_onnx(sub, {"relu": full["relu"]})[0], full["linear_1"],
                               rtol=1e-6)  # fmt: skip


def test_missing_types_give_a_clear_error():
    # an op shape inference knows nothing about, and no value_info: no way to type y
    graph = helper.make_graph(
        [helper.make_node("Mystery", ["x"], ["y"], name="r", domain="custom")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [onnx.ValueInfoProto(name="y")],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("custom", 1)]
    )
    with pytest.raises(ValueError, match="type of 'y' is unknown"):
        extract_submodel(model, "r", ["x"])


# --------------------------------------------------------------------------- bundles


def test_bundle_replays_a_corrupted_weight_in_a_subprocess(tmp_path, mlp, capsys):
    ep, onx, args = mlp
    bad = corrupt_initializer(onx, "l1.weight", 0.75)
    values = fx_values(ep, args)
    onnx_vals = onnx_values(bad, {"x": args[0].numpy()})
    # first-run error of each node output, and the own error of the corrupted Gemm
    err = {n: float(np.abs(onnx_vals[n] - values[n].numpy()).max()) for n in ("linear", "relu")}
    err["linear_1"] = float(np.abs(onnx_vals["linear_1"] - values["linear_1"].numpy()).max())
    w_bad = torch.from_numpy(numpy_helper.to_array(node_init(bad, "l1.weight")).copy())
    own = torch.nn.functional.linear(args[0], w_bad, ep.state_dict["l1.bias"].detach())
    own_err = float((own - values["linear"]).abs().max())
    assert own_err > 0.1

    def bundle(output: str, record: Record, **kw) -> pathlib.Path:
        node = node_named(bad, output)
        inputs = submodel_inputs(bad, node.name, lambda n: n in values)
        return write_replay_bundle(
            tmp_path / "bundles",
            model=bad,
            node_name=node.name,
            torch_inputs={n: values[n] for n in inputs},
            onnx_inputs={n: onnx_vals[n] for n in inputs},
            expected={output: values[output]},
            mapping={n: n for n in [*inputs, output]},
            record=record,
            **kw,
        )

    rec1 = Record(onnx_name="linear", ep_name="linear", onnx_op_type="Gemm",
                  err_abs=err["linear"], err_abs2=own_err)  # fmt: skip
    folder = bundle("linear", rec1, prefix_inputs={"x": args[0]})
    names = {p.name for p in folder.iterdir()}
    assert {"model.onnx", "torch_inputs.pt", "onnx_inputs.pt", "expected.pt", "mapping.json",
            "record.json", "replay.py", "prefix_model.onnx", "prefix_inputs.pt"} <= names  # fmt: skip
    for pt in folder.glob("*.pt"):
        loaded = torch.load(pt, weights_only=True)
        assert isinstance(loaded, dict) and all(
            isinstance(v, torch.Tensor) for v in loaded.values()
        )
    assert Record.from_dict(json.loads((folder / "record.json").read_text())) == rec1

    out = run_replay(folder, "--prefix")
    assert out["node"] == node_named(bad, "linear").name
    assert out["max_abs_torch_inputs"] == pytest.approx(own_err, rel=1e-4)
    assert out["max_abs_onnx_inputs"] == pytest.approx(err["linear"], rel=1e-4)
    assert out["max_abs_prefix"] == pytest.approx(err["linear"], rel=1e-4)
    assert out["recorded"]["err_abs2"] == own_err

    # downstream Gemm: its own error is nil, the inherited one is not
    rec2 = Record(onnx_name="linear_1", onnx_op_type="Gemm", err_abs=err["linear_1"])
    out2 = run_replay_here(bundle("linear_1", rec2), capsys)
    assert out2["max_abs_torch_inputs"] < 1e-5
    assert out2["max_abs_onnx_inputs"] == pytest.approx(err["linear_1"], rel=1e-4)
    assert err["linear_1"] > 0.01

    # the human-readable output names the node and both discrepancies (in-process: the
    # subprocess runs above already prove the script is standalone)
    script = runpy.run_path(str(folder / "replay.py"), run_name="replay_bundle")
    assert script["main"]([]) == 0
    text = capsys.readouterr().out
    assert node_named(bad, "linear").name in text
    assert "on torch_inputs" in text and "on onnx_inputs" in text


def node_init(model: onnx.ModelProto, name: str) -> onnx.TensorProto:
    return next(i for i in model.graph.initializer if i.name == name)


def test_bundle_of_sdpa_reproduces_nothing_when_nothing_is_wrong(tmp_path, attention, capsys):
    ep, onx, args = attention
    values = fx_values(ep, args)
    feeds = {onx.graph.input[0].name: args[0].numpy()}
    onnx_vals = onnx_values(onx, feeds)
    node = node_named(onx, "scaled_dot_product_attention")
    inputs = submodel_inputs(onx, node.name, lambda n: n in values)
    folder = write_replay_bundle(
        tmp_path,
        model=onx,
        node_name=node.name,
        torch_inputs={n: values[n] for n in inputs},
        onnx_inputs={n: onnx_vals[n] for n in inputs},
        expected={"scaled_dot_product_attention": values["scaled_dot_product_attention"]},
        mapping={},
    )
    sub = onnx.load(str(folder / "model.onnx"))
    onnx.checker.check_model(sub)
    assert sorted(i.name for i in sub.graph.input) == sorted(inputs)
    out = run_replay_here(folder, capsys)
    assert out["max_abs_torch_inputs"] < 1e-5
    assert out["max_abs_onnx_inputs"] < 1e-5


def test_bundle_of_a_node_without_torch_partner_compares_the_two_runs(tmp_path, attention, capsys):
    """An output nobody on the torch side computes: replay compares the two ONNX runs."""
    ep, onx, args = attention
    values = fx_values(ep, args)
    softmax = next(n for n in onx.graph.node if n.op_type == "Softmax")
    assert softmax.output[0] not in values  # inside the SDPA decomposition
    feeds = {onx.graph.input[0].name: args[0].numpy()}
    # perturb the ONNX values the sub-model starts from, as an upstream error would
    inputs = submodel_inputs(onx, softmax.name, lambda n: n in values)
    onnx_vals = {n: values[n].numpy() + 0.25 for n in inputs}
    folder = write_replay_bundle(tmp_path, model=onx, node_name=softmax.name,
                                 torch_inputs={n: values[n] for n in inputs},
                                 onnx_inputs=onnx_vals, expected={}, mapping={})  # fmt: skip
    assert torch.load(folder / "expected.pt", weights_only=True) == {}
    out = run_replay_here(folder, capsys)
    (entry,) = out["outputs"]
    assert entry["name"] == softmax.output[0] and entry["has_expected"] is False
    assert out["max_abs_torch_inputs"] is None
    assert entry["between_runs"]["max_abs"] > 1e-3
    full = onnx_values(onx, feeds)
    got = torch.load(folder / "torch_inputs.pt", weights_only=True)
    assert all(np.allclose(got[n].numpy(), full[n], atol=1e-5) for n in inputs)


def test_bundle_rejects_missing_values_with_names(tmp_path, mlp):
    _, onx, args = mlp
    node = node_named(onx, "linear_1")
    with pytest.raises(ValueError, match=r"onnx_inputs lacks \['relu'\]"):
        write_replay_bundle(tmp_path, model=onx, node_name=node.name,
                            torch_inputs={"relu": torch.zeros(2, 8)}, onnx_inputs={},
                            expected={"linear_1": torch.zeros(2, 3)}, mapping={})  # fmt: skip
    with pytest.raises(ValueError, match="not outputs of node"):
        write_replay_bundle(tmp_path, model=onx, node_name=node.name,
                            torch_inputs={"relu": torch.zeros(2, 8)},
                            onnx_inputs={"relu": np.zeros((2, 8), np.float32)},
                            expected={"relu": torch.zeros(2, 8)}, mapping={})  # fmt: skip
    assert not any(tmp_path.iterdir())  # nothing written on error


def test_bundle_bfloat16_values_round_trip(tmp_path, capsys):
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"], name="r")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.BFLOAT16, [4])],
        [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [4])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = torch.tensor([-1.0, 0.5, 2.0, -3.0], dtype=torch.bfloat16)
    import ml_dtypes

    x_np = x.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    folder = write_replay_bundle(tmp_path, model=model, node_name="r", torch_inputs={"x": x},
                                 onnx_inputs={"x": x_np}, expected={"y": x + 1},
                                 mapping={})  # fmt: skip
    o = torch.load(folder / "onnx_inputs.pt", weights_only=True)
    assert o["x"].dtype == torch.bfloat16 and torch.equal(o["x"], x)
    out = run_replay_here(folder, capsys)
    assert out["max_abs_torch_inputs"] == pytest.approx(1.0)


def test_bundles_through_the_engine_with_a_replay_config(tmp_path, mlp):
    from onnx_sbs_nb.align import run as run_mod

    ep, onx, args = mlp
    bad = corrupt_initializer(onx, "l1.weight", 0.75)
    cfg = ReplayConfig.from_json(ReplayConfig(threshold=1e-3, prefix_model=True).to_json())
    run = run_mod.AlignedRun(ep, bad, args, own_error=True, replay=cfg,
                             replay_dir=tmp_path / "bundles")  # fmt: skip
    records = list(run)
    rec = next(r for r in records if r.onnx_name == "linear")
    # only the node making the error is selected: the others inherit it
    own_failures = [r for r in records if cfg.selects(r)]
    assert [r.onnx_name for r in own_failures] == ["linear"]
    written = run.status.extra.get("replay_bundles")
    assert written and len(written) == 1, run.status.extra
    folder = pathlib.Path(written[0])
    assert folder.parent == (tmp_path / "bundles").resolve()
    assert (folder / "prefix_model.onnx").exists()
    out = run_replay(folder, "--prefix")
    assert out["node"] == node_named(bad, "linear").name
    assert out["max_abs_onnx_inputs"] == pytest.approx(rec.err_abs, rel=1e-3, abs=1e-6)
    assert out["max_abs_torch_inputs"] == pytest.approx(rec.err_abs2, rel=1e-3, abs=1e-6)
    assert out["max_abs_prefix"] == pytest.approx(rec.err_abs, rel=1e-3, abs=1e-6)
    # save_replay on demand, for a node that inherits its error
    again = run.actions.save_replay(node_named(bad, "linear_1").name, tmp_path / "manual")
    assert json.loads((again / "record.json").read_text())["onnx_name"] == "linear_1"


def test_replay_template_is_standalone():
    """replay.py must import nothing from this package: it runs where it is not installed."""
    from onnx_sbs_nb.align.post.replay import TEMPLATE

    src = TEMPLATE.read_text()
    assert "onnx_sbs_nb" not in src.replace("(written by onnx_sbs_nb)", "")
    compile(src, str(TEMPLATE), "exec")
    assert os.path.basename(TEMPLATE) == "replay_template.py"


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bundle_of_cuda_values_loads_on_a_cpu_machine(tmp_path, mlp, capsys):
    _, onx, args = mlp
    node = node_named(onx, "linear_1")
    relu = torch.relu(torch.randn(2, 8)).cuda()
    folder = write_replay_bundle(tmp_path, model=onx, node_name=node.name,
                                 torch_inputs={"relu": relu}, onnx_inputs={"relu": relu},
                                 expected={"linear_1": torch.zeros(2, 3, device="cuda")},
                                 mapping={})  # fmt: skip
    for pt in ("torch_inputs.pt", "onnx_inputs.pt", "expected.pt"):
        loaded = torch.load(folder / pt, weights_only=True)
        assert all(v.device.type == "cpu" for v in loaded.values())
    out = run_replay_here(folder, capsys)
    assert out["max_abs_torch_inputs"] == pytest.approx(out["max_abs_onnx_inputs"])


def test_big_sub_models_keep_their_weights_inside_the_bundle(tmp_path, mlp, capsys, monkeypatch):
    """Beyond protobuf's limit the weights go to model.onnx.data, next to model.onnx."""
    from onnx_sbs_nb.align.post import replay as replay_mod

    _, onx, args = mlp
    full = onnx_values(onx, {"x": args[0].numpy()})
    node = node_named(onx, "linear_1")
    kwargs = dict(model=onx, node_name=node.name, torch_inputs={"relu": torch.from_numpy(full["relu"])},
                  onnx_inputs={"relu": full["relu"]}, mapping={},
                  expected={"linear_1": torch.from_numpy(full["linear_1"])})  # fmt: skip
    first = write_replay_bundle(tmp_path, prefix_inputs={"x": args[0]}, **kwargs)
    assert (first / "prefix_model.onnx").exists()
    monkeypatch.setattr(replay_mod, "PROTOBUF_LIMIT", 0)
    folder = write_replay_bundle(tmp_path, **kwargs)
    assert folder == first
    assert (folder / "model.onnx.data").exists()
    assert not (folder / "prefix_model.onnx").exists()  # the previous bundle's file is gone
    shallow = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    assert all(
        e.value == "model.onnx.data"
        for t in shallow.graph.initializer
        for e in t.external_data
        if e.key == "location"
    )
    out = run_replay_here(folder, capsys)
    assert out["max_abs_torch_inputs"] < 1e-5


def test_extract_submodel_follows_values_a_subgraph_reads_from_outside():
    """An If branch reading an outer value: its producer must come along."""
    then_g = helper.make_graph(
        [helper.make_node("Neg", ["outer"], ["t"])],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["outer"], ["e"])],
        "else",
        [],
        [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["outer"], name="relu"),
            helper.make_node(
                "If", ["cond"], ["y"], name="if", then_branch=then_g, else_branch=else_g
            ),  # fmt: skip
        ],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("cond", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    assert submodel_inputs(model, "if", lambda n: n == "cond") == ["cond", "x"]
    assert submodel_inputs(model, "if", lambda n: n in {"cond", "outer"}) == ["cond", "outer"]
    sub = extract_submodel(model, "if", ["cond", "x"])
    assert [n.name for n in sub.graph.node] == ["relu", "if"]
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    (got,) = run_onnx(sub, {"cond": np.array(True), "x": x})
    np.testing.assert_allclose(got, -np.maximum(x, 0))
