"""Engine behaviour: fault injection, streaming, status, stop, reset, rerun, bad input."""

from __future__ import annotations

import copy
import gc
import re
import threading
import weakref

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.run import AlignedRun, SbsMismatchError
from onnx_sbs_nb.align.source.loading import SbsInputError
from onnx_sbs_nb.records import (
    KIND_WEIGHT,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_SHAPE_MISMATCH,
    STATUS_UNPAIRED_OUTPUT,
)

from ...models import MLP, Chain, export, mlp_export


@pytest.fixture(scope="module")
def mlp():
    return mlp_export()


@pytest.fixture(scope="module")
def softmax_model():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(6, 6)

        def forward(self, x):
            y = torch.softmax(self.lin(x), dim=-1)
            return torch.nn.functional.leaky_relu(y - 0.1, 0.2) * 3

    x = torch.randn(4, 6)
    ep, onx = export(M(), (x,))
    return ep, onx, (x,)


def _with_attribute(onx, op_type, name, value):
    """A copy of the model whose first ``op_type`` node has attribute ``name`` changed."""
    bad = copy.deepcopy(onx)
    node = next(n for n in bad.graph.node if n.op_type == op_type)
    attr = next(a for a in node.attribute if a.name == name)
    attr.CopyFrom(onnx.helper.make_attribute(name, value))
    return bad, node


def _first_failure(records):
    return next(r for r in records if r.failed)


def _set_initializer(onx, name, fn):
    model = copy.deepcopy(onx)
    for init in model.graph.initializer:
        if init.name == name:
            arr = fn(numpy_helper.to_array(init).copy())
            init.CopyFrom(numpy_helper.from_array(arr, name))
            return model
    raise KeyError(name)


def test_corrupted_weight_is_first_failure(mlp):
    ep, onx, args = mlp

    def corrupt(a):
        a[0, 0] += 1.0
        return a

    # fc2's weight is folded by the exporter (transposed or not): find its initializer
    recs = list(run_aligned(ep, onx, args))
    w = next(r for r in recs if r.kind == KIND_WEIGHT and r.ep_name == "p_fc2_weight")
    bad = _set_initializer(onx, w.onnx_name, corrupt)
    recs = list(run_aligned(ep, bad, args))
    first = _first_failure(recs)
    assert first.onnx_name == w.onnx_name and first.status == STATUS_FAIL
    assert first.err_abs == pytest.approx(1.0, rel=1e-5)
    # the node consuming the weight is the first failing node; every node before it passes
    nodes = [
        r
        for r in recs
        if r.kind in ("node", "output") and r.status not in ("unpaired_ep", "unpaired_onnx")
    ]
    first_node = next(r for r in nodes if r.failed)
    assert first_node.ep_name == "linear_1"
    assert all(r.status == STATUS_OK for r in nodes[: nodes.index(first_node)])


def test_changed_attribute_is_first_failing_node(softmax_model):
    ep, onx, args = softmax_model
    bad, node = _with_attribute(onx, "LeakyRelu", "alpha", 0.5)
    recs = list(run_aligned(ep, bad, args))
    first = _first_failure(recs)
    assert first.onnx_op_type == "LeakyRelu" and first.status == STATUS_FAIL
    before = [r for r in recs[: recs.index(first)] if r.passed is not None]
    assert before and all(r.passed for r in before)


def test_rerun_separates_own_from_inherited_error(softmax_model):
    ep, onx, args = softmax_model
    bad, node = _with_attribute(onx, "Softmax", "axis", 0)
    recs = list(run_aligned(ep, bad, args, own_error=True))
    soft = next(r for r in recs if r.onnx_op_type == "Softmax")
    assert soft.passed is False and soft.passed2 is False  # makes the error
    downstream = [r for r in recs if r.step > soft.step and r.err_abs2 is not None]
    assert downstream
    inherited = [r for r in downstream if r.passed is False]
    assert inherited and all(r.passed2 for r in inherited)  # inherit it


def test_reset_stops_propagation(softmax_model):
    ep, onx, args = softmax_model
    bad, node = _with_attribute(onx, "Softmax", "axis", 0)
    out = node.output[0]
    recs = list(run_aligned(ep, bad, args, reset_names=[out]))
    soft = next(r for r in recs if r.onnx_name == out)
    assert soft.failed and soft.reset
    after = [r for r in recs if r.step > soft.step and r.passed is not None]
    assert after and all(r.passed for r in after)
    recs_all = list(run_aligned(ep, bad, args, reset="all"))
    assert [r.onnx_name for r in recs_all if r.failed] == [out]
    resets = [r for r in recs_all if r.reset]
    assert resets and all(r.kind != "weight" for r in resets)
    assert {r.onnx_name for r in resets} >= {out}


