"""The culprit rules, as one ordered registry (:data:`CULPRIT_RULES`).

Each rule is a small object (``context.py`` says what one is) with a ``name`` and a
``stage``.  The rules of stage ``record`` tell, record by record as the run streams,
whether a record makes its own error (the first rule that decides wins: a candidate named
by it, or no candidate).  The rules of stage ``run`` are asked once per summary, in order;
the first that answers names the culprit, and :func:`choose_culprit` adds what its
evidence lacks to its why (``why.with_evidence``).  The culprit's ``rule`` is the name of
the rule that chose it, or, for the first own failure, of the record rule that proved it.
Adding a rule is one class and one entry of :data:`CULPRIT_RULES`.
"""

from __future__ import annotations

from ...records import (
    CLIPS_EXPLAIN_NOTE,
    KIND_NODE,
    KIND_WEIGHT,
    QUANTIZATION_STEP_FAULT,
    STATUS_DTYPE_MISMATCH,
    STATUS_ERROR,
    STATUS_PRECISION_LOSS,
    STATUS_QUANTIZATION_NOISE,
    STATUS_SHAPE_MISMATCH,
    STATUS_UNPAIRED_OUTPUT,
    Record,
)
from .amplified import Amplified
from .certainty import comment_part
from .context import (
    STAGE_RECORD,
    STAGE_RUN,
    STAGES,
    BlameContext,
    CulpritRule,
    RecordRule,
    RunRule,
    own_error,
)
from .coverage import LEAF_KINDS, Coverage
from .culprit import Culprit
from .shape_origin import RULE_SHAPE_ORIGIN
from .text import fmt, fused_list
from .weight_reader import WeightReader
from .why import beyond, folded_note, mismatch_text, with_evidence


class _RecordRule:
    """What a record rule has unless it says otherwise."""

    name = ""
    stage = STAGE_RECORD
    folded_note = True
    on_torch_inputs = False

    def why(self, rec: Record, own: float | None, ref: str) -> str:
        raise NotImplementedError(f"the rule {self.name!r} names no culprit")


class PrecisionLossNoFault(_RecordRule):
    """A node whose error is its inputs' rounding to its dtype, which the op amplifies
    (status ``precision_loss``): no fault of the export, never a candidate."""

    name = "precision_loss"

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        return False if rec.status == STATUS_PRECISION_LOSS else None


class QuantizationNoiseNoFault(_RecordRule):
    """A quantized model's value off by no more than its quantization explains (status
    ``quantization_noise``, ``judge/quantization_noise.py``): never a candidate."""

    name = "quantization_noise"

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        return False if rec.status == STATUS_QUANTIZATION_NOISE else None


class NodeFailed(_RecordRule):
    """The ONNX node failed to run."""

    name = "error"

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        return True if rec.status == STATUS_ERROR else None

    def why(self, rec: Record, own: float | None, ref: str) -> str:
        return f"the node failed to run: {rec.error or 'unknown error'}"


class UnpairedOutput(_RecordRule):
    """An output only one side computes: the model does not compute the program."""

    name = "unpaired_output"

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        return True if rec.status == STATUS_UNPAIRED_OUTPUT else None

    def why(self, rec: Record, own: float | None, ref: str) -> str:
        return (
            rec.comment
            or "an output only one side computes: the model does not compute the program"
        )


class OwnRerun(_RecordRule):
    """The node was rerun on the torch values of its inputs: it makes its own error when
    that comparison fails (``passed2 is False``), and none when it passes."""

    name = "rerun"
    on_torch_inputs = True

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        return None if rec.passed2 is None else rec.passed2 is False

    def why(self, rec: Record, own: float | None, ref: str) -> str:
        if own is None and rec.status in (STATUS_SHAPE_MISMATCH, STATUS_DTYPE_MISMATCH):
            what = "shape" if rec.status == STATUS_SHAPE_MISMATCH else "type"
            text = (
                f"run on the {ref} values of its inputs, it still makes the wrong {what}: "
                f"{rec.onnx_shape_type} where the program has {rec.ep_shape_type}"
            )
            return f"{text} ({rec.comment})" if rec.comment else text
        text = (
            f"run on the {ref} values of its inputs, it still differs by {fmt(own)} ({beyond(rec)})"
        )
        if rec.own_inputs_from:
            # the rerun did not isolate it: it proves no more than where the error starts
            return text + (
                f"; some of its inputs have no torch twin and were recomputed through the "
                f"lowering of {fused_list(rec.own_inputs_from)}, so the error may also be "
                "there: it is made there or here, not upstream"
            )
        if CLIPS_EXPLAIN_NOTE in (rec.comment or ""):
            # a faithful quantization calibrated narrower than the inputs: the error is
            # made here, by the clipping (judge/saturation.py), which the why names next
            return text + (
                ": its quantization clips, the calibrated range narrower than these "
                "inputs' values (a loss of accuracy of the quantized model, not a fault "
                "of the export)"
            )
        text += ": it makes the error, it does not inherit it"
        # a quantized weight off its grid: which channel or block, by how many steps
        step = comment_part(rec, QUANTIZATION_STEP_FAULT)
        return f"{text} ({step})" if step else text


