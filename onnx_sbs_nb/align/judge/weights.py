"""Whose error a weight is: a weight that differs from its torch parameter is the
model's error only when the node consuming it disagrees with torch because of it (an
exporter folds a BatchNorm into a Conv's weight, and its consumer still agrees).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...diff import largest_magnitude, smallest_normal
from ...records import (
    STATUS_DTYPE_MISMATCH,
    STATUS_SHAPE_MISMATCH,
    STATUS_WEIGHT_DIFFERS,
    Record,
)
from ...records import join_comments as _join

#: the name a weight's record gives as ``decided_by`` once its consumer settled it
WEIGHT_BLAME = "weight_blame"


def agrees_at_its_scale(consumer: Record, want: Any) -> bool:
    """Whether a consumer that passed did so on its own scale: its difference within its
    relative tolerance of its largest torch value.  A low-precision absolute tolerance
    (bfloat16's 5e-2) passes a changed weight's consumer whose values are all small (a
    randomly initialised MLP's 0.01s); a weight the exporter transformed (a folded
    BatchNorm) changes its consumer by a rounding, far below that.  A difference below the
    dtype's smallest normal number is no evidence: values that small (a deep random net's
    activations, shrunk to 1e-44) keep a few significant bits, and any rounding is a
    large part of them."""
    err = consumer.err_abs2 if consumer.passed2 is not None else consumer.err_abs
    if err is None or consumer.rtol is None:
        return True
    if err <= smallest_normal(want):
        return True
    scale = largest_magnitude(want)
    return scale is None or err <= consumer.rtol * scale


def settle_weight(
    wrec: Record, consumer: Record, want: Any, with_torch_weight: Callable[[], bool | None]
) -> bool:
    """The verdict on weight ``wrec`` from its ``consumer``'s record (``want``: the
    consumer's torch value).  ``with_torch_weight`` runs the consumer again with the torch
    parameter (True: it then agrees; None: that cannot be tried); called only when
    needed.  Returns whether the weight's record comes before its consumer's (it is then
    the answer)."""
    wrec.decided_by = WEIGHT_BLAME
    node = consumer.onnx_node_name or consumer.onnx_name
    agrees = consumer.passed2 is True or (consumer.passed2 is None and consumer.passed is True)
    if agrees and not agrees_at_its_scale(consumer, want):
        agrees = False
        wrec.comment = _join(
            wrec.comment,
            f"its consumer {node} is within tolerance only by the absolute tolerance: "
            "its difference is large beside its own values",
        )
    if agrees:
        wrec.status = STATUS_WEIGHT_DIFFERS
        wrec.comment = _join(
            wrec.comment,
            f"differs from the torch parameter, but its consumer {node} agrees with torch: "
            "the exporter changed it (a BatchNorm folded into a Conv, say)",
        )
        return True
    if consumer.status in (STATUS_SHAPE_MISMATCH, STATUS_DTYPE_MISMATCH):
        wrec.comment = _join(
            wrec.comment, f"its consumer {node} computes another shape or type: not this"
        )
        return False
    if consumer.passed2 is None and not consumer.failed:
        wrec.comment = _join(wrec.comment, f"its consumer {node} could not be compared")
        return True
    with_torch = with_torch_weight()
    if with_torch is False:
        wrec.comment = _join(
            wrec.comment,
            f"its consumer {node} disagrees with torch even with the torch parameter: "
            "the error is the consumer's own",
        )
        return False
    wrec.comment = _join(
        wrec.comment,
        f"its consumer {node} disagrees with torch"
        + (" and agrees once given the torch parameter" if with_torch else " too"),
    )
    return True


__all__ = ["WEIGHT_BLAME", "agrees_at_its_scale", "settle_weight"]
