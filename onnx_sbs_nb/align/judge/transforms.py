"""How the pair was made, said on its record before any verdict: a torch value compared
after a permutation, as real pairs, reshaped or transformed like the weight it became,
and what the candidate side says of how it computed its value."""

from __future__ import annotations

from typing import Any

from ...records import Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from ..pairing.values import TRANSFORM_AS_REAL, TRANSFORM_CAST, TRANSFORM_PERMUTE, TRANSFORM_RESHAPE
from .context import STAGE_PAIR, RuleContext


def transform_note(pair: Pair) -> str | None:
    """How the torch value is brought to the candidate's (a cast says so when it is made)."""
    transform = pair.transform
    if not transform or transform == TRANSFORM_CAST:
        return None
    if transform == TRANSFORM_PERMUTE:
        return f"compared with the torch value permuted by {pair.perm}"
    if transform == TRANSFORM_AS_REAL:
        return "complex torch value compared as the real pairs the export computes"
    if transform == TRANSFORM_RESHAPE:
        return "compared with the torch value without (or with more) axes of size 1"
    return f"compared with the {transform}d torch weight"


class PairNotes:
    """Annotates only: how the two values are brought together, and the candidate's note."""

    name = "pair_notes"
    stage = STAGE_PAIR
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return True

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        note = transform_note(ctx.pair) if ctx.pair is not None else None
        if note:
            record.comment = note
        record.comment = _join(record.comment, ctx.note)
        return False


__all__ = ["PairNotes", "transform_note"]
