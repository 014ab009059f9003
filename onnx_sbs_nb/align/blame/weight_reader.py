"""A node whose own error is a differing weight's: it reads the weight (perhaps an
initializer the exporter stored once for equal parameters, read for another one) and
agrees with torch once given the torch parameter its torch twin reads
(``judge/weights.explain_reader``).  It makes no error of its own: never a candidate,
never a suspect; the weight's record, which comes before its first reader, is the
answer, and its why names every reader."""

from __future__ import annotations

from ...records import WEIGHT_READER_NOTE, Record
from .context import STAGE_RECORD, BlameContext


def explained_by_weight(rec: Record) -> bool:
    """Whether ``rec``'s own error is that of a weight it reads."""
    return rec.passed2 is False and WEIGHT_READER_NOTE in (rec.comment or "")


class WeightReader:
    """A record rule: a reader whose own error is a differing weight's makes none."""

    name = "weight_reader"
    stage = STAGE_RECORD
    folded_note = False
    on_torch_inputs = False

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        return False if explained_by_weight(rec) else None

    def why(self, rec: Record, own: float | None, ref: str) -> str:
        raise NotImplementedError(f"the rule {self.name!r} names no culprit")


__all__ = ["WeightReader", "explained_by_weight"]
