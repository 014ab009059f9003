"""Quantized models against their float torch programs, over a corpus (issue 51): a CNN,
a BERT encoder, a Llama decoder and a diffusion block (tests/corpus/quantized_models.py),
each quantized by onnxruntime dynamically and statically (QDQ, per-channel), and the
decoder weight-only to int4 (MatMulNBits).

A faithful quantization names nothing (no culprit, no failing verdict), every compared
value carries its SQNR, and at least 80% of the float export's pairs are compared (as
tests/align/judge/test_quantized_models.py measures it).  A planted fault (a weight's
scale x2, a zero point 10 steps off, an Add computing Sub) is named: the culprit's
lowering (the nodes its rerun covers) holds the planted node.
"""

from __future__ import annotations

import functools

import pytest

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.run import run_aligned
from onnx_sbs_nb.records import (
    KIND_INPUT,
    KIND_OUTPUT,
    QUANTIZATION_AMPLIFIED,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_QUANTIZATION_NOISE,
)

pytest.importorskip("onnxruntime.quantization")
pytest.importorskip("transformers")

from tests.corpus import quantized_models as qm  # noqa: E402

pytestmark = pytest.mark.corpus

_COMPARED = (STATUS_OK, STATUS_FAIL, STATUS_QUANTIZATION_NOISE)

# (architecture, quantization): every architecture both ways, the decoder in int4 too
CASES = [(a, m) for a in qm.ARCHS for m in ("dynamic", "static")] + [("decoder", "int4")]

# transformers' models take the longest to build and export
_SLOW = {"encoder", "decoder"}


def _marks(arch: str) -> tuple:
    return (pytest.mark.slow,) if arch in _SLOW else ()


def _case(arch: str, mode: str, *marks) -> pytest.param:
    return pytest.param(arch, mode, id=f"{arch}-{mode}", marks=(*marks, *_marks(arch)))


@functools.cache
def _run(arch: str, mode: str | None, fault: str | None = None):
    """(records, summary, planted node) of ``arch`` quantized by ``mode`` (None: the
    float export), with ``fault`` planted; once per session."""
    ep, onx = qm.exported(arch)
    planted = None
    if fault is not None:
        onx, planted = qm.planted(arch, mode, fault)
    elif mode is not None:
        onx = qm.quantized(arch, mode)
    recs = list(run_aligned(ep, onx, qm.inputs(arch), own_error=True))
    return recs, summarize(recs), planted


def _compared(recs) -> set[str]:
    return {r.ep_name for r in recs if r.status in _COMPARED and r.kind != KIND_INPUT}


@pytest.mark.parametrize(("arch", "mode"), [_case(a, m) for a, m in CASES])
def test_faithful_quantization_names_nothing(arch, mode, record_property):
    recs, s, _ = _run(arch, mode)
    text = s.to_text()
    assert s.verdict != "fail" and s.culprit is None, text
    assert not [r.ep_name for r in recs if r.status == STATUS_FAIL], text
    noisy = [r for r in recs if r.status == STATUS_QUANTIZATION_NOISE]
    assert noisy and "quantization noise" in text, text
    # each compared value carries its SQNR
    compared = [r for r in recs if r.status in _COMPARED and r.kind != KIND_INPUT]
    assert all(r.err_snr is not None for r in compared), [
        r.ep_name for r in compared if r.err_snr is None
    ]
    # noise amplified under the floor (the diffusion block's timestep embedding: t
    # quantized to steps of 4, cos of it at 3 dB) is said so in the summary
    amplified = [r for r in noisy if QUANTIZATION_AMPLIFIED in (r.comment or "")]
    assert bool(amplified) == ("amplifying the quantization noise" in text), text
    lowest = min(r.err_snr for r in compared)
    record_property("lowest_sqnr_db", round(lowest, 1))
    print(f"{arch} {mode}: lowest SQNR {lowest:.1f} dB, {len(noisy)} noise")
    if mode == "static":
        assert any(r.onnx_op_type == "DequantizeLinear" for r in noisy), text


@pytest.mark.parametrize(("arch", "mode"), [_case(a, m) for a, m in CASES])
def test_most_float_pairs_are_compared(arch, mode, record_property):
    """At least 80% of the float export's compared pairs are compared in the quantized
    model (the torch nodes compared in both)."""
    recs, _, _ = _run(arch, mode)
    float_recs, fs, _ = _run(arch, None)
    assert fs.verdict == "pass", fs.to_text()
    want = _compared(float_recs)
    share = len(_compared(recs) & want) / len(want)
    record_property("compared_share", round(share, 3))
    print(f"{arch} {mode}: {share:.0%} of the float export's pairs compared")
    assert share >= 0.8, (f"{share:.0%}", sorted(want - _compared(recs)))


FAULTS = [
    *[(a, "static", f) for a in qm.ARCHS for f in ("scale_x2", "zero_point", "sub")],
    *[(a, "dynamic", f) for a in qm.ARCHS for f in ("zero_point", "sub")],
    ("decoder", "int4", "scale_x2"),
    ("decoder", "int4", "sub"),
]


@pytest.mark.parametrize(
    ("arch", "mode", "fault"),
    [pytest.param(*f, id="-".join(f), marks=_marks(f[0])) for f in FAULTS],
)
def test_planted_fault_is_named(arch, mode, fault):
    recs, s, planted = _run(arch, mode, fault)
    text = s.to_text()
    assert s.verdict == "fail" and s.culprit is not None, (planted, text)
    c = s.culprit
    assert c.status == STATUS_FAIL and c.err_snr is not None, text
    onx, _ = qm.planted(arch, mode, fault)
    paired = {r.onnx_name for r in recs if r.status in _COMPARED and r.onnx_name != c.onnx_name}
    lowering = qm.upstream_nodes(onx, c.onnx_name, paired) | set(c.onnx_nodes)
    # a float view of a quantized node's weight (the pairing's dequantized twin of a
    # MatMulInteger's or MatMulNBits' weight) is named after it: ``<node>/weight_float_view``
    named = {n.split("/")[0] for n in lowering}
    assert planted in named, (planted, sorted(lowering), text)


@pytest.mark.parametrize(("arch", "mode"), [_case(a, m) for a, m in CASES])
def test_an_output_the_quantization_leaves_under_its_floor_is_said_lossy(arch, mode):
    """No fault, but no plain pass either where an output falls under the bit width's
    floor: the summary says what the quantization costs the outputs."""
    recs, s, _ = _run(arch, mode)
    lossy = [
        r for r in recs if r.kind == KIND_OUTPUT and QUANTIZATION_AMPLIFIED in (r.comment or "")
    ]
    text = s.to_text()
    assert ("accuracy: the quantization costs the outputs accuracy" in text) == bool(lossy), text
    for r in lossy:
        assert f"{r.err_snr:.1f} dB" in text
    if (arch, mode) == ("diffusion", "static"):  # its timestep embedding: under 20 dB
        assert lossy, text
