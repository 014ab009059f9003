"""Verdicts on a pair one of whose sides failed to compute its value: nothing to compare."""

from __future__ import annotations

from typing import Any

from ...records import ONNXRUNTIME_RUNS_IT, STATUS_ERROR, STATUS_NOT_COMPUTED, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_PAIR, RuleContext


class ReferenceFailed:
    """The reference side raised, or an input of its node was missing."""

    name = "reference_failed"
    stage = STAGE_PAIR
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.ref_error is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        missing = ctx.fx_name in ctx.missing
        record.status = STATUS_NOT_COMPUTED if missing else STATUS_ERROR
        record.error = f"reference side: {ctx.ref_error}"
        return True


class UpstreamFailure:
    """The candidate node could not run: an input was missing.  Inherited from upstream,
    so the node itself is still judged on torch inputs (its own error)."""

    name = "upstream_failure"
    stage = STAGE_PAIR
    own_error = True

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.cand_error is not None and ctx.name in ctx.missing

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        record.error = ctx.cand_error
        record.status = STATUS_NOT_COMPUTED
        return True


# how the engine words a node whose runner raised NotImplementedError (the reference
# evaluator's unknown op, the torch evaluator's missing kernel): the runner's limit
_NOT_IMPLEMENTED = (": NotImplementedError: ", ": MissingKernelError: ")


class RunnerCannot:
    """The runner has no implementation of the candidate node (an ``onnxruntime``
    contrib op under the ONNX reference evaluator): the tool's limit, not the model's
    error, so the value is not computed (the run is incomplete) and nobody is blamed
    (trial 3, finding 07)."""

    name = "runner_cannot"
    stage = STAGE_PAIR
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return runner_lacks(ctx.cand_error)

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        record.error = ctx.cand_error
        record.status = STATUS_NOT_COMPUTED
        record.comment = _join(record.comment, runner_note(ctx.cand_error))
        return True


RUNNER_LACKS_NOTE = (
    "the runner has no implementation of this node (the tool's limit, not the model's "
    "error): run it with another runner (--runner onnxruntime runs onnxruntime's contrib ops)"
)


def runner_note(error: str | None) -> str:
    """The comment of a value its runner could not compute (:func:`runner_lacks`)."""
    raised = (error or "").replace(ONNXRUNTIME_RUNS_IT, "")
    if error is None or raised == error or _lacks_kernel(raised):  # no kernel: sharper note
        return RUNNER_LACKS_NOTE
    return (
        f"the runner failed on this node ({raised}) while onnxruntime runs it on the same "
        "inputs: the runner's failure, not the model's error (--runner onnxruntime runs it)"
    )


def runner_lacks(error: str | None) -> bool:
    """Whether a node's error message is its runner's missing implementation of the op:
    the torch evaluator's missing kernel, the reference evaluator's unknown op, or a
    runner's failure on a node onnxruntime runs on the same inputs.  A kernel
    missing for one dtype (torch's bfloat16 LU) is a fact of that runtime, not a gap of
    the tool: the precision advisor keeps such a node in float32."""
    if error is None:
        return False
    # the runner's failure on a node onnxruntime runs (engine/second_opinion.py)
    return error.endswith(ONNXRUNTIME_RUNS_IT) or _lacks_kernel(error)


def _lacks_kernel(error: str) -> bool:
    return _NOT_IMPLEMENTED[1] in error or (_NOT_IMPLEMENTED[0] in error and " is unknown" in error)


class NodeFailed:
    """The candidate node raised: its error."""

    name = "node_failed"
    stage = STAGE_PAIR
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.cand_error is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        record.error = ctx.cand_error
        record.status = STATUS_ERROR
        return True


__all__ = [
    "ONNXRUNTIME_RUNS_IT",
    "RUNNER_LACKS_NOTE",
    "NodeFailed",
    "ReferenceFailed",
    "RunnerCannot",
    "UpstreamFailure",
    "runner_lacks",
    "runner_note",
]
