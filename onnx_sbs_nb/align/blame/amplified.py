"""The culprit rule for an error no node's own check fails: one node makes an error under
tolerance that is large for its values, and a later node (a division, a subtraction of
close values, 1/x of a zero of the other sign) makes it visible."""

from __future__ import annotations

import math

from ...compare.elementwise import ELEMENT_ERROR_FLOOR, is_elementwise
from ...compare.tolerances import default_tolerance
from ...records import Record
from .context import STAGE_RUN, BlameContext
from .culprit import Culprit
from .text import dtype_of, fmt, label, percent


def _large(rec: Record) -> float:
    """The share of its values' size from which an error is large for the record's dtype:
    a tenth of the dtype's relative tolerance (many thousands of float32 ulps)."""
    return default_tolerance(dtype_of(rec))[1] / 10


class Amplified:
    """Values fail but no node fails its own check: the node upstream of the first
    failure whose own error is the largest for the size of its values, if that is large
    for its dtype; else an elementwise op one of whose elements is far off relative to
    itself; else, when the failure is an infinity or a NaN, the nearest node before it
    whose zeros have the other sign than torch's.  Its error passes where it is made and
    the first failure amplifies it."""

    name = "amplified"
    stage = STAGE_RUN

    def culprit(self, ctx: BlameContext) -> Culprit | None:
        rec = self.chosen(ctx)
        if rec is None:
            return None
        first = ctx.first_failure
        return ctx.culprit(rec, self.name, self.why(rec, first), rec.err_abs2, explains=first)

    def chosen(self, ctx: BlameContext) -> Record | None:
        """The node whose error under tolerance the first failure amplifies, if any."""
        first = ctx.first_failure
        if first is None or not (ctx.quiet or ctx.quiet_elements or ctx.zero_signs):
            return None
        if ctx.failures <= ctx.drifted:
            return None  # only drift, which fails no verdict: nothing to explain
        upstream = ctx.upstream(first.onnx_name)
        for ratio, _, rec in sorted(ctx.quiet, key=lambda i: i[:2], reverse=True):
            if upstream is not None and rec.onnx_name not in upstream:
                continue
            if ratio > _large(rec):
                return rec
            break  # the largest is small for its values: rounding, or one element off
        # an element off relative to itself, in a lowering of elementwise ops only
        for ratio, _, rec in sorted(ctx.quiet_elements, key=lambda i: i[:2], reverse=True):
            if upstream is not None and rec.onnx_name not in upstream:
                continue
            ops = ctx.lowering_ops.get(rec.onnx_fx_node or "", {rec.onnx_op_type})
            if not all(is_elementwise(op) for op in ops):
                continue
            if ratio > ELEMENT_ERROR_FLOOR:
                return rec
            break
        # no value differs upstream, but zeros of the other sign do (a Where or a Mul
        # that gives +0.0 for torch's -0.0), and the failure is what 1/x makes of that
        # (an infinity of the other sign): the nearest one before the failure
        infinite = first.err_abs is not None and math.isinf(first.err_abs)
        if infinite or (first.err_nan or 0) > 0:
            for rec in reversed(ctx.zero_signs):
                if upstream is None or rec.onnx_name in upstream:
                    return rec
        return None

    def why(self, rec: Record, first: Record | None) -> str:
        by = label(first) if first is not None else "a later node"
        op = f" ({first.onnx_op_type})" if first is not None and first.onnx_op_type else ""
        zeros = bool(rec.err_zero2 and not rec.err_abs2)
        if zeros:
            made = (
                f"its value holds {rec.err_zero2} zero(s) with the other sign than "
                "torch's (-0.0 against +0.0: equal numbers, no error to measure), which"
            )
        elif rec.err_elem2 is not None and (rec.err_scale2 or 0.0) <= _large(rec):
            made = (
                f"one of its elements is {percent(rec.err_elem2)} off (relative to "
                f"itself; its own error, at most {fmt(rec.err_abs2)}, is below atol "
                f"{fmt(rec.atol)} beside its other values)"
            )
        else:
            made = (
                f"its own error, {percent(rec.err_scale2)} of its values' size "
                f"({fmt(rec.err_abs2)}), is below atol {fmt(rec.atol)}"
            )
        if zeros:
            return (
                f"no node fails its own check, but {made} {by}{op}, the first value "
                "that fails, turns into an infinity of the other sign"
            )
        return (
            f"no node fails its own check, but {made} and is amplified by "
            f"{by}{op}, the first value that fails"
        )


__all__ = ["Amplified"]