def test_exc_raises_naming_both_nodes(softmax_model):
    ep, onx, args = softmax_model
    bad, node = _with_attribute(onx, "LeakyRelu", "alpha", 0.5)
    with pytest.raises(SbsMismatchError) as info:
        list(run_aligned(ep, bad, args, exc=True))
    msg = str(info.value)
    assert "leaky_relu" in msg and "LeakyRelu" in msg


def test_stream_is_lazy_and_status_live(mlp):
    ep, onx, args = mlp
    run = AlignedRun(ep, onx, args)
    it = iter(run)
    first = next(it)
    assert run.status.done_onnx_nodes < run.status.total_onnx_nodes
    assert run.status.records == 1 and run.records == [first]
    rest = list(it)
    assert run.status.finished and run.status.done_onnx_nodes == run.status.total_onnx_nodes
    assert run.status.records == 1 + len(rest)


def test_stop_keeps_what_was_yielded(mlp):
    ep, onx, args = mlp
    run = AlignedRun(ep, onx, args)
    got = []
    for rec in run:
        got.append(rec)
        if len(got) == 3:
            run.stop()
    assert run.status.stopped and run.records == got
    assert run.status.done_onnx_nodes < run.status.total_onnx_nodes


def test_stop_from_another_thread(mlp):
    ep, onx, args = mlp
    run = AlignedRun(ep, onx, args)
    started = threading.Event()
    out = []

    def consume():
        for rec in run:
            out.append(rec)
            started.set()
            threading.Event().wait(0.01)

    th = threading.Thread(target=consume)
    th.start()
    started.wait(30)
    run.stop()
    th.join(30)
    assert not th.is_alive() and out and run.status.stopped


def test_node_failure_becomes_record_and_run_goes_on():
    x = torch.randn(3, 4)
    ep, onx = export(Chain(), (x,))
    bad = copy.deepcopy(onx)
    node = next(n for n in bad.graph.node if n.op_type == "Exp")
    node.op_type = "NoSuchOp"
    recs = list(run_aligned(ep, bad, (x,)))
    err = next(r for r in recs if r.status == STATUS_ERROR)
    assert "NoSuchOp" in err.error and err.ep_name == "exp"
    assert any(r.status == STATUS_OK and r.ep_name == "abs_1" for r in recs)
    later = [r for r in recs if r.step > err.step and r.onnx_name]
    assert later and all(r.status == STATUS_ERROR for r in later if r.passed is None and r.ep_name)


def test_shape_bug_reported_as_shape_mismatch():
    x = torch.randn(3, 4)
    ep, onx = export(Chain(), (x,))
    bad = copy.deepcopy(onx)
    # make the Abs node reduce over the last axis: a real shape bug in the export
    node = next(n for n in bad.graph.node if n.op_type == "Abs")
    out = node.output[0]
    node.output[0] = out + "_full"
    bad.graph.node.insert(
        list(bad.graph.node).index(node) + 1,
        onnx.helper.make_node("ReduceMax", [out + "_full", "bug_axes"], [out], keepdims=1),
    )
    bad.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "bug_axes"))
    assert bad.opset_import[0].version >= 18
    recs = list(run_aligned(ep, bad, (x,)))
    rec = next(r for r in recs if r.onnx_name == out)
    assert rec.status == STATUS_SHAPE_MISMATCH and rec.failed


def test_values_released_after_last_use(mlp):
    """Activations are freed as the run goes: a weakref to an early one dies mid-run."""
    ep, onx, args = mlp
    run = AlignedRun(ep, onx, args, runner="reference")
    refs = {}
    side = run.reference
    orig = side.run

    def spy(idx, env):
        (v,) = orig(idx, env)
        node = side.nodes[idx]
        if isinstance(v, torch.Tensor) and node.op == "call_function":
            refs[node.name] = weakref.ref(v)
        return [v]

    side.run = spy
    for rec in run:
        if rec.ep_name == "linear_2":
            gc.collect()
            assert refs["relu"]() is None  # relu (fc1) is no longer needed at fc3
    assert refs


