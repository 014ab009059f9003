"""Whose error a weight is: a weight that differs from its torch parameter is the
model's error only when the node consuming it disagrees with torch because of it (an
exporter folds a BatchNorm into a Conv's weight, and its consumer still agrees).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...compare.value_facts import largest_magnitude, smallest_normal
from ...records import (
    EXACT_WEIGHT_NOTE,
    FOLDED_CONSUMER_NOTE,
    KIND_WEIGHT,
    STATUS_DTYPE_MISMATCH,
    STATUS_QUANTIZATION_NOISE,
    STATUS_SHAPE_MISMATCH,
    STATUS_WEIGHT_DIFFERS,
    WEIGHT_COMPENSATED_NOTE,
    WEIGHT_READER_NOTE,
    WEIGHT_UNEXPLAINED_NOTE,
    WEIGHT_UNREAD_NOTE,
    WEIGHT_UNTRIED_NOTE,
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
    scale = _finite_scale(want)
    return scale is None or err <= consumer.rtol * scale


def _finite_scale(want: Any) -> float | None:
    """The largest finite magnitude of ``want``: NaN and infinities are data (a NaN
    input's pattern, a mask's -inf), compared as patterns; they are no scale."""
    if isinstance(want, torch.Tensor) and want.is_floating_point() and want.numel():
        finite = want.detach()[torch.isfinite(want.detach())]
        return float(finite.abs().max().double()) if finite.numel() else None
    return largest_magnitude(want)


def settle_weight(
    wrec: Record,
    consumer: Record,
    want: Any,
    with_torch_weight: Callable[[], bool | None],
    folded: tuple[str, ...] = (),
    by_tolerance: bool = True,
    differs_where: Callable[[], str | None] = lambda: None,
    own_error: bool = False,
    folded_weights: tuple[str, ...] = (),
) -> bool:
    """The verdict on weight ``wrec`` from its ``consumer``'s record (``want``: the
    consumer's torch value).  ``with_torch_weight`` runs the consumer again with the torch
    parameter (True: it then agrees; None: that cannot be tried); called only when
    needed.  ``folded``: the fx nodes the consumer computes at once (``folding.py``):
    the weight is then judged with its consumer, never alone.  ``by_tolerance``: the
    consumer's verdict is atol/rtol's (not the user's verdict policy or compare
    function, which decide it exactly as they decide the first comparison).  Returns
    whether the weight's record comes before its consumer's (it is then the answer).
    ``differs_where``: where the weight differs, in words (" in rows 12-63 of 64"), asked
    only for a difference its consumer does not read.  ``folded_weights``: the
    initializers the consumer reads, all of which carry a fold (a Conv's weight and the
    bias the exporter made from its BatchNorm), named when the consumer disagrees."""
    wrec.decided_by = WEIGHT_BLAME
    node = consumer.onnx_node_name or consumer.onnx_name
    # a quantized model's consumer agrees when it is within the model's quantization
    # noise (quantization_noise.py): the folded weight's rounding is part of that noise
    noise = consumer.status == STATUS_QUANTIZATION_NOISE
    agrees = (
        noise or consumer.passed2 is True or (consumer.passed2 is None and consumer.passed is True)
    )
    if folded and (consumer.passed is not None or consumer.passed2 is not None):
        # no scale check: the folded weight says nothing of its own, its consumer's
        # verdict is the verdict on both
        return _folded(wrec, consumer, node, folded, agrees, noise, folded_weights)
    if agrees and not noise and by_tolerance and not agrees_at_its_scale(consumer, want):
        agrees = False
        wrec.comment = _join(
            wrec.comment,
            f"its consumer {node} is within tolerance only by the absolute tolerance: "
            "its difference is large beside its own values",
        )
    what = "parameter" if wrec.kind == KIND_WEIGHT else "value"
    if agrees:
        # a consumer that agrees with the torch parameter too does not read what differs
        # on these inputs (a Gather of a few rows): no transformation it compensates
        with_torch = with_torch_weight() if wrec.kind == KIND_WEIGHT and not noise else None
        if EXACT_WEIGHT_NOTE in (wrec.comment or "") and with_torch is not False:
            # within tolerance, yet not a copy (exact_weight.py): a change too small for
            # its consumer's tolerance is still a change of the model's data
            wrec.comment = _join(wrec.comment, _small_change(node, with_torch, own_error))
            return True
        if with_torch is True:
            wrec.comment = _join(
                wrec.comment,
                f"differs from the torch parameter{differs_where() or ''}; its consumer "
                f"{node} agrees with torch given this weight or torch's alike: "
                f"{WEIGHT_UNREAD_NOTE}, inputs that do will not agree",
            )
            return True
        wrec.status = STATUS_WEIGHT_DIFFERS
        wrec.passed2 = None  # its own rerun differs by the same change (see _folded)
        wrec.comment = _join(
            wrec.comment,
            f"differs from the torch {what}, but its consumer {node} agrees with torch"
            + (" within the model's quantization noise" if noise else "")
            + (
                _WHY_AGREES[with_torch if with_torch is not None or not own_error else "untried"]
                if wrec.kind == KIND_WEIGHT
                else " on this input"
            ),
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
            f"its consumer {node} disagrees with torch even with the torch {what}: "
            "the error is the consumer's own",
        )
        return False
    wrec.comment = _join(
        wrec.comment,
        f"its consumer {node} disagrees with torch"
        + (f" and agrees once given the torch {what}" if with_torch else " too"),
    )
    return True


def _small_change(node: str | None, with_torch: bool | None, own_error: bool) -> str:
    """Why a weight off its parameter by less than the tolerance of computed values still
    fails while its consumer agrees (``with_torch``: the consumer's verdict given the
    torch parameter, None when not tried)."""
    if with_torch is True:
        return (
            f"its consumer {node} agrees with torch given this weight or torch's alike: "
            "the change is below its tolerance on these inputs, and still a change of the "
            "model's weights"
        )
    why = WEIGHT_UNTRIED_NOTE if own_error else WEIGHT_UNEXPLAINED_NOTE
    return (
        f"its consumer {node} agrees with torch on these inputs: a change below its "
        "tolerance, unless the exporter made it and its consumer makes up for it "
        f"({why})"
    )


# why an unfolded weight differs while its consumer agrees, by the consumer's verdict given
# the torch parameter instead (None: not tried, no own-error rerun to take inputs from)
_WHY_AGREES: dict[bool | str | None, str] = {
    False: " and disagrees given the torch parameter: the exporter changed it and "
    f"{WEIGHT_COMPENSATED_NOTE} (a BatchNorm folded into a Conv, say)",
    None: " on these inputs: the exporter changed it (a fold), or these inputs do not "
    f"read what differs ({WEIGHT_UNEXPLAINED_NOTE})",
    "untried": f" on these inputs ({WEIGHT_UNTRIED_NOTE}: a fold, or what differs is "
    "not read on these inputs)",
}

_FOLDED_WEIGHTS = "with weights the exporter folded "


def _folded(
    wrec: Record,
    consumer: Record,
    node: str | None,
    folded: tuple[str, ...],
    agrees: bool,
    noise: bool = False,
    folded_weights: tuple[str, ...] = (),
) -> bool:
    """A weight the exporter folded other fx nodes into: it differs by design, and its
    consumer, which computes those nodes at once, is judged for both; a consumer that
    disagrees names every weight it reads (``folded_weights`` and this one): the error
    may be in any of them (a bias the exporter made, paired with no torch parameter)."""
    wrec.status = STATUS_WEIGHT_DIFFERS
    # a quantized weight's own rerun (its DequantizeLinear on the torch parameter) differs
    # by the same folding: no error of its own, never a culprit by itself
    wrec.passed2 = None
    into = ", ".join(folded[1:])
    wrec.comment = _join(
        wrec.comment,
        f"the exporter folded {into} into it: its consumer {node} computes "
        f"{', '.join(folded)} at once"
        + (
            " and agrees with torch" + (" within the model's quantization noise" if noise else "")
            if agrees
            else ", disagrees with torch, and is judged for both (the folded weight and "
            "its computation)"
        ),
    )
    if agrees:
        return agrees
    if FOLDED_CONSUMER_NOTE in (consumer.comment or ""):
        # a second folded weight of the same consumer (the bias after the weight): named too
        listed = f"{_FOLDED_WEIGHTS}("
        at = consumer.comment.find(listed)
        end = consumer.comment.find(")", at)
        names = consumer.comment[at + len(listed) : end].split(", ") if at >= 0 else []
        if at >= 0 and end > at and wrec.onnx_name not in names:
            consumer.comment = (
                consumer.comment[:end] + f", {wrec.onnx_name}" + consumer.comment[end:]
            )
        return False
    names = [wrec.onnx_name or "", *(n for n in folded_weights if n != wrec.onnx_name)]
    consumer.comment = _join(
        consumer.comment,
        f"{FOLDED_CONSUMER_NOTE} {', '.join(folded)}, {_FOLDED_WEIGHTS}"
        f"({', '.join(names)}): the error is in a folded weight or in the computation",
    )
    return False


# why one initializer stands for another parameter: the dynamo exporter keeps one copy of
# equal tensors (two fresh LayerNorms' weights, all ones)
_STORED_ONCE = "the exporter stored the equal parameters once"


def readers_text(weight: str, param: str, readers: Sequence[tuple[str, str]]) -> str | None:
    """ "ln1.weight is read by node_a (for p_ln1_weight) and node_b (for p_ln2_weight: the
    exporter stored the equal parameters once)": every node reading initializer
    ``weight`` (paired with torch parameter ``param``) and the parameter its torch twin
    reads in its place (``readers``: (node, parameter) pairs); None unless one of them
    stands for another parameter than ``param`` (nothing then to tell beyond the
    consumer's verdict)."""
    if len(readers) < 2 or all(p == param for _, p in readers):
        return None
    parts = [f"{node} (for {p}{'' if p == param else ': ' + _STORED_ONCE})" for node, p in readers]
    listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    return f"{weight} is read by {listed}"


def explain_reader(
    consumer: Record,
    weight: str,
    param: str,
    paired: str,
    with_torch_weight: Callable[[], bool | None],
) -> bool:
    """Whether the own error of ``consumer``, a node reading the differing initializer
    ``weight`` (paired with torch parameter ``paired``) in place of torch parameter
    ``param`` (its torch twin's; ``paired`` unless the exporter stored equal parameters
    once), is the weight's: its rerun on torch inputs fails, and agrees given ``param``
    instead (``with_torch_weight``, called only then).  Its comment then says so
    (``WEIGHT_READER_NOTE``): the culprit rules and the suspects pass over it, as over a
    value that inherits its error."""
    if consumer.passed2 is not False or with_torch_weight() is not True:
        return False
    stands = "" if param == paired else f" (equal to {paired}: {_STORED_ONCE})"
    consumer.comment = _join(
        consumer.comment,
        f"{WEIGHT_READER_NOTE} {weight}, which it reads for {param}{stands}: given the "
        f"torch parameter {param} instead, it agrees with torch",
    )
    return True


__all__ = ["WEIGHT_BLAME", "agrees_at_its_scale", "explain_reader", "readers_text", "settle_weight"]
