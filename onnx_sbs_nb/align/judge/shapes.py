"""Verdicts on a pair whose two values differ in shape: the lowering's error when the
model declares the program's shape, no pair at all when the pairing only guessed."""

from __future__ import annotations

from typing import Any

import torch

from ...convert import to_torch
from ...records import STATUS_NOT_COMPARED, UNPAIRED, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from ..pairing.rules import NameRule, proven_rules
from .context import STAGE_COMPARED, RuleContext
from .judging import fill_first_comparison

_PROVEN = proven_rules()


class WrongShapeLowering:
    """The model declares this value in the program's shape and computes another."""

    name = "wrong_shape_lowering"
    stage = STAGE_COMPARED
    own_error = True

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        d = ctx.diff
        return d is not None and d.shape_mismatch and pair.declared and pair.rule != NameRule.name

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        record.comment = _join(
            record.comment,
            f"the model declares this value as {record.ep_shape_type} (the program's shape) "
            f"but computes {record.onnx_shape_type}: the lowering makes the wrong shape",
        )
        fill_first_comparison(record, ctx.diff)
        return True


class UnprovenPair:
    """A pair made from metadata or position is a guess that the shapes disprove: not the
    same value, so neither a mismatch of the export nor a torch input (the run stops
    feeding its torch value: ``ctx.unproven``)."""

    name = "unproven_pair"
    stage = STAGE_COMPARED
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        d = ctx.diff
        return d is not None and d.shape_mismatch and pair.rule not in _PROVEN

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        return _no_pair(record, ctx, f"the shapes differ ({ctx.diff.note}): not the same value")


class PermutedPair:
    """A pair made from structure or position whose two values have the same shape only
    because two of its dimensions are equally long (a sequence of 8 and heads of 8), and
    that agree once those dimensions are swapped: the model holds the value in another
    layout (the TorchScript exporter's K transposed for K @ Q), not the value torch
    names.  Not a fault: no pair (``ctx.unproven``: the run stops feeding its torch
    value) (trial 3, finding 06)."""

    name = "permuted_pair"
    stage = STAGE_COMPARED
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        d = ctx.diff
        return (
            d is not None
            and d.passed is False
            and not d.shape_mismatch
            and not d.dtype_mismatch
            and pair.rule not in _PROVEN
            # its readers' twins read its twin: the pair is the graph's, the layout the
            # node's fault (a Transpose with the wrong permutation; trial 4, finding 03)
            and not pair.read_by_twins
        )

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        swap = _agreeing_swap(expected, got, ctx.diff.atol, ctx.diff.rtol)
        if swap is None:
            return False
        return _no_pair(
            record,
            ctx,
            f"it agrees with torch's value only with dimensions {swap[0]} and {swap[1]} "
            "swapped (equally long here): the same data in another layout, not the same value",
        )


def may_prove_permuted(pair: Pair, value: Any) -> bool:
    """Whether comparing ``value`` (the ONNX side) may yet unpair ``pair`` as
    :class:`PermutedPair` does, its shapes agreeing: a guess, not confirmed by its
    readers, of a value with two equally long dimensions.  A batch of own-error runs
    set up before the pair is compared must not feed its torch value (trial 4, 03)."""
    if pair.rule in _PROVEN or pair.read_by_twins:
        return False
    dims = [d for d in getattr(value, "shape", ()) if d > 1]
    return len(dims) != len(set(dims))


def _no_pair(record: Record, ctx: RuleContext, why: str) -> bool:
    """A guessed pair the comparison disproved: unpaired, and no torch value fed for it."""
    ctx.unproven.add(ctx.name)
    record.status = STATUS_NOT_COMPARED
    record.paired_by = UNPAIRED
    record.comment = _join(
        record.comment, f"paired by {ctx.pair.rule if ctx.pair else '?'}, but {why}"
    )
    return True


def _agreeing_swap(expected: Any, got: Any, atol: float, rtol: float) -> tuple[int, int] | None:
    """Two equally long dimensions whose swap makes ``got`` agree with ``expected``."""
    try:
        e, g = to_torch(expected), to_torch(got)
    except Exception:  # not tensors: no layout to swap
        return None
    if not isinstance(e, torch.Tensor) or not e.is_floating_point() or e.dim() < 2:
        return None
    shape = tuple(e.shape)
    for i in range(e.dim()):
        for j in range(i + 1, e.dim()):
            if shape[i] > 1 and shape[i] == shape[j]:
                t = g.transpose(i, j)
                if torch.allclose(t.double(), e.double(), rtol=rtol, atol=atol, equal_nan=True):
                    return (i, j)
    return None


__all__ = ["PermutedPair", "UnprovenPair", "WrongShapeLowering", "may_prove_permuted"]