def test_dtype_aware_tolerance_and_user_tolerance(mlp):
    ep, onx, args = mlp
    recs = list(run_aligned(ep, onx, args, atol=0.0, rtol=0.0))
    floats = [r for r in recs if r.atol is not None and r.ep_shape_type.startswith("float32")]
    assert floats and all(r.atol == 0.0 for r in floats)
    default = list(run_aligned(ep, onx, args))
    assert all(
        r.atol == 1e-4
        for r in default
        if r.ep_shape_type and r.ep_shape_type.startswith("float32") and r.atol is not None
    )


def test_nan_disagreement_counted(mlp):
    ep, onx, args = mlp
    recs = list(run_aligned(ep, onx, args))
    w = next(r for r in recs if r.kind == KIND_WEIGHT and r.ep_name == "p_fc1_bias")

    def poison(a):
        a[:3] = np.nan
        return a

    bad = _set_initializer(onx, w.onnx_name, poison)
    recs = list(run_aligned(ep, bad, args))
    r = next(r for r in recs if r.onnx_name == w.onnx_name)
    assert r.err_nan == 3 and r.failed


# ------------------------------------------------------------------ bad input
def test_missing_paths(tmp_path, mlp):
    ep, onx, args = mlp
    with pytest.raises(SbsInputError, match="does not exist"):
        run_aligned(tmp_path / "nope.pt2", onx, args)
    with pytest.raises(SbsInputError, match="does not exist"):
        run_aligned(ep, tmp_path / "nope.onnx", args)
    with pytest.raises(SbsInputError, match="does not exist"):
        run_aligned(ep, onx, tmp_path / "nope.pt")


def test_files_that_are_not_models(tmp_path, mlp):
    ep, onx, args = mlp
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"not a model at all")
    with pytest.raises(SbsInputError, match="not an exported program"):
        run_aligned(junk, onx, args)
    with pytest.raises(SbsInputError, match="ONNX"):
        run_aligned(ep, junk, args)


def test_paths_work(tmp_path, mlp):
    ep, onx, args = mlp
    torch.export.save(ep, tmp_path / "m.pt2")
    onnx.save(onx, tmp_path / "m.onnx")
    torch.save(args, tmp_path / "inputs.pt")
    recs = list(run_aligned(tmp_path / "m.pt2", str(tmp_path / "m.onnx"), tmp_path / "inputs.pt"))
    assert any(r.kind == "output" and r.status == STATUS_OK for r in recs)


def test_wrong_inputs(mlp):
    ep, onx, args = mlp
    with pytest.raises(SbsInputError, match="1 input.*2 were given"):
        run_aligned(ep, onx, (args[0], args[0]))
    with pytest.raises(SbsInputError, match="dtype torch.float64"):
        run_aligned(ep, onx, (args[0].double(),))
    with pytest.raises(SbsInputError, match="rank 3"):
        run_aligned(ep, onx, (args[0][None],))
    with pytest.raises(SbsInputError, match="ExportedProgram"):
        run_aligned(MLP(), onx, args)


def test_unrelated_model_is_rejected(mlp):
    ep, _, args = mlp
    x = torch.randn(3, 4)
    _, other = export(Chain(), (x,))
    for node in other.graph.node:
        del node.metadata_props[:]
        node.output[:] = [f"renamed_{o}" for o in node.output]
        node.input[:] = [i if i == "x" else f"renamed_{i}" for i in node.input]
    for init in other.graph.initializer:  # a model that runs, unrelated to the program
        init.name = f"renamed_{init.name}"
    other.graph.output[0].name = "renamed_" + other.graph.output[0].name
    other.graph.input[0].name = "ids"
    for node in other.graph.node:
        node.input[:] = ["ids" if i == "x" else i for i in node.input]
    with pytest.raises(SbsInputError, match="shares no computed value"):
        run_aligned(ep, other, args)


def test_reset_names_must_exist(mlp):
    ep, onx, args = mlp
    with pytest.raises(SbsInputError, match="reset_names"):
        run_aligned(ep, onx, args, reset_names=["definitely_not_there"])


def test_cuda_request_without_gpu(mlp):
    ep, onx, args = mlp
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the error path is for machines without one")
    with pytest.raises(SbsInputError, match="no CUDA device"):
        run_aligned(ep, onx, args, device="cuda")


