"""The summary's words for values that lose precision in the model's dtype (status
``precision_loss``: ``judge/precision.py``, ``judge/conditioning.py``), and whether a
run's failures carry nothing but such rounding or a flipped decision."""

from __future__ import annotations

from typing import Any

from .context import own_error
from .text import dtype_of, fmt, label


def only_rounding(t: dict[str, Any]) -> bool:
    """Whether every failure of a run only carries ill-conditioned rounding or a decision
    a tie flipped: each loss is ill-conditioned (``judge/conditioning.py``: torch's own
    value is as far from the exact result), or there is none and a tie or a near tie
    flipped an ArgMax or a TopK (``decisions.py``: both choices are right), each failing
    value inherits its error, none fails its own rerun."""
    ill = t.get("ill_conditioned", 0)
    return (
        (ill > 0 or t.get("decision_origin", False))
        and ill == t.get("precision_loss", 0)
        and not t.get("own_failed", 0)
        and t.get("failed", 0) == t.get("inherited", 0)
    )


def precision_loss_text(summary: Any, most: int = 4) -> str:
    """The precision losses of a run in a sentence: which nodes, by how much, and what
    that means for the values after them."""
    losses = summary.precision_losses
    count = summary.totals.get("precision_loss", len(losses))
    named = ", ".join(
        f"{label(r)} [{r.onnx_op_type or r.kind}] ({fmt(own_error(r))})" for r in losses[:most]
    )
    more = f" and {count - most} more" if count > most else ""
    nodes = "1 node loses" if count == 1 else f"{count} nodes lose"
    t = summary.totals
    own = t.get("reran", 0) > t.get("precision_loss", 0)  # reruns besides the rule's
    dtype = dtype_of(losses[0]) if losses else "its dtype"
    if t.get("ill_conditioned", 0) == count:
        return (
            f"{nodes} precision in {dtype}: {named}{more}; ill-conditioned on these inputs "
            f"({dtype} rounding alone moves their exact result beyond tolerance, and torch's "
            "value is as far from it): no fault of the export, and none smaller than the "
            "rounding can be told apart"
            + ("; the values after them that fail carry it" if t.get("failed", 0) else "")
        )
    text = (
        f"{nodes} precision in {dtype}: {named}{more}; their inputs' rounding, which the op "
        "amplifies, is the whole error (computed exactly they agree): no fault of the "
        "export; keep them in float32 (onnx-sbs precision) to avoid it"
    )
    if summary.culprit is None and t.get("failed_nodes", 0):
        text += (
            f"; {t['failed_nodes']} value(s) after them fail that no rerun on torch's "
            "inputs told apart from the loss they carry"
        )
        if not own:
            text += " (own_error=True, --own-error, reruns every node)"
    elif summary.culprit is None and summary.verdict == "fail":
        text += (
            "; the loss reaches the outputs beyond tolerance: in this precision the model "
            "does not compute the program within it"
        )
    return text
