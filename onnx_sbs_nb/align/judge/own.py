"""A node's own error judged: its rerun on the reference's inputs against the reference
value, as the first comparison is (ties, the policy, the measures of a small error)."""

from __future__ import annotations

from typing import Any

import torch

from ...compare.diff import compare
from ...compare.elementwise import is_elementwise
from ...compare.value_facts import (
    _as_numpy,
    largest_element_error,
    largest_magnitude,
    zero_sign_mismatches,
)
from ...compare.verdict_policy import Judge
from ...convert import device_of
from ...records import Record
from ...records import join_comments as _join
from ..pairing.onnx_pairing import in_common_precision
from ..pairing.pairs import Pair
from .context import RuleContext
from .judging import as_expected, comparable, fill_own_error, in_layout_of
from .ties import TIE_NOTE, tied
from .unordered import own_as_sets

# The own comparison of a run without a verdict policy or compare function, of a model
# that is not quantized: no rule reads its measures (cosine, SNR, L2, quantiles, ulps;
# only quantization_noise.py reads ``ctx.own_snr``) and the record keeps none of them,
# so they are not computed (the quantiles' selection is a third of the comparison).
_NO_MEASURES = Judge(None, None, measures=False)

# torch dtypes whose CPU tensors every measure below reads through numpy anyway
_NUMPY_DTYPES = frozenset(
    (torch.float32, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8)
    + (torch.uint8, torch.bool)
)


def judge_own(record: Record, pair: Pair, want: Any, own_value: Any, ctx: RuleContext) -> None:
    """The own error: the node run on torch inputs (``own_value``), against the torch
    value ``want``; TopK ties (``ctx.own_tie``) pass as in the first comparison."""
    e2, g2 = comparable(as_expected(pair, want), own_value)
    e2 = in_layout_of(pair, e2, g2)
    if e2 is not None and pair.cast_to is not None:
        e2, g2, _ = in_common_precision(e2, g2)
    if e2 is None:
        return
    e2, g2 = own_as_sets(e2, g2, ctx.name, ctx.own_unordered)
    judge = ctx.own_policy
    if judge is None and ctx.quant_bits is None:
        judge = _NO_MEASURES
    if judge is _NO_MEASURES and ctx.own_tie is None:
        # the torch value as the numpy array the comparison and the measures below each
        # make of it: made once (no policy or tie test sees the values themselves)
        e2 = _numpy_view(e2)
    d2 = compare(e2, g2, ctx.atol, ctx.rtol, ctx.own_inherited, judge=judge)
    if d2.error:  # the user's compare function failed on the rerun: no own verdict
        record.comment = _join(record.comment, f"own error not judged: {d2.error}")
        return
    if ctx.own_tie is not None and tied(d2, ctx.own_tie, e2, g2):
        d2.passed = True
        if TIE_NOTE not in (record.comment or ""):
            record.comment = _join(record.comment, TIE_NOTE)
    fill_own_error(record, d2, device_of(own_value))
    ctx.own_snr = d2.err_snr
    if d2.passed and d2.err_abs:
        scale = largest_magnitude(e2)
        if scale:
            record.err_scale2 = d2.err_abs / scale
        if is_elementwise(record.onnx_op_type):
            record.err_elem2 = largest_element_error(e2, g2)
    elif d2.passed and d2.err_abs == 0 and _may_be_float(e2):
        # equal as numbers: only the sign of a zero can still differ
        record.err_zero2 = zero_sign_mismatches(e2, g2) or None


def _numpy_view(v: Any) -> Any:
    """A CPU tensor of a dtype numpy holds as the array that shares its memory (what
    ``compare`` and the measures would each make of it), anything else as it is."""
    if type(v) is torch.Tensor and v.dtype in _NUMPY_DTYPES and v.is_cpu:
        found = _as_numpy(v)
        if found is not None:
            return found
    return v


def _may_be_float(v: Any) -> bool:
    """False for an integer or boolean value: it has no signed zeros (``zero_sign_mismatches``
    answers 0 for it without looking)."""
    if isinstance(v, torch.Tensor):
        return v.is_floating_point() or v.is_complex()
    dtype = getattr(v, "dtype", None)
    return dtype is None or dtype.kind not in "biu"


__all__ = ["judge_own"]
