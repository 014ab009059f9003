"""The prior art's own tests of its side-by-side engine, ported to our API.

Source: onnx-diagnostic 0.9.3, ``_unittests/ut_torch_onnx/test_sbs.py`` (class
TestSideBySide) and ``_unittests/ut_xrun_doc/test_command_lines_exe.py``
(test_h_parser_sbs).  Each test below names the test it ports.  The models and
assertions are the same where our engine means the same thing; where it does
differently by design, the test says why (e.g. the prior art counts records of its own
exporter, ``exporter="custom"``; we only use torch's dynamo exporter, so counts are
checked as "every pair the prior art yields is there").

Mapping of the API: ``run_cls=ExtendedReferenceEvaluator`` -> ``runner="reference"``,
``OnnxruntimeEvaluator`` -> ``runner="onnxruntime"``, ``use_tensor=True`` ->
``runner="torch"``; ``run_onnx_with_torch_inputs=True`` -> ``own_error=True``;
``ReplayConfiguration(dump_folder=..., selected_op_types=...)`` ->
``replay=ReplayConfig(op_types=...), replay_dir=...``; a record's ``onnx_op_type ==
"reset"`` -> ``Record.reset``.  Never imports onnx-diagnostic.

The prior art declares dynamic dimensions without a maximum (``{0: "batch"}``, i.e.
``Dim("batch")``, range [2, int_oo]); that case is checked on its own
(test_unbounded_dynamic_dimension) so that the other ports check their behaviour.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pandas
import pytest
import torch

from onnx_sbs_nb import ReplayConfig, run_aligned
from onnx_sbs_nb.records import KIND_INPUT, KIND_WEIGHT, RECORD_FIELDS, Record

CUDA = torch.cuda.is_available()


def _dim(name: str, unbounded: bool = False):
    return torch.export.Dim(name) if unbounded else torch.export.Dim(name, max=4096)


def _export(model, args=(), kwargs=None, dynamic_shapes=None):
    kwargs = kwargs or {}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=dynamic_shapes)
        onx = torch.onnx.export(ep, args, kwargs=kwargs, dynamo=True, verbose=False)
    return ep, onx.model_proto


def _run(*a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return list(run_aligned(*a, **kw))


class ExpLog(torch.nn.Module):
    def forward(self, x):
        ry = x.abs()
        rz = ry.exp()
        rw = rz + 1
        ru = rw.log() + rw
        return ru


class ExpLogPlus(torch.nn.Module):
    def forward(self, x):
        ry = x.abs()
        rz = ry.exp()
        rw = rz + 1
        ru = rw.log() + rw + ry
        return ru


class Reshapes(torch.nn.Module):
    def forward(self, x):
        ry = x.abs()
        ry1 = ry.reshape((-1, 1))
        ry2 = ry.reshape((1, -1))
        prod = ry1 * ry2
        shape = prod.shape
        resh = prod.reshape((-1, shape[0] // 2, shape[1] // 2))
        return resh.transpose(2, 1)


class TwoLinears(torch.nn.Module):
    def __init__(self, hidden=32, dtype=torch.float32, shift=False):
        super().__init__()
        self.fc1 = torch.nn.Linear(10, hidden)
        self.relu = torch.nn.ReLU()
        self.fc2 = torch.nn.Linear(hidden, 1)
        if shift:
            with torch.no_grad():
                self.fc2.bias += 1999
                self.fc1.bias += 999
        self.to(dtype)

    def forward(self, x):
        x = self.relu(self.fc1(x))
        x = self.fc2(x)
        return x


# the prior art's column list after DataFrame(...).dropna(axis=1, how="all")
PRIOR_COLUMNS = {
    "ep_id_node", "ep_name", "ep_shape_type", "ep_target", "ep_time_run", "err_abs",
    "err_dev", "err_h001", "err_h01", "err_rel", "onnx_id_node", "onnx_id_output",
    "onnx_name", "onnx_op_type", "onnx_shape_type", "onnx_time_run",
}  # fmt: skip
PRIOR_COLUMNS_OWN = PRIOR_COLUMNS | {
    "comment", "err_abs2", "err_dev2", "err_h0012", "err_h012", "err_rel2",
}  # fmt: skip


def _by_ep(records):
    return {r.ep_name: r for r in records if r.ep_name}


# ------------------------------------------------------------------ test_run_aligned_record


def test_run_aligned_record():
    """test_run_aligned_record: a record built by hand prints its fields, and is a plain
    dataclass that goes to a dict and back."""
    r = Record(
        ep_id_node=1, onnx_id_node=-1, ep_name="A", onnx_name="B", ep_target="C",
        onnx_op_type="D", ep_shape_type="E", err_abs=0.1, err_rel=0.2, err_dev=0.3,
        err_nan=0.4,
    )  # fmt: skip
    sr = str(r)
    assert "Record(" in sr
    assert "ep_shape_type='E'" in sr
    assert Record.from_dict(r.to_dict()) == r
    for name in ("ep_id_node", "onnx_id_node", "err_h01", "err_h001", "ep_time_run",
                 "onnx_time_run", "err_abs2", "err_rel2", "err_dev2", "err_h012", "err_h0012"):  # fmt: skip
        assert name in RECORD_FIELDS


# ---------------------------------------- test_ep_onnx_sync_exp / _a / _a_verbose1 / sbs_dict


@pytest.mark.parametrize("runner", ["reference", "onnxruntime", "torch"])
def test_ep_onnx_sync(runner):
    """test_ep_onnx_sync_a (reference evaluator), test_sbs_dict_onnxruntime, and
    use_tensor=True: the exp/log model with a dynamic batch, atol=rtol=1e-5: every
    intermediate result of the program is paired and agrees."""
    x = torch.randn((5, 4))
    ep, onx = _export(ExpLog(), (x,), dynamic_shapes=({0: _dim("batch")},))
    records = _run(ep, onx, (x,), runner=runner, atol=1e-5, rtol=1e-5)
    assert all(not r.failed and r.passed is not False for r in records), [
        (r.ep_name, r.status) for r in records
    ]
    paired = {r.ep_name for r in records if r.err_abs is not None}
    # the prior art yields 6 records here (x and five results); ours may add the constant
    assert len(paired) >= 6, paired
    assert {"x"} | {r.ep_name for r in records if r.kind == "output"} <= paired
    # each result of the user's program (abs, exp, add, log, add) is paired, under the
    # user's own fx name too
    user = {n.name for n in ep.graph.nodes if n.op == "call_function"}
    assert user <= {r.ep_user_name for r in records if r.err_abs is not None}, user


def test_sbs_dict():
    """test_sbs_dict: inputs given as kwargs only."""
    inputs = dict(x=torch.randn((5, 4)))
    ep, onx = _export(ExpLog(), (), inputs, dynamic_shapes=dict(x={0: _dim("batch")}))
    records = _run(ep, onx, kwargs=inputs, runner="reference", atol=1e-5, rtol=1e-5)
    assert len([r for r in records if r.err_abs is not None]) >= 6
    assert all(r.passed for r in records if r.err_abs is not None)
    assert _by_ep(records)["x"].kind == KIND_INPUT


def test_sbs_dict_tensor():
    """test_sbs_dict_tensor: ``ru = rw.log() + rw + ry`` with torch tensors (our torch
    runner); the prior art yields 8 records (its exporter)."""
    inputs = dict(x=torch.randn((5, 4)))
    ep, onx = _export(ExpLogPlus(), (), inputs, dynamic_shapes=dict(x={0: _dim("batch")}))
    records = _run(ep, onx, kwargs=inputs, runner="torch", atol=1e-5, rtol=1e-5)
    compared = [r for r in records if r.err_abs is not None]
    assert len(compared) >= 7
    assert max(r.err_abs for r in compared) < 1e-5


# ----------------------------------------------------- test_sbs_dict_tensor_{cpu,cuda}_reshape


def _reshape_case(device):
    inputs = dict(x=torch.randn((16, 16)).to(device))
    ep, onx = _export(Reshapes(), (), inputs, dynamic_shapes=dict(x={0: _dim("batch")}))
    return _run(ep, onx, kwargs=inputs, runner="torch", atol=1e-5, rtol=1e-5)


def test_sbs_dict_tensor_cpu_reshape():
    """test_sbs_dict_tensor_cpu_reshape: reshapes computed from dynamic shapes (symbolic
    sizes on the torch side: not compared); every tensor result pairs and err_dev is 0
    (same device) exactly on the compared records, None elsewhere."""
    records = _reshape_case("cpu")
    compared = [r for r in records if r.err_abs is not None]
    assert compared and all(r.err_dev == 0 for r in compared)
    assert all(r.err_dev is None for r in records if r.err_abs is None)
    # sizes are Python numbers on the torch side: on no device (the CUDA case relies on it)
    sizes = [r for r in compared if r.ep_shape_type == "int"]
    assert sizes and all(r.ep_device is None and r.onnx_device == "cpu" for r in sizes)
    assert max(r.err_abs for r in compared) < 1e-5
    out = [r for r in records if r.kind == "output"]
    assert out and out[0].ep_shape_type == out[0].onnx_shape_type == "float32[4x128x128]"


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_sbs_dict_tensor_cuda_reshape():
    """test_sbs_dict_tensor_cuda_reshape (and test_sbs_dict_tensor_cuda): inputs on CUDA,
    the torch runner runs there too."""
    records = _reshape_case("cuda")
    compared = [r for r in records if r.err_abs is not None]
    assert compared and all(r.err_dev == 0 for r in compared)
    assert all((r.onnx_device or "").startswith("cuda") for r in compared if r.kind == "node")


# -------------------------------------------------------- test_sbs_model_with_weights_dynamo


@pytest.fixture(scope="module")
def two_linears():
    torch.manual_seed(0)
    inputs = dict(x=torch.randn((5, 10)))
    ep, onx = _export(TwoLinears(), (), inputs, dynamic_shapes=dict(x={0: _dim("batch")}))
    return ep, onx, inputs


def _check_weights_records(records, columns):
    df = pandas.DataFrame(records).dropna(axis=1, how="all")
    # a comment is only written when there is something to say (how a node had to be
    # run, say, which depends on what ran before in the process): the column is there
    assert "comment" in pandas.DataFrame(records).columns
    filled = columns - {"comment"}
    assert filled <= set(df.columns), sorted(filled - set(df.columns))
    assert len(records) == 8
    # the prior art orders weights and inputs first (onnx_id_node -1), then the nodes
    assert df["onnx_id_node"].tolist() == [-1, -1, -1, -1, -1, 0, 1, 2]
    assert sorted(r.kind for r in records[:5]) == [KIND_INPUT] + [KIND_WEIGHT] * 4
    assert all(r.err_dev == 0 for r in records)
    assert max(r.err_abs for r in records) < 1e-5
    return df


def test_sbs_model_with_weights_dynamo(two_linears, tmp_path):
    """test_sbs_model_with_weights_dynamo (and _custom): Linear-ReLU-Linear with a dynamic
    batch, model saved and loaded from a file; 8 records, the prior art's columns, the
    DataFrame goes to Excel."""
    import onnx

    ep, onx, inputs = two_linears
    path = tmp_path / "model.onnx"
    onnx.save(onx, str(path))
    records = _run(ep, onnx.load(str(path)), kwargs=inputs, runner="onnxruntime")
    df = _check_weights_records(records, PRIOR_COLUMNS)
    df.to_excel(tmp_path / "records.xlsx")
    assert (tmp_path / "records.xlsx").stat().st_size > 0


def test_sbs_run_onnx_with_torch_inputs(two_linears):
    """test_sbs_run_onnx_with_torch_inputs: the own-error rerun adds comment, err_abs2,
    err_dev2, err_h0012, err_h012, err_rel2; still 8 records, same order."""
    ep, onx, inputs = two_linears
    # a second run of this model: the prior art times every node on every run, this
    # package does when asked (a second run otherwise runs stretches, untimed per node)
    records = _run(ep, onx, kwargs=inputs, own_error=True, time_nodes=True)
    _check_weights_records(records, PRIOR_COLUMNS_OWN)
    nodes = [r for r in records if r.onnx_id_node is not None and r.onnx_id_node >= 0]
    assert all(r.err_abs2 is not None and r.err_abs2 < 1e-5 for r in nodes)
    assert all(r.err_dev2 == 0 for r in nodes)


# ------------------------------------------------------------------ test_sbs_unique_consecutive


def test_sbs_unique_consecutive():
    """test_sbs_unique_consecutive: a data-dependent output length (int64) with a dynamic
    input length; the output pairs and agrees."""

    class Model(torch.nn.Module):
        def forward(self, x):
            return torch.unique_consecutive(x)

    x = torch.tensor([0, 1, 2, 2, 3, 3, 0, 0], dtype=torch.int64)
    ep, onx = _export(Model(), (x,), dynamic_shapes=({0: _dim("length")},))
    records = _run(ep, onx, (x,), runner="onnxruntime")
    outputs = [r for r in records if r.kind == "output"]
    assert len(outputs) == 1 and outputs[0].status == "ok", outputs
    assert outputs[0].ep_shape_type == outputs[0].onnx_shape_type == "int64[5]"
    assert not any(r.failed for r in records)


# ----------------------------------------------------- test_sbs_model_with_weights_custom_reset


@pytest.fixture(scope="module")
def shifted_fp16():
    torch.manual_seed(0)
    inputs = dict(x=torch.randn((5, 10), dtype=torch.float16))
    model = TwoLinears(3200, torch.float16, shift=True)
    ep, onx = _export(model, (), inputs, dynamic_shapes=dict(x={0: _dim("batch")}))
    return ep, onx, inputs


def test_sbs_model_with_weights_custom_reset(shifted_fp16):
    """test_sbs_model_with_weights_custom_reset: reset_names=["linear"] (float16, large
    biases): exactly one record says the ONNX side continued from the torch value."""
    ep, onx, inputs = shifted_fp16
    records = _run(ep, onx, kwargs=inputs, reset_names=["linear"])
    reset = [r for r in records if r.reset]
    assert [r.ep_name for r in reset] == ["linear"]
    df = pandas.DataFrame(records)
    assert int(df["reset"].sum()) == 1


def test_sbs_replay(shifted_fp16, tmp_path):
    """test_sbs_replay: a replay bundle for each Gemm; the run still yields its 8 records;
    each bundle reruns on its own."""
    ep, onx, inputs = shifted_fp16
    records = _run(
        ep, onx, kwargs=inputs, replay=ReplayConfig(op_types=["Gemm"]), replay_dir=tmp_path
    )
    assert len(records) == 8
    bundles = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(bundles) == sum(n.op_type == "Gemm" for n in onx.graph.node) == 2
    for b in bundles:
        assert {"model.onnx", "torch_inputs.pt", "expected.pt", "replay.py"} <= {
            p.name for p in b.iterdir()
        }
        out = subprocess.run(
            [sys.executable, "replay.py"], cwd=b, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]


# -------------------------------------------------------------- test_sbs_mha_split_every_piece


class MHA(torch.nn.Module):
    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.W_q = torch.nn.Linear(embed_dim, embed_dim)
        self.W_k = torch.nn.Linear(embed_dim, embed_dim)
        self.W_v = torch.nn.Linear(embed_dim, embed_dim)

    def split_heads(self, t, seq_len):
        return t.view(t.shape[0], seq_len, self.num_heads, self.head_dim).transpose(1, 2)

    def forward(self, x):
        q = self.split_heads(self.W_q(x), x.shape[1])
        k = self.split_heads(self.W_k(x), x.shape[1])
        v = self.split_heads(self.W_v(x), x.shape[1])
        return (
            torch.nn.functional.scaled_dot_product_attention(q, k, v)
            .transpose(1, 2)
            .reshape(x.shape[0], x.shape[1], self.embed_dim)
        )


def test_sbs_mha_split_every_piece(tmp_path):
    """test_sbs_mha_split_every_piece: MHA with dynamic batch and sequence, own errors,
    replay of the SDPA: max err_abs < 1e-5 and the SDPA's bundle is a model of its whole
    lowering with three inputs (q, k, v)."""
    import onnx

    torch.manual_seed(0)
    inputs = dict(x=torch.randn(2, 10, 16))
    ds = dict(x={0: _dim("batch"), 1: _dim("seqlen")})
    ep, onx = _export(MHA(16, 4), (), inputs, dynamic_shapes=ds)
    records = _run(
        ep, onx, kwargs=inputs, own_error=True,
        replay=ReplayConfig(names=["scaled_dot_product_attention"]), replay_dir=tmp_path,
    )  # fmt: skip
    df = pandas.DataFrame(records)
    assert df["err_abs"].max() < 1e-5
    (bundle,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    sub = onnx.load(str(bundle / "model.onnx"))
    assert len(sub.graph.input) == 3
    assert [o.name for o in sub.graph.output] == ["scaled_dot_product_attention"]


# ------------------------------------------------- test_h_parser_sbs (the command line)


def test_h_parser_sbs(tmp_path):
    """test_h_parser_sbs: the command line on files (program, model, inputs as kwargs),
    an Excel report and Gemm replays; the report has the weights under both names."""
    torch.manual_seed(0)
    inputs = dict(x=torch.randn((5, 10)))
    ep, onx = _export(TwoLinears(), (), inputs, dynamic_shapes=dict(x={0: _dim("batch")}))
    import onnx

    torch.export.save(ep, str(tmp_path / "model.pt2"))
    onnx.save(onx, str(tmp_path / "model.onnx"))
    torch.save(inputs, str(tmp_path / "inputs.pt"))
    output = tmp_path / "report.xlsx"
    cmd = [
        sys.executable, "-m", "onnx_sbs_nb", "run", "--ep", str(tmp_path / "model.pt2"),
        "--onnx", str(tmp_path / "model.onnx"), "--inputs", str(tmp_path / "inputs.pt"),
        "-o", str(output), "--replay-op-types", "Gemm", "--replay-dir", str(tmp_path / "replay"),
        "--no-progress",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    df = pandas.read_excel(output)
    assert df["err_abs"].max() < 1e-5
    assert df["err_h01"].max() == 0
    assert "p_fc1_weight" in set(df["ep_name"])
    assert "fc1.bias" in set(df["onnx_name"])
    assert "NaN" not in set(df["ep_name"].astype(str))
    sdf = df[(df.ep_target == "placeholder") & (df.onnx_op_type == "initializer")]
    assert sdf.shape[0] == 4
    assert len([p for p in (tmp_path / "replay").iterdir() if p.is_dir()]) == 2


# ------------------------------------------------------ the prior art's dynamic dimensions


@pytest.mark.parametrize("dim", ["Dim", "DYNAMIC"])
def test_unbounded_dynamic_dimension(dim):
    """The prior art's dynamic shapes as written: no maximum on the batch dimension."""
    x = torch.randn((5, 4))
    d = torch.export.Dim("batch") if dim == "Dim" else torch.export.Dim.DYNAMIC
    ep, onx = _export(ExpLog(), (x,), dynamic_shapes=({0: d},))
    records = _run(ep, onx, (x,), runner="reference", atol=1e-5, rtol=1e-5)
    assert records and all(r.passed for r in records if r.err_abs is not None)
