"""Why an advised conversion still disagrees with the float32 model, naming the node and
its op: what the precision advisor says when no block list it tries helps."""

from __future__ import annotations

import math
from collections.abc import Iterable

from ..records import KIND_NODE, KIND_OUTPUT, STATUS_ERROR, STATUS_PRECISION_LOSS, Record


def _nonfinite(rec: Record) -> bool:
    return bool(rec.err_nan) or (rec.err_abs is not None and not math.isfinite(rec.err_abs))


def _label(rec: Record) -> str:
    node = rec.onnx_node_name or rec.onnx_name or "?"
    return f"{node} ({rec.onnx_op_type or 'value'}, value {rec.onnx_name})"


def why_disagrees(records: Iterable[Record], dtype: str, kept: set[str]) -> str:
    """One sentence: the first value of the conversion (run against the float32 model)
    that explains its outputs' error.  ``kept``: the float32 values of the nodes kept in
    float32 (their ``ep_name``)."""
    recs = [r for r in records if r.kind in (KIND_NODE, KIND_OUTPUT)]
    for rec in recs:
        if rec.status == STATUS_ERROR:
            return f"node {_label(rec)} does not run: {rec.error or 'unknown error'}"
    for rec in recs:
        if _nonfinite(rec) and rec.failed:
            where = (
                f"though kept in float32: a value it reads arrives in {dtype} already overflowed"
                if rec.ep_name in kept
                else f"its values do not fit {dtype}"
            )
            return f"node {_label(rec)} gives inf/NaN where the float32 model does not: {where}"
    for rec in recs:
        if rec.status == STATUS_PRECISION_LOSS:
            return (
                f"node {_label(rec)} loses precision in {dtype} (its inputs' rounding, "
                f"amplified by the op: own error {rec.err_abs2:.3g}) and keeping it in "
                "float32 does not remove the error its inputs carry"
            )
    for rec in recs:
        if rec.passed2 is False and rec.failed:
            return (
                f"node {_label(rec)} still makes an error of {rec.err_abs2:.3g} in {dtype} "
                "(rerun on the float32 model's values of its inputs)"
            )
    worst = max(
        (r for r in recs if r.failed and r.err_abs is not None),
        key=lambda r: r.err_abs or 0.0,
        default=None,
    )
    if worst is None:
        return "no value differs beyond the tolerance inside the model: only its outputs do"
    return (
        f"no node fails its own check in {dtype}: the rounding of every node adds up "
        f"(largest at {_label(worst)}, {worst.err_abs:.3g}); a coarser tolerance or a "
        "float32 model is the choice left"
    )


__all__ = ["why_disagrees"]
