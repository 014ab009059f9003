"""Trial finding 07: a faithful static QDQ model whose QuantizeLinear clips a value inside
a lowering (a Linear on a 3-D input lowers to MatMul, a QDQ pair on the MatMul's output,
then the bias Add: the pair quantizes a value no fx node computes).  The clipping is
measured on that value as the own-error rerun recomputes it from torch's inputs, named at
its QuantizeLinear, and the node is not said to "make the error" as an export fault would;
on a 2-D input (one Gemm, the pair on the paired value) the same holds.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.judge.quantization_noise import PAIR_MISMATCH_NOTE, mismatched_pairs
from onnx_sbs_nb.align.judge.saturation import held_sources, interior_ranges, ranges_of
from onnx_sbs_nb.align.run import run_aligned
from onnx_sbs_nb.records import CLIPS_EXPLAIN_NOTE, STATUS_FAIL

from ...models import export
from ...quant_models import ort_quantize

q = pytest.importorskip("onnxruntime.quantization")

_FAULT_WORDS = "it makes the error"


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(32, 32), torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


SHAPES = {"3d": (1, 4, 32), "2d": (4, 32)}


@functools.cache
def _exported(dims: str):
    return export(MLP().eval(), (torch.randn(SHAPES[dims]),))


@functools.cache
def _quantized(dims: str, tmp: str) -> onnx.ModelProto:
    """quantize_static QDQ, per channel, calibrated on 8 small random inputs."""
    _, onx = _exported(dims)
    g = torch.Generator().manual_seed(1)
    feed = [
        {onx.graph.input[0].name: torch.randn(SHAPES[dims], generator=g).numpy()} for _ in range(8)
    ]
    return ort_quantize(onx, tmp, f"mlp{dims}", "static", feed)


def _wide_input(dims: str) -> torch.Tensor:
    """An input inside x's calibrated range whose fc1 output is far beyond its own: every
    row aligned with fc1's first row (its output 0 sums 32 same-signed products)."""
    w = MLP().fc1.weight[0].detach()
    return (torch.sign(w) * 1.5).expand(SHAPES[dims]).clone()


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("clipping"))


def _matmul_pairs(onx: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    """The QuantizeLinear nodes on a MatMul's output, by the value they quantize."""
    producer = {o: n for n in onx.graph.node for o in n.output}
    return {
        n.input[0]: n
        for n in onx.graph.node
        if n.op_type == "QuantizeLinear"
        and n.input[0] in producer
        and producer[n.input[0]].op_type == "MatMul"
    }


def test_interior_pairs_of_a_3d_linear(tmp):
    """The pairs on the MatMul outputs are inside the reruns of the paired values after
    them, and the run keeps the values they quantize until those are judged."""
    ep, _ = _exported("3d")
    onx = _quantized("3d", tmp)
    inner = _matmul_pairs(onx)
    assert inner, [n.op_type for n in onx.graph.node]
    recs = list(run_aligned(ep, onx, (_wide_input("3d"),), own_error=True))
    paired = {r.onnx_name for r in recs if r.ep_name and r.onnx_name}
    found = interior_ranges(onx.graph, ranges_of(onx.graph), paired)
    sources = {r.source for rs in found.values() for r in rs}
    assert sources == set(inner), (found, inner)
    held = held_sources(onx.graph, paired)
    assert {s for v in held.values() for s in v} == set(inner)
    # a pair's own value is none of its interior ones
    assert all(name not in {r.source for r in rs} for name, rs in found.items())


@pytest.mark.parametrize("dims", ["3d", "2d"])
def test_clipping_inside_the_lowering_is_named_not_called_a_fault(dims, tmp):
    ep, _ = _exported(dims)
    onx = _quantized(dims, tmp)
    x = _wide_input(dims)
    recs = list(run_aligned(ep, onx, (x,), own_error=True))
    s = summarize(recs)
    text = s.to_text()
    # the input itself is inside its calibrated range: no clipping there
    x_name = onx.graph.input[0].name
    assert not any(
        r.status == STATUS_FAIL and r.ep_name == x_name and r.kind != "node" for r in recs
    ), text
    assert s.verdict == "fail", text  # a real loss of accuracy: the user is told
    c = s.culprit
    assert c is not None, text
    assert _FAULT_WORDS not in c.why, text
    assert " clips " in c.why and " to its calibrated range [" in c.why, c.why
    assert "not a fault of the export" in c.why, c.why
    if dims == "3d":
        # named at the MatMul output's pair, the value no fx node computes
        names = {n.name for n in _matmul_pairs(onx).values()}
        assert any(f"{n} clips " in c.why for n in names), (names, c.why)
    explained = [r for r in recs if CLIPS_EXPLAIN_NOTE in (r.comment or "")]
    assert explained and all(r.passed2 is False for r in explained), text
    assert _FAULT_WORDS not in text, text


def test_inputs_like_the_calibration_say_no_clipping(tmp):
    """Inputs like the calibration's: nothing clips, and no record says so."""
    ep, _ = _exported("3d")
    onx = _quantized("3d", tmp)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SHAPES["3d"], generator=g)  # the first calibration input itself
    recs = list(run_aligned(ep, onx, (x,), own_error=True))
    assert not any(CLIPS_EXPLAIN_NOTE in (r.comment or "") for r in recs)
    assert not any(" clips " in (r.comment or "") for r in recs), summarize(recs).to_text()


