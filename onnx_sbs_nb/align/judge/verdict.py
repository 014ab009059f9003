"""One pair judged: the values described on the record, made comparable and compared,
with the rules of the registry (``rules.py``) tried at each stage in between; and the
node's own error (its rerun on torch inputs) judged the same way."""

from __future__ import annotations

from typing import Any

from ...compare.diff import compare
from ...compare.value_facts import ARRAY_TYPES, shape_type
from ...convert import device_of
from ...records import KIND_WEIGHT, Record
from ...records import join_comments as _join
from ..pairing.onnx_pairing import in_common_precision
from ..pairing.pairs import Pair
from ..pairing.values import TRANSFORM_AS_REAL, TRANSFORM_RESHAPE
from .context import (
    STAGE_COMPARED,
    STAGE_PAIR,
    STAGE_RAW,
    STAGE_VALUES,
    Rule,
    RuleContext,
    first_verdict,
)
from .judging import as_expected, comparable, in_layout_of
from .own import judge_own
from .rules import RULES, by_stage


def _inert(rule: Rule, ctx: RuleContext) -> bool:
    inert = getattr(rule, "inert", None)
    return inert is not None and inert(ctx)


class Verdicts:
    """The rules of a run by stage; :meth:`first` is the first that decides a stage."""

    def __init__(self, ctx: RuleContext, rules: tuple[Rule, ...] = RULES) -> None:
        self.ctx = ctx
        # the rules that may apply to some pair of this run (context.py: ``inert``)
        rules = tuple(r for r in rules if not _inert(r, ctx))
        self.stages = stages = by_stage(rules)
        # each stage's rules, read once per pair
        self._pair, self._raw = stages[STAGE_PAIR], stages[STAGE_RAW]
        self._values, self._compared = stages[STAGE_VALUES], stages[STAGE_COMPARED]

    def first(
        self, stage: str, record: Record, pair: Pair, expected: Any = None, got: Any = None
    ) -> Rule | None:
        return first_verdict(self.stages[stage], record, pair, expected, got, self.ctx)

    def before_values(self, record: Record, pair: Pair) -> Rule | None:
        """The verdict of a pair one of whose sides failed (``ctx.ref_error``,
        ``ctx.cand_error``), after the notes on how the pair was made."""
        return first_verdict(self._pair, record, pair, None, None, self.ctx)

    def on_values(self, record: Record, pair: Pair, want: Any, got: Any) -> Rule:
        """The verdict on torch value ``want`` and candidate value ``got``."""
        ctx = self.ctx
        expected = as_expected(pair, want)
        # the user's value is complex: show it as torch has it
        shown = want if pair.transform in (TRANSFORM_AS_REAL, TRANSFORM_RESHAPE) else expected
        record.ep_shape_type = shape_type(shown)
        record.onnx_shape_type = shape_type(got)
        # a Python number (a size computed from symbolic shapes) is on no device
        record.ep_device = device_of(expected) if isinstance(expected, ARRAY_TYPES) else None
        record.onnx_device = device_of(got)
        record.err_dev = 0.0 if record.ep_device in (None, record.onnx_device) else 1.0
        rule = first_verdict(self._raw, record, pair, expected, got, ctx)
        if rule is not None:
            return rule
        expected, got = comparable(expected, got)
        expected = in_layout_of(pair, expected, got)
        if expected is not None and pair.cast_to is not None:
            expected, got, note = in_common_precision(expected, got)
            record.comment = _join(record.comment, note)
        rule = first_verdict(self._values, record, pair, expected, got, ctx)
        if rule is not None:
            return rule
        ctx.diff = compare(
            expected,
            got,
            ctx.atol,
            ctx.rtol,
            ctx.inherited,
            pair.kind == KIND_WEIGHT,
            ctx.policy,
        )
        rule = first_verdict(self._compared, record, pair, expected, got, ctx)
        assert rule is not None, "the last rule of STAGE_COMPARED decides every pair"
        return rule


__all__ = ["Verdicts", "judge_own"]
