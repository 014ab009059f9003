"""The wording of a culprit's why: the pieces every culprit rule's sentence is made of (the
tolerance it fails, the shapes that differ, a folded weight it computes), and the evidence
added to whatever rule chose it (``certainty.py``: a guessed pairing, a run that compared
little; the input of a run over many that shows the failure).  Each rule writes its own
sentence (``rules.py``, ``amplified.py``) from these."""

from __future__ import annotations

import re

from ...records import (
    CLIPS_NOTE,
    FOLDED_CONSUMER_NOTE,
    JUDGED_BY_NOTE,
    STATUS_DTYPE_MISMATCH,
    STATUS_FAIL,
    STATUS_SHAPE_MISMATCH,
    Record,
)
from .certainty import certainty, comment_part
from .coverage import Coverage
from .culprit import Culprit
from .text import fmt, on_input_text

# the verdict rule of a value a decomposition fixed on the example inputs (judge/rules.py)
FIXED_ON_EXAMPLE_INPUTS = "fixed_on_example_inputs"
# ... and of an output found to differ from the user's program's (engine/user_outputs.py)
USER_PROGRAM_OUTPUTS = "user_program_outputs"

_POLICY = re.compile(r"beyond the verdict ([^;]*)")


def beyond(rec: Record) -> str:
    """What the record's error is beyond: its tolerance ("beyond atol 1e-05, rtol 0.001"),
    or, when a verdict policy or the user's compare function failed it, that in its words
    ("failing the verdict ulp<=1 (ulp 3)")."""
    policy = _POLICY.search(rec.comment or "")
    if policy:  # the reason in the policy's words, with the measure that failed it
        return f"failing the verdict {policy.group(1)}"
    judged = comment_part(rec, JUDGED_BY_NOTE)
    if judged:  # the user's verdict or compare function failed it, not atol/rtol
        return "failing " + judged[judged.index(JUDGED_BY_NOTE) + len(JUDGED_BY_NOTE) :]
    if rec.atol is None:
        return "beyond tolerance"
    return f"beyond atol {fmt(rec.atol)}, rtol {fmt(rec.rtol)}"


def mismatch_text(rec: Record) -> str | None:
    """The sentence of a record whose shapes or element types differ, or whose values
    differ from the user's own op's where a decomposition fixed a size on the example
    inputs (the judge's ``fixed_on_example_inputs``), None otherwise."""
    fixed = (FIXED_ON_EXAMPLE_INPUTS, USER_PROGRAM_OUTPUTS)
    if rec.decided_by in fixed and rec.status == STATUS_FAIL:
        text = (
            f"it differs by {fmt(rec.err_abs)} ({beyond(rec)}) from the value the user's "
            f"program computes"
        )
        return f"{text} ({rec.comment})" if rec.comment else text
    if rec.status not in (STATUS_SHAPE_MISMATCH, STATUS_DTYPE_MISMATCH):
        return None
    what = "shapes" if rec.status == STATUS_SHAPE_MISMATCH else "types"
    text = (
        f"the {what} differ: {rec.ep_shape_type} in the program, {rec.onnx_shape_type} in the model"
    )
    return f"{text} ({rec.comment})" if rec.comment else text


def folded_note(rec: Record) -> str:
    """ " (it computes at once the fx nodes ...)" for a node computing fx nodes whose weights
    the exporter folded into its own (``judge/weights.py``), else ""."""
    folded = comment_part(rec, FOLDED_CONSUMER_NOTE)
    return f" (it {folded})" if folded else ""


def with_evidence(culprit: Culprit, coverage: Coverage | None) -> Culprit:
    """``culprit`` with what its evidence lacks said in its why (a guessed pairing, a run
    that compared little), and the input that shows the failure put first: every view
    shows ``why``, so this reaches them all, whichever rule chose it."""
    if coverage is not None:
        culprit.why += certainty(
            culprit.record, coverage.onnx_covered, coverage.onnx_nodes, coverage.low
        )
    clips = comment_part(culprit.record, CLIPS_NOTE)
    if clips and clips not in culprit.why:  # saturation (judge/saturation.py): what to do
        culprit.why += f"; {clips}"
    where = on_input_text(culprit.explains or culprit.record)
    if where:
        culprit.why = f"{where}: {culprit.why}"
    return culprit


__all__ = ["beyond", "folded_note", "mismatch_text", "with_evidence"]
