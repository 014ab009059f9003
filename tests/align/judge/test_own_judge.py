"""The own-error comparison (judge/own.py): what it skips where nothing reads it (the
measures of a float model's rerun, the signed zeros of integers) leaves every record
field as the full comparison fills it, and a quantized model's rerun keeps its SNR."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from onnx_sbs_nb.align.judge.context import RuleContext
from onnx_sbs_nb.align.judge.own import judge_own
from onnx_sbs_nb.align.pairing.pairs import Pair
from onnx_sbs_nb.compare.verdict_policy import Judge
from onnx_sbs_nb.records import Record

PAIR = Pair("v", "v_fx", "test", "activation")


def _judged(want, got, op: str = "Mul", **ctx_fields) -> tuple[Record, RuleContext]:
    rec = Record(step=0, onnx_op_type=op)
    ctx = RuleContext(**ctx_fields)
    ctx.start("v", PAIR)
    judge_own(rec, PAIR, want, got, ctx)
    return rec, ctx


def _fields(rec: Record) -> dict:
    return {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec)}


def test_a_float_models_rerun_fills_the_record_as_the_full_comparison_does():
    g = torch.Generator().manual_seed(0)
    want = torch.randn(64, 32, generator=g)
    got = (want + 1e-7 * torch.randn(64, 32, generator=g)).numpy()
    rec, ctx = _judged(want, got)
    # the same comparison with every measure computed (a judge that changes nothing)
    full, full_ctx = _judged(want, got, own_policy=Judge(None, None, measures=True))
    assert _fields(rec) == _fields(full)
    assert rec.passed2 is True and rec.err_abs2 > 0
    assert rec.err_scale2 is not None and rec.err_elem2 is not None
    assert ctx.own_snr is None and full_ctx.own_snr is not None  # no rule reads it here


def test_a_quantized_models_rerun_keeps_its_snr():
    want = torch.linspace(-1, 1, 256)
    got = (want + 1e-3).numpy()
    rec, ctx = _judged(want, got, quant_bits=8)
    assert ctx.own_snr is not None and ctx.own_snr > 20  # quantization_noise.py reads it
    assert rec.err_abs2 is not None


def test_signed_zeros_are_counted_for_floats_only():
    want = torch.tensor([0.0, -0.0, 1.0, 0.0])
    got = np.array([-0.0, -0.0, 1.0, 0.0], dtype=np.float32)
    rec, _ = _judged(want, got, op="Neg")
    assert rec.passed2 is True and rec.err_abs2 == 0.0
    assert rec.err_zero2 == 1
    ints, _ = _judged(torch.tensor([0, 1, 2]), np.array([0, 1, 2], dtype=np.int64))
    assert ints.passed2 is True and ints.err_zero2 is None
    same, _ = _judged(torch.tensor([0.0, 2.0]), np.array([0.0, 2.0], dtype=np.float32))
    assert same.err_zero2 is None