# --- trial finding 05: 16-bit activations (A16W8) --------------------------------------


@functools.cache
def _a16w8(tmp: str) -> onnx.ModelProto:
    """quantize_static QDQ, uint16 activations and int8 weights per channel (A16W8)."""
    _, onx = _exported("2d")
    g = torch.Generator().manual_seed(1)
    feed = [{onx.graph.input[0].name: torch.randn(4, 32, generator=g).numpy()} for _ in range(8)]
    return ort_quantize(
        onx,
        tmp,
        "mlp_a16w8",
        "static",
        feed,
        activation_type=q.QuantType.QUInt16,
        weight_type=q.QuantType.QInt8,
    )


def _calibration_like() -> torch.Tensor:
    return torch.randn(4, 32, generator=torch.Generator().manual_seed(1))


def _plant_zero_point(onx: onnx.ModelProto, offset: int) -> tuple[onnx.ModelProto, str]:
    """The first activation DequantizeLinear after a Gemm/MatMul (uint16) gets its own zero
    point ``offset`` steps from its QuantizeLinear's."""
    bad = onnx.ModelProto()
    bad.CopyFrom(onx)
    inits = {i.name: i for i in bad.graph.initializer}
    producer = {o: n for n in bad.graph.node for o in n.output}
    for dq in bad.graph.node:
        qn = producer.get(dq.input[0]) if dq.op_type == "DequantizeLinear" else None
        src = producer.get(qn.input[0]) if qn is not None else None
        if src is None or src.op_type not in ("Gemm", "MatMul", "Add"):
            continue
        zp = onnx.numpy_helper.to_array(inits[dq.input[2]])
        assert zp.dtype == np.uint16, zp.dtype
        moved = (zp.astype(np.int64) + offset).astype(np.uint16)
        bad.graph.initializer.append(onnx.numpy_helper.from_array(moved, "planted_zp"))
        dq.input[2] = "planted_zp"
        return bad, dq.output[0]
    raise AssertionError("no activation pair after a linear")


def test_a16w8_faithful_passes(tmp):
    ep, _ = _exported("2d")
    onx = _a16w8(tmp)
    s = summarize(list(run_aligned(ep, onx, (_calibration_like(),), own_error=True)))
    assert s.verdict != "fail", s.to_text()
    assert PAIR_MISMATCH_NOTE not in s.to_text()


def test_a16w8_zero_point_off_by_100_is_named(tmp):
    """100 steps of a 16-bit grid are 36 dB, over the 8-bit floor the weights set: the pair
    dequantizing with another zero point than it quantizes with is named all the same."""
    ep, _ = _exported("2d")
    bad, value = _plant_zero_point(_a16w8(tmp), 100)
    recs = list(run_aligned(ep, bad, (_calibration_like(),), own_error=True))
    s = summarize(recs)
    rec = next(r for r in recs if r.onnx_name == value)
    assert rec.status == STATUS_FAIL, (rec.status, rec.comment)
    assert "(+100 steps)" in rec.comment and PAIR_MISMATCH_NOTE in rec.comment, rec.comment
    assert s.verdict == "fail" and s.culprit is not None, s.to_text()
    assert s.culprit.onnx_name == value, s.to_text()


def test_mismatched_pairs_inside_a_rerun(tmp):
    """A mismatched pair on a value no fx node computes (a 3-D Linear's MatMul output) is
    said for the paired value whose rerun goes through it; a faithful model has none."""
    onx = _quantized("3d", tmp)
    paired = {"relu", "relu_DequantizeLinear_Output", "linear_1"} & {
        o for n in onx.graph.node for o in n.output
    }
    assert mismatched_pairs(onx.graph, paired) == {}
    bad = onnx.ModelProto()
    bad.CopyFrom(onx)
    qn = _matmul_pairs(bad)
    dq = next(
        n
        for n in bad.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0] in {x.output[0] for x in qn.values()}
    )
    zp = onnx.numpy_helper.to_array(next(i for i in bad.graph.initializer if i.name == dq.input[2]))
    bad.graph.initializer.append(onnx.numpy_helper.from_array((zp + 10).astype(zp.dtype), "zp10"))
    dq.input[2] = "zp10"
    reader = next(n for n in bad.graph.node if dq.output[0] in n.input)
    found = mismatched_pairs(bad.graph, {reader.output[0]})
    assert list(found) == [reader.output[0]] and "(+10 steps)" in found[reader.output[0]], found
