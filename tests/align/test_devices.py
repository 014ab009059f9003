"""The same ONNX model run two ways, and the CUDA paths (skipped without a GPU)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.devices import run_onnx_on_two_devices
from onnx_sbs_nb.align.source.loading import SbsInputError

from ..models import MLP, export, tiny_llama

CUDA = torch.cuda.is_available()
_no_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA device (none visible to torch)")


def needs_cuda(fn):
    return pytest.mark.cuda(_no_gpu(fn))


@pytest.fixture(scope="module")
def mlp():
    x = torch.randn(4, 8)
    ep, onx = export(MLP(), (x,))
    return ep, onx, x


def test_two_runtimes_agree_node_by_node(mlp):
    _, onx, x = mlp
    recs = list(
        run_onnx_on_two_devices(
            onx, {"x": x}, reference=("onnxruntime", "cpu"), candidate=("torch", "cpu")
        )
    )
    nodes = [r for r in recs if r.onnx_id_node >= 0]
    assert len(nodes) == sum(len(n.output) for n in onx.graph.node)
    assert all(r.passed and r.passed2 for r in nodes), [(r.onnx_name, r.err_abs) for r in nodes]
    assert recs[-1].kind == "output"


def test_two_runtimes_find_a_broken_kernel(mlp):
    """A kernel swapped in the candidate shows as its own error, the rest inherits it."""
    _, onx, x = mlp
    from onnx_sbs_nb.align.engine.runners import TorchRunner

    broken = TorchRunner("cpu", custom_kernels={("", "Relu"): lambda a: torch.relu(a) * 1.5})
    recs = list(run_onnx_on_two_devices(onx, {"x": x}, candidate=(broken, "cpu")))
    first = next(r for r in recs if r.passed is False)
    assert first.onnx_op_type == "Relu" and first.passed2 is False
    later = [r for r in recs if r.step > first.step and r.onnx_op_type != "Relu"]
    assert any(r.passed is False and r.passed2 for r in later)


def test_cuda_devices_need_a_gpu(mlp):
    _, onx, x = mlp
    if CUDA:
        pytest.skip("a GPU is visible: the error path is for machines without one")
    with pytest.raises(SbsInputError, match="no CUDA device"):
        run_onnx_on_two_devices(onx, {"x": x}, candidate=("torch", "cuda"))


@needs_cuda
def test_tiny_llama_on_cuda():
    ep, onx, args = tiny_llama()
    cuda_args = tuple(a.cuda() for a in args)
    recs = list(run_aligned(ep, onx, cuda_args, own_error=True))
    paired = [r for r in recs if r.status not in ("unpaired_ep", "unpaired_onnx")]
    assert paired and all(r.status == "ok" for r in paired)
    nodes = [r for r in paired if r.kind == "node"]
    assert all(r.ep_device.startswith("cuda") and r.onnx_device.startswith("cuda") for r in nodes)


@needs_cuda
def test_cpu_versus_cuda_of_the_same_model(mlp):
    _, onx, x = mlp
    recs = list(
        run_onnx_on_two_devices(
            onx, {"x": x}, reference=("torch", "cpu"), candidate=("torch", "cuda")
        )
    )
    assert all(r.err_dev == 1.0 for r in recs if r.onnx_id_node is not None)
    assert all(r.passed for r in recs)


def test_torch_runner_stays_on_cpu_by_default(mlp):
    ep, onx, x = mlp
    bad = copy.deepcopy(onx)
    recs = list(run_aligned(ep, bad, (x,), runner="torch"))
    assert recs and all(r.ep_device == "cpu" for r in recs if r.ep_device)


@pytest.mark.parametrize("exact", [False, True])
def test_session_signature_is_the_same_for_numpy_and_torch_values(exact):
    """A node's session is chosen by its inputs' signature: an array and the same tensor
    (the two forms a value takes between runners) give one signature, shape-like
    integers with their exact shape."""
    from onnx_sbs_nb.align.engine.runners import input_signature

    values = [
        np.zeros((2, 3), np.float32),
        np.arange(4, dtype=np.int64),  # shape-like: exact shape
        np.arange(65, dtype=np.int64),  # too long to be a shape
        np.zeros((2, 2), np.int64),  # rank 2: not shape-like
        np.array(3, np.int32),
        np.zeros(0, np.float64),
        np.array([True, False]),
    ]
    for a in values:
        sig = input_signature(a, exact)
        assert sig == input_signature(torch.from_numpy(a), exact), a
        shape_like = a.ndim <= 1 and a.size <= 64 and a.dtype.kind in "biu"
        assert len(sig) == (3 if exact or shape_like else 2)


class _Positions(torch.nn.Module):
    """A factory call: exported on the CPU, the program says device=cpu for it."""

    def forward(self, x):
        return x + torch.arange(x.shape[-1], dtype=x.dtype)


def test_a_program_traced_on_the_cpu_makes_its_values_on_the_run_device():
    """A program exported on the CPU names the CPU in its factory calls; on a GPU those
    values must be made there (as torch.export's move_to_device_pass does), in the
    node-by-node run and in the compiled runs alike.  Checked here on no GPU: the map,
    the arguments a node gets, and a compiled run sent to the meta device."""
    from onnx_sbs_nb.align.engine.fx_runs import _function
    from onnx_sbs_nb.align.engine.sides import FxSide, traced_device_map
    from onnx_sbs_nb.align.source.program_inputs import bind_inputs

    x = torch.randn(2, 5)
    ep = torch.export.export(_Positions(), (x,))
    nodes = [n for n in ep.graph.nodes if n.op != "output"]
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    assert traced_device_map(nodes, "cpu") == {}
    assert traced_device_map(nodes, "cuda:0") == {cpu: cuda}
    arange = next(n for n in nodes if "arange" in str(n.target))
    assert arange.kwargs["device"] == cpu
    side = FxSide(ep, bind_inputs(ep, (x,), {}), {}, "cuda:0")
    args, kwargs = side._on_run_device(*side._arguments(0, arange, {}))
    assert kwargs["device"] == cuda and kwargs["dtype"] == torch.float32
    meta = torch.device("meta")
    run = [n for n in nodes if n.op == "call_function"]
    env = {"x": torch.empty(2, 5, device=meta)}
    _function(run, {cpu: meta})(env, "meta")
    assert env[arange.name].device == meta
    # on the device it was traced on, nothing moves
    env = {"x": x}
    _function(run)(env, "cpu")
    assert torch.equal(env[run[-1].name], _Positions()(x))


def test_a_size_computed_from_symbolic_shapes_is_on_no_device():
    """The torch side of a size is a Python number: it has no device, so it never counts
    as a value on another device (err_dev 0) than its ONNX partner."""
    from onnx_sbs_nb.align.judge.judging import fill_own_error
    from onnx_sbs_nb.compare.diff import Diff
    from onnx_sbs_nb.records import Record

    rec = Record(ep_device=None)
    fill_own_error(rec, Diff(err_abs=0.0, passed=True), "cuda:0")
    assert rec.err_dev2 == 0.0
    rec = Record(ep_device="cpu")
    fill_own_error(rec, Diff(err_abs=0.0, passed=True), "cuda:0")
    assert rec.err_dev2 == 1.0
