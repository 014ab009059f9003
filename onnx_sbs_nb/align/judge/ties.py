"""Indices chosen among equal values: which of two tied elements TopK lists first is
the runtime's choice (torch documents no order for ties), so the two sides may return
different, equally right indices.  They are judged by what they select: the same values,
each element at most once per slice."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from ...compare.diff import Diff
from ...convert import to_numpy
from ...records import TIE_NOTE, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_COMPARED, RuleContext
from .judging import fill_first_comparison


def tie_axes(nodes: Sequence[onnx.NodeProto]) -> dict[int, int]:
    """TopK nodes (sorts lower to TopK too) by index, with the axis they select along."""
    axes = {}
    for k, n in enumerate(nodes):
        if (
            n.op_type == "TopK"
            and n.domain in ("", "ai.onnx")
            and len(n.output) > 1
            and n.output[1]
        ):
            axes[k] = next((a.i for a in n.attribute if a.name == "axis"), -1)
    return axes


def same_choice(x: Any, expected: Any, got: Any, axis: int) -> bool:
    """Whether index arrays ``expected`` and ``got`` (along ``axis`` of ``x``) select the
    same values, each index once per slice."""
    x, e, g = (np.asarray(to_numpy(v)) for v in (x, expected, got))
    if e.shape != g.shape or e.dtype.kind not in "iu" or g.dtype.kind not in "iu":
        return False
    if x.ndim == 0 or e.ndim != x.ndim or e.size == 0:
        return False
    axis %= x.ndim
    n = x.shape[axis]
    for idx in (e, g):
        if idx.min() < 0 or idx.max() >= n:
            return False
        ordered = np.sort(idx, axis=axis)
        if np.any(np.diff(ordered, axis=axis) == 0):
            return False  # one element listed twice: not a choice among ties
    a, b = np.take_along_axis(x, e, axis), np.take_along_axis(x, g, axis)
    if a.dtype.kind in "fc":
        return bool(np.array_equal(a, b, equal_nan=True))
    return bool(np.array_equal(a, b))


def flipped_rows(expected: Any, got: Any, axis: int) -> tuple[int, int]:
    """(rows whose indices differ, rows): the slices of index arrays ``expected`` and
    ``got`` along ``axis`` (each one decision) in which any index differs."""
    e, g = (np.asarray(to_numpy(v)) for v in (expected, got))
    if e.shape != g.shape or e.ndim == 0:
        return 0, 0
    axis %= e.ndim
    differs = np.any(e != g, axis=axis)
    return int(np.count_nonzero(differs)), int(differs.size)


def tie_note(expected: Any, got: Any, axis: int) -> str:
    """The tie note, with on how many rows the indices differ (a tie broken the other
    way: what the values after it show when the model reads the indices)."""
    n, m = flipped_rows(expected, got, axis)
    if not n:
        return TIE_NOTE
    return (
        f"{TIE_NOTE} (they differ on {n} of {m} rows, where torch's top values tie: a tie "
        "broken the other way, torch documents no order for ties, ONNX takes the lower index)"
    )


def tied(d: Diff, tie: tuple[int, Any], expected: Any, got: Any) -> bool:
    """A failed comparison of TopK indices that select the same values."""
    if d.passed or d.shape_mismatch or d.dtype_mismatch:
        return False
    axis, x = tie
    return same_choice(x, expected, got, axis)


class TopKTies:
    """TopK indices that differ only among equal values pass (``ctx.tie``: the TopK's
    axis and input)."""

    name = "topk_ties"
    stage = STAGE_COMPARED
    own_error = True

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.tie is not None and ctx.diff is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        d = ctx.diff
        if not tied(d, ctx.tie, expected, got):
            return False
        d.passed = True
        record.comment = _join(record.comment, tie_note(expected, got, ctx.tie[0]))
        fill_first_comparison(record, d)
        return True


__all__ = ["TIE_NOTE", "TopKTies", "flipped_rows", "same_choice", "tie_axes", "tie_note", "tied"]
