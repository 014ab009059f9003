"""The default verdict: the comparison against atol/rtol (or the user's verdict policy,
``verdict_policy.py``), for every pair no rule before it decided."""

from __future__ import annotations

from typing import Any

from ...records import Record
from ..pairing.pairs import Pair
from .context import STAGE_COMPARED, RuleContext
from .judging import fill_first_comparison


class Tolerance:
    name = "tolerance"
    stage = STAGE_COMPARED
    own_error = True

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.diff is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        fill_first_comparison(record, ctx.diff)
        return True


__all__ = ["Tolerance"]