class Leaf(_RecordRule):
    """A graph input, a weight or a constant differs: nothing upstream to blame."""

    name = "leaf"
    folded_note = False  # a weight's why names its consumers itself

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        if not failed:
            return None
        leaf = rec.kind in LEAF_KINDS or (
            rec.kind == KIND_NODE and rec.onnx_op_type == "initializer"
        )
        return True if leaf else None

    def why(self, rec: Record, own: float | None, ref: str) -> str:
        consumers = f" ({rec.comment})" if rec.comment else ""
        if rec.kind == KIND_WEIGHT:
            return f"the weight differs from the torch parameter {rec.ep_name} by {fmt(own)}{consumers}"
        if rec.onnx_op_type == "initializer":  # a constant the program computes
            return f"the constant differs from the {ref} value by {fmt(own)}{consumers}"
        return f"the graph input differs from the {ref} input by {fmt(own)}"


class InputsPassed(_RecordRule):
    """The graph is known: a value that fails while every compared input of its node
    passed (an input with no torch twin counts as passing, so the error is between the
    last compared values and this node); one with a failing input inherits."""

    name = "inputs_passed"

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        if not failed or ctx.node_inputs is None or rec.onnx_name not in ctx.node_inputs:
            return None
        return all(ctx.onnx_ok.get(name, True) for name in ctx.node_inputs[rec.onnx_name])

    def why(self, rec: Record, own: float | None, ref: str) -> str:
        return mismatch_text(rec) or (
            f"it differs by {fmt(own)} ({beyond(rec)}) while every compared input agrees"
        )


class FirstFailure(_RecordRule):
    """Without the graph: the first failure in run order (every value computed before it
    passed, so did its inputs)."""

    name = "first_failure"

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None:
        return True if failed and ctx.first_failure is None else None

    def why(self, rec: Record, own: float | None, ref: str) -> str:
        return (
            mismatch_text(rec) or f"it is the first value that differs ({fmt(own)}, {beyond(rec)})"
        )


class ShapeOrigin:
    """The first own failure shows a wrong shape (or fails to run on one) that a node
    before it made, a node without a torch twin: that node (``shape_origin.py``)."""

    name = RULE_SHAPE_ORIGIN
    stage = STAGE_RUN

    def culprit(self, ctx: BlameContext) -> Culprit | None:
        first = ctx.first_candidate()
        if first is None or ctx.node_inputs is None:
            return None
        found = ctx.shapes.origin(
            first.record, ctx.node_inputs, lambda name: ctx.upstream(name) or set()
        )
        if found is None:
            return None
        rec, why = found
        return ctx.culprit(rec, self.name, why, own_error(rec))


class FirstOwnFailure:
    """The first record, in run order, that a record rule says makes its own error,
    passing over one whose own-error run was fed through a lowering that fails on torch
    inputs alone (``BlameContext.first_candidate``).  The culprit's rule is the record
    rule's, whose sentence is its why."""

    name = "first_own_failure"
    stage = STAGE_RUN

    def culprit(self, ctx: BlameContext) -> Culprit | None:
        first = ctx.first_candidate()
        if first is None:
            return None
        rec, rule = first.record, first.rule
        own = own_error(rec)
        why = rule.why(rec, own, ctx.reference)
        if rule.folded_note:
            why += folded_note(rec)
        return ctx.culprit(rec, rule.name, why, own)


#: Every culprit rule, in the order they are tried (stage by stage, ``context.STAGES``).
CULPRIT_RULES: tuple[CulpritRule, ...] = (
    # does this record make its own error? (each record, as the run streams)
    PrecisionLossNoFault(),
    QuantizationNoiseNoFault(),
    NodeFailed(),
    UnpairedOutput(),
    WeightReader(),  # its own error is a weight's it reads (before its rerun says it makes it)
    OwnRerun(),
    Leaf(),
    InputsPassed(),
    FirstFailure(),
    # which node is the culprit? (once per summary)
    ShapeOrigin(),
    FirstOwnFailure(),
    Amplified(),
)


def by_stage(rules: tuple[CulpritRule, ...] = CULPRIT_RULES) -> dict[str, tuple[CulpritRule, ...]]:
    """``rules`` by stage, each stage's in their order."""
    return {stage: tuple(r for r in rules if r.stage == stage) for stage in STAGES}


_STAGED = by_stage()
RECORD_RULES: tuple[RecordRule, ...] = _STAGED[STAGE_RECORD]  # type: ignore[assignment]
RUN_RULES: tuple[RunRule, ...] = _STAGED[STAGE_RUN]  # type: ignore[assignment]


def choose_culprit(
    ctx: BlameContext, coverage: Coverage | None = None, rules: tuple[RunRule, ...] = RUN_RULES
) -> Culprit | None:
    """The culprit the first run rule names, with what its evidence lacks in its why
    (``coverage``: how much of the model the run compared)."""
    for rule in rules:
        found = rule.culprit(ctx)
        if found is not None:
            return with_evidence(found, coverage)
    return None


#: Every name a culprit's ``rule`` can hold.
RULE_NAMES: frozenset[str] = frozenset(r.name for r in CULPRIT_RULES)

__all__ = [
    "CULPRIT_RULES",
    "RECORD_RULES",
    "RULE_NAMES",
    "RUN_RULES",
    "Amplified",
    "FirstFailure",
    "FirstOwnFailure",
    "InputsPassed",
    "Leaf",
    "NodeFailed",
    "OwnRerun",
    "PrecisionLossNoFault",
    "ShapeOrigin",
    "UnpairedOutput",
    "WeightReader",
    "by_stage",
    "choose_culprit",
]
