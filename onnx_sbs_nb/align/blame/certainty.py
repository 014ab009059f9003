"""What a culprit's evidence lacks, said in its why: the summary names a culprit on the
evidence the run has, and says where that evidence is thin (a pairing nothing proves, a
run that compared less than half of the model); and reading a record's comment back."""

from __future__ import annotations

from ...records import UNPAIRED, Record
from ..pairing.rules import caveat, rule_names


def certainty(rec: Record, covered: int, nodes: int, low: bool) -> str:
    """The words to add to the why of culprit ``rec`` ("" when its evidence is whole):
    ``covered`` of ``nodes`` ONNX nodes compared, ``low`` when that is under half."""
    # what the rule that paired it says a pair of its rests on (align/pairing/rules.py)
    text = caveat(rec.paired_by) or ""
    if rec.paired_by and rec.paired_by != UNPAIRED and rec.paired_by not in rule_names():
        text += (
            f"; it was paired with its torch value by {rec.paired_by}, which nothing "
            "proves: it may not be the same value"
        )
    if low:
        text += (
            f"; only {covered} of {nodes} ONNX nodes were compared: the error may be made "
            "among the others"
        )
    return text


def comment_part(rec: Record, marker: str) -> str | None:
    """The part of a record's comment holding ``marker``, None when none does."""
    for part in (rec.comment or "").split("; "):
        if marker in part:
            return part
    return None


__all__ = ["certainty", "comment_part"]