def test_keyword_inputs_in_any_order():
    class KW(torch.nn.Module):
        def forward(self, x, *, scale, shift):
            return x * scale + shift

    x, scale, shift = torch.randn(2, 3), torch.randn(2, 3), torch.randn(2, 3)
    ep = torch.export.export(KW(), (x,), {"scale": scale, "shift": shift})
    onx = torch.onnx.export(
        ep, (x,), kwargs={"scale": scale, "shift": shift}, dynamo=True
    ).model_proto
    recs = list(run_aligned(ep, onx, (x,), {"shift": shift, "scale": scale}))
    assert all(r.status == STATUS_OK for r in recs if r.passed is not None)
    out = [r for r in recs if r.kind == "output"]
    assert out and out[0].err_abs < 1e-6
    with pytest.raises(SbsInputError, match="missing"):
        run_aligned(ep, onx, (x,), {"scale": scale})
    with pytest.raises(SbsInputError, match="not inputs"):
        run_aligned(ep, onx, (x,), {"scale": scale, "shift": shift, "bias": x})


@pytest.mark.parametrize("rerun", [False, True])
def test_live_values_do_not_grow_with_depth(rerun):
    class Deep(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(n))

        def forward(self, x):
            for layer in self.layers:
                x = torch.tanh(layer(x)) + x
            return x

    peaks = []
    for depth in (4, 16):
        x = torch.randn(2, 8)
        ep, onx = export(Deep(depth), (x,))
        run = AlignedRun(ep, onx, (x,), own_error=rerun)
        recs = list(run)
        assert all(r.status == STATUS_OK for r in recs if r.passed is not None)
        peaks.append(run.status.extra["peak_live_values"])
    assert peaks[1] <= peaks[0] + 2, peaks


def test_sessions_are_reused_across_runs(mlp):
    """A second run of the same model builds no onnxruntime session again."""
    from onnx_sbs_nb.align.engine.runners import OnnxruntimeRunner

    ep, onx, args = mlp
    first = OnnxruntimeRunner()
    list(run_aligned(ep, onx, args, runner=first))
    second = OnnxruntimeRunner()
    recs = list(run_aligned(ep, onx, args, runner=second))
    assert second.sessions_built == 0
    assert all(r.status == STATUS_OK for r in recs if r.passed is not None)
    # one session per signature, not per node: fc1..fc3 are three Gemm of two signatures
    assert first.sessions_built < len(onx.graph.node)


def test_post_run_actions_recompute_what_they_need(softmax_model):
    ep, onx, args = softmax_model
    bad, node = _with_attribute(onx, "Softmax", "axis", 0)
    out = node.output[0]
    run = AlignedRun(ep, bad, args)
    list(run)
    detail = run.actions.node_detail(out)
    assert detail["op_type"] == "Softmax" and detail["attributes"]["axis"] == "0"
    assert detail["inputs"][0]["ep_name"] and detail["inputs"][0]["paired_by"] == "name"
    assert detail["outputs"][0] == {"name": out, "ep_name": "softmax", "paired_by": "name"}
    assert "softmax" in (detail["stack_trace"] or "")
    res = run.actions.rerun_in_torch("softmax")  # by fx name too
    (o,) = res["outputs"]
    assert res["error"] is None and o["ep_name"] == "softmax"
    # the torch evaluator reproduces the wrong axis: far from torch, equal to the first run
    assert o["err_abs_vs_torch"] > 1e-2 and o["err_abs_vs_first_run"] < 1e-6
    with pytest.raises(SbsInputError, match="no ONNX node"):
        run.actions.node_detail("nothing_by_that_name")


def test_onnxruntime_node_calls_return_every_output_in_order():
    """One-node sessions are run without the wrapper's checks: a node with several
    outputs still hands them back in the model's order, and a wrong feed still fails."""
    from onnx import TensorProto, helper

    from onnx_sbs_nb.align.engine.runners import ModelContext, OnnxruntimeRunner

    node = helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=-1)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5]),
            helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
        ],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("indices", TensorProto.INT64, None),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    x = np.array([[3, 1, 4, 1, 5], [9, 2, 6, 5, 3]], dtype=np.float32)
    fn = OnnxruntimeRunner().prepare(node, ModelContext.from_model(model))
    for _ in range(2):  # the session built, then the session reused
        values, indices = fn([x, np.array([2], dtype=np.int64)])
        np.testing.assert_array_equal(values, [[5, 4], [9, 6]])
        np.testing.assert_array_equal(indices, [[4, 2], [0, 2]])
    with pytest.raises(Exception, match="(?i)k|input"):
        fn([x, np.array([[2, 2]], dtype=np.int64)])  # a rank the node refuses


