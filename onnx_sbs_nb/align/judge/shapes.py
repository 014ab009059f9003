"""Verdicts on a pair whose two values differ in shape: the lowering's error when the
model declares the program's shape, no pair at all when the pairing only guessed."""

from __future__ import annotations

from typing import Any

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
        ctx.unproven.add(ctx.name)
        record.status = STATUS_NOT_COMPARED
        record.paired_by = UNPAIRED
        record.comment = _join(
            record.comment,
            f"paired by {ctx.pair.rule if ctx.pair else '?'}, but the shapes differ "
            f"({ctx.diff.note}): not the same value",
        )
        return True


__all__ = ["UnprovenPair", "WrongShapeLowering"]
