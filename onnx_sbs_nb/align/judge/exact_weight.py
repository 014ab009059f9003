"""A weight is stored data, not a computation: an ONNX initializer that copies a torch
parameter holds its values exactly, or rounded once to a lower precision (a float16
model: ``onnxconverter_common.float16`` rounds to nearest even, as torch's ``.to``
does).  The tolerance of computed values (float16's 1e-2) would pass a weight changed by
1%; this rule fails any weight further than that one rounding from its parameter.

A weight so failed is then judged with its consumer like any differing weight
(``weights.py``): a fold the exporter made (a BatchNorm into a Conv) stays explained.
"""

from __future__ import annotations

from typing import Any

import torch

from ...convert import to_torch
from ...records import EXACT_WEIGHT_NOTE, KIND_WEIGHT, STATUS_FAIL, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_COMPARED, RuleContext
from .judging import fill_first_comparison

# the torch side of a copied weight: a parameter, buffer or constant the program reads
# (not a value it computes, which an optimizer may fold in its own float rounding)
_LEAF_TARGETS = frozenset({"placeholder", "get_attr"})
# ulps a weight may be from its parameter: none when copied in its own dtype, one when
# rounded to a lower precision (a converter that truncates is one ulp off nearest)
_COPIED_ULPS = 0
_ROUNDED_ULPS = 1
# the integer type holding each float type's bits, to count ulps between two values
_BITS = {
    torch.float16: torch.int16,
    torch.bfloat16: torch.int16,
    torch.float32: torch.int32,
    torch.float64: torch.int64,
}


class ExactWeight:
    """Fails a weight within the tolerance of computed values but not a faithful copy of
    its torch parameter; any other pair is left to the rules after it."""

    name = "exact_weight"
    stage = STAGE_COMPARED
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        d = ctx.diff
        # a verdict policy or compare function of the user's decides what a weight may
        # be off by, as it decides every other value (weights.py: weight blame too)
        return (
            pair.kind == KIND_WEIGHT
            and ctx.policy is None
            and d is not None
            and d.passed is True
            and not d.error
        )

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if record.ep_target not in _LEAF_TARGETS or record.onnx_op_type != "initializer":
            return False
        allowed = allowed_ulps(ctx.pair)
        ulp = ctx.diff.err_ulp  # the comparison's own count, over the finite elements
        if ulp is not None and ulp <= allowed and not ctx.diff.err_nan:
            return False  # a faithful copy: the common case costs no second pass
        off = ulps_off(expected, got, allowed)
        if off is None:
            return False
        count, most, total, dtype = off
        fill_first_comparison(record, ctx.diff)
        record.passed = False
        record.status = STATUS_FAIL
        where = "every element" if count == total else f"{count} of {total} elements"
        record.comment = _join(
            record.comment,
            f"{EXACT_WEIGHT_NOTE}: it differs from the torch parameter"
            + (f" rounded to {dtype}" if allowed else "")
            + f" by up to {most} ulps at {where} (a faithful copy is within {allowed}), "
            "though within the tolerance of computed values",
        )
        return True


def allowed_ulps(pair: Pair | None) -> int:
    """The ulps a weight of ``pair`` may differ by: one when the pair casts it."""
    return _ROUNDED_ULPS if pair is not None and pair.cast_to is not None else _COPIED_ULPS


def ulps_off(expected: Any, got: Any, allowed: int) -> tuple[int, int, int, str] | None:
    """How ``got`` is off ``expected`` (the same float type): the elements more than
    ``allowed`` ulps apart, the most ulps, the element count and the type's name; None
    when every element is within ``allowed`` (or the values are no floats of one type).
    Elements both of whose values are below the type's smallest normal number are left
    out: a converter maps those tiny values its own way (``onnxconverter_common`` lifts
    them to 1e-7), and they weigh nothing beside the weight's other values."""
    try:
        e, g = to_torch(expected), to_torch(got)
    except Exception:  # not tensors: nothing to count
        return None
    if not isinstance(e, torch.Tensor) or not isinstance(g, torch.Tensor):
        return None
    if e.dtype != g.dtype or e.dtype not in _BITS or e.shape != g.shape or not e.numel():
        return None
    e, g = e.detach().cpu().contiguous(), g.detach().cpu().contiguous()
    if torch.equal(e, g):
        return None
    oe, og = _ordered(e), _ordered(g)
    if e.dtype == torch.float64:  # two int64 orders may differ by more than int64 holds
        oe, og = oe.double(), og.double()
    dist = (oe - og).abs()
    tiny = torch.finfo(e.dtype).tiny
    both_tiny = (e.abs() < tiny) & (g.abs() < tiny)
    nan = torch.isnan(e) & torch.isnan(g)  # NaN payloads may differ: the pattern is data
    off = (dist > allowed) & ~both_tiny & ~nan
    count = int(off.sum())
    if not count:
        return None
    most = int(dist[off].max())
    name = str(e.dtype).replace("torch.", "")
    return count, most, e.numel(), name


def _ordered(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bits as integers that count ulps: adjacent floats are one apart,
    -0.0 and 0.0 the same (sign and magnitude turned into one ordered line)."""
    bits = t.view(_BITS[t.dtype]).to(torch.int64)
    low = -(2 ** (8 * t.element_size() - 1))
    return torch.where(bits < 0, low - bits, bits)


__all__ = ["ExactWeight", "allowed_ulps", "ulps_off"]