def test_a_failing_linear_says_what_torch_computes_on_its_onnx_inputs(mlp):
    ep, onx, args = mlp
    recs = list(run_aligned(ep, onx, args, own_error=True))
    note = "vs torch.nn.functional.linear on the ONNX inputs"
    assert not any(note in (r.comment or "") for r in recs)  # nothing fails: nothing said
    w = next(r for r in recs if r.kind == KIND_WEIGHT and r.ep_name == "p_fc2_weight")

    def corrupt(a):
        a[0, 0] += 1.0
        return a

    bad = _set_initializer(onx, w.onnx_name, corrupt)
    recs = list(run_aligned(ep, bad, args, own_error=True))
    linear = next(r for r in recs if r.ep_name == "linear_1")
    assert linear.failed and note in linear.comment
    # torch's product on the same (corrupted) inputs agrees: the weight, not the kernel
    said = re.search(re.escape(note) + r": err_abs=([0-9.e+-]+)", linear.comment)
    assert said and float(said.group(1)) < 1e-4


def test_onnxruntime_node_with_an_empty_optional_input_between_given_ones():
    """Clip(x, "", hi): the feed names skip the empty input, and the values after it
    still go to their own names (min is absent, max is given)."""
    from onnx import TensorProto, helper

    from onnx_sbs_nb.align.engine.runners import ModelContext, OnnxruntimeRunner

    node = helper.make_node("Clip", ["x", "", "hi"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [4]),
            helper.make_tensor_value_info("hi", TensorProto.FLOAT, []),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    fn = OnnxruntimeRunner().prepare(node, ModelContext.from_model(model))
    x = np.array([-5.0, 0.5, 2.0, 9.0], dtype=np.float32)
    for _ in range(2):  # the session built, then reused
        (y,) = fn([x, None, np.array(1.0, dtype=np.float32)])
        np.testing.assert_array_equal(y, [-5.0, 0.5, 1.0, 1.0])  # no lower bound
    lower = helper.make_node("Clip", ["x", "lo"], ["y"])  # the max left out at the end
    fn = OnnxruntimeRunner().prepare(lower, ModelContext.from_model(model))
    (y,) = fn([x, np.array(0.0, dtype=np.float32)])
    np.testing.assert_array_equal(y, [0.0, 0.5, 2.0, 9.0])


def test_local_functions_key_sessions_by_their_body():
    """Two models whose local function has the same name but another body run their own
    body: the session key holds the function (serialized once per model)."""
    from onnx import TensorProto, helper

    from onnx_sbs_nb.align.engine.runners import ModelContext, OnnxruntimeRunner

    def model_with(op: str) -> onnx.ModelProto:
        fn = helper.make_function(
            "local",
            "f",
            ["a"],
            ["b"],
            [helper.make_node(op, ["a"], ["b"])],
            [helper.make_opsetid("", 18)],
        )
        node = helper.make_node("f", ["x"], ["y"], domain="local")
        graph = helper.make_graph(
            [node],
            "g",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        return helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)],
            functions=[fn],
        )

    x = np.array([-1.0, 0.0, 2.0], dtype=np.float32)
    runner = OnnxruntimeRunner()
    for op, want in (("Neg", [1.0, 0.0, -2.0]), ("Relu", [0.0, 0.0, 2.0])):
        model = model_with(op)
        ctx = ModelContext.from_model(model)
        (y,) = runner.prepare(model.graph.node[0], ctx)([x])
        np.testing.assert_array_equal(y, want)
        assert ctx.function_bytes("local", "f") == model.functions[0].SerializeToString()
        assert ctx.function_bytes("local", "g") is None


