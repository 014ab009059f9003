"""Inherited precision (align/judge/precision.py): a float32 value computed from float16 values
is judged with the float16 tolerance, as the program computes it; an export that rounds
to float16 where the program does not still fails."""

from __future__ import annotations

import onnx
import onnx.helper as oh
import pytest
import torch

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.judge.judging import SbsMismatchError
from onnx_sbs_nb.align.judge.precision import INHERITED_NOTE, inherited_precision
from onnx_sbs_nb.align.run import AlignedRun

from ...corpus.zoo import export_entry
from ...corpus.zoo_kv_cache_and_popular_exports import ZOO3_BY_NAME
from ...models import MLP, cancellation_run, export


class _Island(torch.nn.Module):
    """float16 around a float32 RMSNorm, as a half-precision decoder layer has it."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        f = h.float()
        f = f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.b(f.half()), f.sum()


def test_values_downstream_of_float16_inherit_it():
    x = torch.randn(2, 8, dtype=torch.float16)
    ep = torch.export.export(_Island().half().eval(), (x,))
    looser = inherited_precision([n for n in ep.graph.nodes if n.op != "output"])
    by_target = {}
    for node in ep.graph.nodes:
        by_target.setdefault(str(node.target), []).append(looser.get(node.name))
    # the float32 island (cast, pow, mean, rsqrt, mul, sum) inherits float16
    for target in ("aten.pow.Tensor_Scalar", "aten.mean.dim", "aten.rsqrt.default"):
        assert by_target[target] == ["float16"], (target, by_target)
    # float16 values, weights and inputs have nothing looser to inherit
    assert by_target["aten.linear.default"] == [None, None]
    assert not any(looser.get(n.name) for n in ep.graph.nodes if n.op == "placeholder")


def test_a_float32_program_inherits_nothing():
    ep = torch.export.export(MLP().eval(), (torch.randn(2, 8),))
    assert inherited_precision([n for n in ep.graph.nodes if n.op != "output"]) == {}


@pytest.fixture(scope="module")
def llama_fp16():
    ex = export_entry(ZOO3_BY_NAME["llama_fp16"])
    return ex.ep, ex.onx, ex.args


def test_a_float16_decoder_passes_and_says_where_the_tolerance_came_from(llama_fp16):
    ep, onx, args = llama_fp16
    records = list(AlignedRun(ep, onx, args, runner="onnxruntime"))
    assert not [r.onnx_name for r in records if r.failed]
    assert summarize(records).verdict == "pass"
    inherited = [r for r in records if INHERITED_NOTE.format(dtype="float16") in (r.comment or "")]
    # float32 values (the RMSNorm island) beyond the float32 tolerance, within float16's
    assert inherited, "no float32 value needed the inherited tolerance: the test is moot"
    for r in inherited:
        assert r.ep_shape_type.startswith("float32") and r.status == "ok"
        assert r.decided_by == "inherited_precision"
        assert r.err_abs > 1e-4 and (r.atol, r.rtol) == (1e-2, 1e-2)


def test_the_users_tolerance_wins_over_the_inherited_one(llama_fp16):
    ep, onx, args = llama_fp16
    records = list(AlignedRun(ep, onx, args, runner="onnxruntime", atol=1e-4, rtol=1e-4))
    compared = [r for r in records if r.err_abs is not None and r.kind == "node"]
    assert compared and all((r.atol, r.rtol) == (1e-4, 1e-4) for r in compared)
    assert not any("tolerance it inherits" in (r.comment or "") for r in records)
    assert any(r.failed for r in records)  # float16 rounding is above 1e-4


def _round_trip_through_float16(onx: onnx.ModelProto, value: str) -> onnx.ModelProto:
    """The export with ``value`` cast to float16 and back (what a wrong lowering does)."""
    bad = onnx.ModelProto()
    bad.CopyFrom(onx)
    g = bad.graph
    for node in g.node:
        for k, name in enumerate(node.input):
            if name == value:
                node.input[k] = value + "_rt"
    at = next(k for k, n in enumerate(g.node) if value in n.output) + 1
    g.node.insert(at, oh.make_node("Cast", [value], [value + "_h"], to=onnx.TensorProto.FLOAT16))
    g.node.insert(
        at + 1, oh.make_node("Cast", [value + "_h"], [value + "_rt"], to=onnx.TensorProto.FLOAT)
    )
    return bad


def test_an_export_rounding_to_float16_where_the_program_does_not_fails():
    torch.manual_seed(0)
    x = torch.randn(4, 8) * 10
    ep, onx = export(MLP().eval(), (x,))
    first = next(n for n in onx.graph.node if n.op_type in ("Gemm", "MatMul")).output[0]
    records = list(AlignedRun(ep, _round_trip_through_float16(onx, first), (x,)))
    failed = [r for r in records if r.failed]
    assert failed and summarize(records).verdict == "fail"
    assert all((r.atol, r.rtol) == (1e-4, 1e-4) for r in failed)


class _SmallMlp(torch.nn.Module):
    """Activations of a few hundredths, as a randomly initialised transformer's MLP."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(16, 32)
        self.down = torch.nn.Linear(32, 16)
        for p in self.parameters():
            torch.nn.init.normal_(p, std=0.02)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def _scaled_weight(onx: onnx.ModelProto, node_op: str, k: int) -> tuple[onnx.ModelProto, str]:
    """The export with the weight of its k-th ``node_op`` node scaled by 1.5."""
    from onnx import numpy_helper

    bad = onnx.ModelProto()
    bad.CopyFrom(onx)
    inits = {t.name: t for t in bad.graph.initializer}
    node = [n for n in bad.graph.node if n.op_type == node_op][k]
    name = next(i for i in node.input if i in inits and len(inits[i].dims) == 2)
    a = numpy_helper.to_array(inits[name])
    inits[name].CopyFrom(numpy_helper.from_array((a * 1.5).astype(a.dtype), name))
    return bad, name


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_changed_weight_is_named_though_its_consumer_is_within_the_absolute_tolerance(dtype):
    torch.manual_seed(0)
    x = torch.randn(4, 16, dtype=dtype)
    ep, onx = export(_SmallMlp().to(dtype).eval(), (x,))
    op = "MatMul" if any(n.op_type == "MatMul" for n in onx.graph.node) else "Gemm"
    bad, weight = _scaled_weight(onx, op, 1)
    records = list(AlignedRun(ep, bad, (x,), runner="onnxruntime", own_error=True))
    wrec = next(r for r in records if r.onnx_name == weight)
    assert wrec.failed and wrec.status != "weight_differs", (wrec.status, wrec.comment)
    summary = summarize(records)
    assert summary.verdict == "fail" and summary.culprit.onnx_name == weight


def test_rounding_a_graph_amplifies_is_no_error_of_the_export():
    records, onx = cancellation_run(contract=True)
    drifted = [r for r in records if r.drifted]
    # the cancellation's values are beyond tolerance, though each node agrees with torch
    assert drifted and all(r.onnx_op_type in ("Sub", "Mul") for r in drifted)
    assert not any(r.passed2 is False for r in records)
    s = summarize(records, node_inputs=onx)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    assert "drift" in s.to_text()
    # exc=True raises where an error is made: a drifted value is not one
    assert len(cancellation_run(contract=True, exc=True)[0]) == len(records)


def test_rounding_amplified_up_to_the_outputs_fails_naming_no_node():
    records, onx = cancellation_run(contract=False)
    out = [r for r in records if r.kind == "output"]
    assert out and out[0].failed and out[0].passed2 is not False
    s = summarize(records, node_inputs=onx)
    assert s.verdict == "fail" and s.culprit is None, s.to_text()
    assert s.totals["own_failed"] == 0
    with pytest.raises(SbsMismatchError):
        cancellation_run(contract=False, exc=True)
