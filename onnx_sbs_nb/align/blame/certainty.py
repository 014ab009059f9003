"""What a culprit's evidence lacks, said in its why: the summary names a culprit on the
evidence the run has, and says where that evidence is thin (a pairing nothing proves, a
run that compared less than half of the model); and reading a record's comment back."""

from __future__ import annotations

from ...records import (
    PAIRED_BY_METADATA,
    PAIRED_BY_NAME,
    PAIRED_BY_POSITION,
    PAIRED_BY_STATE_DICT,
    PAIRED_BY_STRUCTURE,
    UNPAIRED,
    Record,
)

# pairings that are the same value by the exporter's word or by construction; any other
# (by structure: a guess) is said in the culprit's why
FOUNDED_PAIRINGS = frozenset(
    {PAIRED_BY_NAME, PAIRED_BY_METADATA, PAIRED_BY_POSITION, PAIRED_BY_STATE_DICT, UNPAIRED}
)


def certainty(rec: Record, covered: int, nodes: int, low: bool) -> str:
    """The words to add to the why of culprit ``rec`` ("" when its evidence is whole):
    ``covered`` of ``nodes`` ONNX nodes compared, ``low`` when that is under half."""
    text = ""
    if rec.paired_by == PAIRED_BY_STRUCTURE:
        # no name or metadata says this is the torch value: say what the pair rests on
        text += (
            "; its torch twin was found by the graph's structure (the twins of its "
            "inputs, its dtype and shape), not by a name the exporter gave: a likely "
            "pairing, not a proven one"
        )
    elif rec.paired_by and rec.paired_by not in FOUNDED_PAIRINGS:
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


__all__ = ["FOUNDED_PAIRINGS", "certainty", "comment_part"]
