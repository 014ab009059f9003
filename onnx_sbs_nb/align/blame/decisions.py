"""Decisions flipped by a tie or a near tie, as the summary tells them.

An ArgMax, ArgMin or TopK whose indices differ from torch's only where torch's
candidates tie (``judge/ties.py``: the record passes, with the tie note) or nearly tie
(``judge/decisions.py``: status ``precision_loss``, with the near-tie note) makes no
error of the export's: each side breaks the tie its way, or rounding within tolerance
flips the order.  The values that read the indices then differ by whole rows, and fail
while each node, rerun on torch's inputs, agrees: they carry the flipped decision.  The
summary names the decision as the origin of that divergence, not as a culprit.
"""

from __future__ import annotations

from typing import Any

from ...records import NEAR_TIE_NOTE, TIE_NOTE, Record
from .certainty import comment_part
from .text import printable, suspect_name

KEPT = 8  # decisions kept for the summary's line (the first in run order)


def flip_note(rec: Record) -> str | None:
    """The note of a decision whose indices differ from torch's by a tie (broken the
    other way) or a near tie (flipped by rounding), None for any other record."""
    near = comment_part(rec, NEAR_TIE_NOTE)
    if near:
        return near
    if rec.err_abs:  # the indices differ, among equal values
        return comment_part(rec, TIE_NOTE)
    return None


class Decisions:
    """The flipped decisions of a run, in run order (the first :data:`KEPT`)."""

    def __init__(self) -> None:
        self.records: list[Record] = []
        self.count = 0
        self.near = 0  # of which near ties (status precision_loss)

    def add(self, rec: Record) -> bool:
        """Takes in a record; whether it is a flipped decision."""
        note = flip_note(rec)
        if note is None:
            return False
        self.count += 1
        self.near += NEAR_TIE_NOTE in note
        if len(self.records) < KEPT:
            self.records.append(rec)
        return True


def before_failure(flips: list[Record], first: Record | None, upstream: set[str] | None) -> bool:
    """Whether a flipped decision is where the first failure's difference can come from:
    one the first failure is computed from (``upstream``: the values it is computed from,
    None when the graph is not known: one before it in run order)."""
    if first is None:
        return False
    if upstream is None:
        return any(f.step < first.step for f in flips)
    return any(
        f.onnx_name and (f.onnx_name in upstream or f.onnx_name == first.onnx_name) for f in flips
    )


def carried_from(
    totals: dict[str, Any], culprit: bool, first: Record | None, before: list[Record], flips: bool
) -> str:
    """What the values that only inherit their error carry: "upstream" (a culprit makes
    an error, under tolerance or not; the first failure does not inherit its own; a value
    before it lost precision or failed to run), "decision" (only a decision a tie flipped
    before it) or "none" (nothing before them fails: differences within tolerance grew
    beyond it).  ``before``: the losses and errors of the run, with their steps."""
    if culprit or first is None or not first.inherits or totals.get("quantization_noise", 0):
        return "upstream"
    if any(r.step < first.step for r in before):
        return "upstream"
    return "decision" if flips and totals.get("decision_origin") else "none"


def decision_text(flips: list[Record], totals: dict[str, Any], verdict: str) -> str:
    """The decision(s) the run's divergence starts from, in a sentence: where, on how many
    rows, why it is no fault of the export, and what it does to the values after it."""
    first = flips[0]
    where = f" at {first.ep_source}" if first.ep_source else ""
    note = flip_note(first) or ""
    more = len(flips) - 1
    others = f" (and {more} more decision{'s' if more > 1 else ''})" if more > 0 else ""
    failed = totals.get("failed", 0)
    text = f"{suspect_name(first)} [{first.onnx_op_type}]{where}{others}: {note}"
    if failed:
        outs = totals.get("failed_outputs", 0)
        reach = (
            f" ({'1 of them a graph output' if outs == 1 else f'{outs} of them graph outputs'})"
            if outs
            else ""
        )
        text += (
            f"; the {failed} failing values after it{reach} read the indices and carry the "
            "flipped decision: torch's choice and ONNX's are equally right, the export is "
            "faithful, but the model is unstable on these inputs (its output depends on "
            "how a tie is broken)"
        )
        if verdict == "pass":
            text += ", which the verdict, on the export, does not count as a fault"
    return printable(text)


__all__ = ["KEPT", "Decisions", "before_failure", "carried_from", "decision_text", "flip_note"]