def test_free_variables_of_nodes_read_through_passing_wrappers():
    """Protobuf hands out a new wrapper object at each read of a node; an answer kept
    by the wrapper's id must not be handed to the next node's wrapper at that id."""
    from onnx import TensorProto, helper

    from onnx_sbs_nb.align.engine.runners import ModelContext

    def branch(outer: str, name: str):
        return helper.make_graph(
            [helper.make_node("Identity", [outer], [name])],
            name,
            [],
            [helper.make_tensor_value_info(name, TensorProto.FLOAT, None)],
        )

    nodes = [
        helper.make_node(
            "If",
            ["c"],
            [f"y{k}"],
            then_branch=branch(f"a{k}", f"t{k}"),
            else_branch=branch(f"b{k}", f"e{k}"),
        )
        for k in range(40)
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("c", TensorProto.BOOL, [])], []
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ctx = ModelContext.from_model(model)
    for _ in range(2):
        got = [list(ctx.free_variables(n)) for n in model.graph.node]  # no wrapper kept
        assert got == [[f"b{k}", f"a{k}"] for k in range(40)]  # attributes by name


class _GatedChunks(torch.nn.Module):
    """A GLU-style gate: one projection chunked into two equal parts (same shape)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(4, 6)

    def forward(self, x):
        a, b, c = self.proj(x).chunk(3, dim=-1)
        return torch.sigmoid(a) * torch.tanh(b) + c


def test_equal_parts_of_a_split_pair_by_their_place_and_a_swap_is_caught():
    """The optimizer's Split has no metadata and its parts all have one shape: each
    getitem pairs with the Split output at its index.  An export whose consumers read the
    parts exchanged is caught at the first consumer, the parts themselves being right."""
    torch.manual_seed(0)
    x = torch.randn(3, 4)
    ep, onx = export(_GatedChunks(), (x,))
    (split,) = [n for n in onx.graph.node if n.op_type == "Split"]
    records = list(AlignedRun(ep, onx, (x,), runner="onnxruntime"))
    parts = {r.ep_name: r for r in records if r.ep_target == "getitem"}
    assert [parts[k].onnx_name for k in ("getitem", "getitem_1", "getitem_2")] == list(split.output)
    assert all(r.status == STATUS_OK for r in parts.values())
    swapped = copy.deepcopy(onx)
    (node,) = [n for n in swapped.graph.node if n.op_type == "Split"]
    first, second = node.output[0], node.output[1]
    node.output[0], node.output[1] = second, first  # a and b exchanged
    records = list(AlignedRun(ep, swapped, (x,), runner="onnxruntime", own_error=True))
    bad = {r.ep_name for r in records if r.failed}
    assert {"sigmoid", "tanh"} <= bad and not bad & set(parts), bad
    assert summarize(records).first_own_failure.ep_name == "sigmoid"


class _WritesStateBack(torch.nn.Module):
    """Rescales its own weight in place (as RWKV does on its first call in eval mode) and
    counts its calls in a buffer: a program whose other outputs are state it writes back."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        with torch.no_grad():
            self.lin.weight.div_(2)
        self.calls.add_(1)
        return self.lin(x).relu()


def test_state_written_back_is_no_missing_output():
    """A mutated parameter or buffer is an output of the prepared program, but no ONNX
    model returns state: those values are judged as nodes (compared where the model
    computes them, unpaired where it folded or dropped them), never as outputs the model
    fails to compute, and a faithful export passes."""
    from onnx_sbs_nb.align.pairing.lowered_by import returned_outputs
    from onnx_sbs_nb.align.source.prepare.program import prepare_program

    torch.manual_seed(0)
    x = torch.randn(2, 4)
    ep, onx = export(_WritesStateBack().eval(), (x,))
    program = prepare_program(ep, onx).program
    kinds = {s.arg.name: s.kind.name for s in program.graph_signature.output_specs}
    assert sorted(kinds.values()) == ["BUFFER_MUTATION", "PARAMETER_MUTATION", "USER_OUTPUT"]
    assert returned_outputs(program) == [n for n, k in kinds.items() if k == "USER_OUTPUT"]
    records = list(run_aligned(ep, onx, (x,), rerun_with_torch_inputs=True))
    by_ep = {r.ep_name: r for r in records if r.ep_name}
    state = [n for n, k in kinds.items() if k != "USER_OUTPUT"]
    assert all(by_ep[n].status != STATUS_UNPAIRED_OUTPUT for n in state)
    assert all(by_ep[n].kind == "node" for n in state)
    assert not any(r.failed for r in records)
    assert summarize(records, node_inputs=onx).verdict == "pass"
    (out,) = [r for r in records if r.kind == "output"]
    assert out.onnx_name == onx.graph.output[0].name and out.status == STATUS_OK
