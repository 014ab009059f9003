"""Precision loss: a node whose error is its inputs' rounding, amplified by the op.

A model converted to float16 rounds the inputs of every node to float16.  Most ops keep
that rounding (half an ulp of each input) near half an ulp of their result, but some
amplify it: ``cos(x)`` moves by ``|sin(x)| * |dx|``, so an argument of 1000 rounded by
0.25 moves the cosine by up to 0.25; ``x ** 64`` multiplies the relative rounding of x by
64.  Such a node fails its own check (rerun on torch's inputs, which are rounded to its
type first), yet the export is faithful: the dtype cannot carry the argument.  It is
*precision loss*, a finding of its own, not the culprit of a fault.

The rule proves it, with the node's own definition rather than a table of derivatives
(``engine/precision_inputs.py`` gives the values), for a node that fails (first or own
comparison), all of whose inputs are known exactly:

1. computed exactly (float64, the torch evaluator) on the reference's unrounded inputs,
   the node agrees with torch at the reference dtype's tolerance: it computes the right
   function;
2. its own value (run in its dtype on the inputs rounded to the types it reads) agrees,
   at its dtype's tolerance, with the node computed exactly on those rounded inputs: it
   computes what its inputs give;
3. the node computed exactly on the rounded inputs fails the record's tolerance against
   torch: rounding the inputs alone moves the result beyond it.

A wrong op, a wrong attribute or a changed weight fails 1 or 2 (a weight's exact value is
its torch parameter), so a fault is never taken for precision loss; faults after the node
are still found by their own reruns, which start from torch's values again.
"""

from __future__ import annotations

from typing import Any

import torch

from ...compare.diff import compare
from ...compare.tolerances import default_tolerance
from ...compare.value_facts import value_dtype_name
from ...convert import to_torch
from ...records import STATUS_FAIL, STATUS_PRECISION_LOSS, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_AFTER, RuleContext
from .judging import as_expected
from .own import judge_own

PRECISION_LOSS_NOTE = (
    "precision loss: its inputs rounded to {dtype} (by up to {dx}) move its exact result "
    "by {dy} ({op} amplifies their rounding); computed exactly on torch's inputs it "
    "agrees with torch ({exact}), and it computes what its rounded inputs give: keep it "
    "in float32 (onnx-sbs precision) to avoid the loss"
)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _f64(v: torch.Tensor | None) -> torch.Tensor | None:
    if v is None or not v.is_floating_point():
        return v
    return v.detach().to("cpu", torch.float64)


def _largest(a: torch.Tensor, b: torch.Tensor) -> float:
    d = (a.to(torch.float64) - b.to(torch.float64)).abs()
    d = d[torch.isfinite(d)]
    return float(d.max()) if d.numel() else 0.0


class PrecisionLoss:
    """A failing node whose error its inputs' rounding explains (module docstring) gets
    status ``precision_loss``: no fault, and the summary lists it apart."""

    name = "precision_loss"
    stage = STAGE_AFTER
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.precision_inputs is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if record.passed2 is True or (record.status != STATUS_FAIL and record.passed2 is None):
            return False  # it passes, or its own rerun does: no error of its own
        if not isinstance(expected, torch.Tensor) and hasattr(expected, "dtype"):
            expected = to_torch(expected)
        if not _is_float(expected) or not _is_float(got if hasattr(got, "dtype") else None):
            return False
        ref_tol = default_tolerance(value_dtype_name(expected))
        low = value_dtype_name(got)
        if default_tolerance(low) <= ref_tol and not (
            ctx.inherited and default_tolerance(ctx.inherited) > ref_tol
        ):
            return False  # computed in the reference's precision, from values in it too
        found = ctx.precision_inputs(ctx.name)
        if found is None:
            return False
        value = found.value()
        if not _is_float(value):
            return False
        want = as_expected(ctx.pair, expected)
        if record.passed2 is None:
            # no own-error run: this rerun is one (a failure after a loss is told apart)
            _judge_own(record, ctx, expected, value)
            if record.passed2 is not False:
                return False
        if not found.all_exact:
            return False  # an input computed in low precision: its error is not known
        if any(f is not r and not torch.equal(f, r) for f, r in zip(found.fed, found.rounded)):
            return False  # a weight is not its torch parameter rounded: no rounding alone
        rounded_by = max(
            (_largest(e, r) for e, r in zip(found.exact, found.rounded) if _is_float(e)),
            default=0.0,
        )
        if not rounded_by:
            return False  # nothing was rounded: the error is the node's
        try:
            exact = found.run_exact(found.node, [_f64(x) for x in found.exact])[found.output]
            on_rounded = found.run_exact(found.node, [_f64(x) for x in found.rounded])[found.output]
        except Exception:
            return False  # the evaluator cannot run it in float64: no verdict
        if not _same_float64(exact, want) or not _same_float64(on_rounded, want):
            return False
        # 1. the right function, at the reference's own tolerance
        if not compare(want, exact.to(want.dtype)).passed:
            return False
        low = value_dtype_name(value)
        atol, rtol = default_tolerance(low)
        # 2. it computes what its rounded inputs give, within its dtype's rounding
        if not compare(on_rounded, value.to(torch.float64), atol, rtol).passed:
            return False
        # 3. the rounding alone fails the record's tolerance
        r_atol = record.atol if record.atol is not None else atol
        r_rtol = record.rtol if record.rtol is not None else rtol
        if compare(want.to(torch.float64), on_rounded, r_atol, r_rtol).passed:
            return False
        record.status = STATUS_PRECISION_LOSS
        record.comment = _join(
            record.comment,
            PRECISION_LOSS_NOTE.format(
                dtype=low,
                dx=f"{rounded_by:.3g}",
                dy=f"{_largest(on_rounded, exact):.3g}",
                op=record.onnx_op_type or "the op",
                exact=f"error {_largest(exact, want):.3g}",
            ),
        )
        return True


def _judge_own(record: Record, ctx: RuleContext, expected: Any, value: Any) -> None:
    """The rerun judged as an own-error run is (``own.judge_own``)."""
    ctx.own_inherited = ctx.inherited
    judge_own(record, ctx.pair, expected, value, ctx)


def _is_float(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.dtype in _FLOATS
    return v is not None and getattr(v, "dtype", None) is not None and "float" in str(v.dtype)


def _same_float64(v: Any, want: torch.Tensor) -> bool:
    return (
        isinstance(v, torch.Tensor)
        and v.dtype == torch.float64
        and tuple(v.shape) == tuple(want.shape)
    )


__all__ = ["PRECISION_LOSS_NOTE", "PrecisionLoss"]
