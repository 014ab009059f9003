"""Results whose order the reference's definition leaves free (``torch.topk(...,
sorted=False)``): the two sides may list the same elements in different orders, equally
right.  They are compared as sets: each side's values put in the order of its own key
(TopK's indices), then compared as usual; the nodes after them continue from the torch
values (``engine/resets.py``), so the order one side chose does not fail everything
downstream.  A result whose elements differ still fails.

Which reference ops leave the order free is a registry (:data:`ORDER_FREE_OPS`), one
named object per op: adding one is one class and one entry.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ...compare.diff import compare
from ...convert import to_numpy
from ...records import KIND_WEIGHT, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_COMPARED, RuleContext
from .ties import tied


@dataclass(frozen=True)
class OrderFree:
    """The outputs of one candidate node whose order is free along ``axis``; ``key``:
    the output that orders them (indices) and its reference partner, None when unpaired
    (the values are then put in order of their own)."""

    axis: int
    outputs: tuple[str, ...]
    key: str | None
    key_fx: str | None
    reason: str
    reference: str = "torch's"  # whose order the candidate continues from


@dataclass
class SetOrder:
    """What a comparison as sets needs of one pair: its group and both sides' keys."""

    group: OrderFree
    ref_key: Any
    cand_key: Any


def unordered_note(reason: str) -> str:
    return f"order unspecified ({reason}): compared as sets"


def continued_note(reason: str, reference: str = "torch's") -> str:
    return f"{unordered_note(reason)}; the ONNX side continues from {reference} order"


def _attr(node: onnx.NodeProto, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


class TopKUnsorted:
    """``torch.topk(..., sorted=False)`` (and an ONNX reference's ``TopK`` with
    ``sorted=0``): the k elements in an order of the runtime's choosing."""

    name = "topk_unsorted"
    reason = "sorted=False"
    onnx_reason = "sorted=0"

    def fx_order_free(self, node: Any) -> bool:
        import torch

        if node.target is not torch.ops.aten.topk.default:
            return False
        args, kwargs = node.args, node.kwargs
        return not kwargs.get("sorted", args[4] if len(args) > 4 else True)

    def onnx_order_free(self, node: onnx.NodeProto) -> bool:
        return self.lowers_to(node) and _attr(node, "sorted", 1) == 0

    def lowers_to(self, node: onnx.NodeProto) -> bool:
        return node.op_type == "TopK" and node.domain in ("", "ai.onnx")

    def group(
        self, node: onnx.NodeProto, partner: Mapping[str, str], reason: str, reference: str
    ) -> OrderFree:
        outputs = tuple(o for o in node.output if o)
        key = node.output[1] if len(node.output) > 1 and node.output[1] in partner else None
        key_fx = partner.get(key) if key else None
        return OrderFree(_attr(node, "axis", -1), outputs, key, key_fx, reason, reference)


#: The reference ops whose result's order is free, tried in order.
ORDER_FREE_OPS: tuple[TopKUnsorted, ...] = (TopKUnsorted(),)


def _reference_order_free(reference: Any, fx_name: str, op: TopKUnsorted) -> tuple[str, str] | None:
    """Why and whose order, where the reference computes ``fx_name`` with ``op`` leaving
    its order free; None where it does not."""
    by_name = getattr(reference, "by_name", None)
    if by_name is not None:  # a torch program: the getitem of the op's tuple
        node = by_name.get(fx_name)
        if node is not None and node.target is operator.getitem:
            node = node.args[0]
        free = node is not None and hasattr(node, "target") and op.fx_order_free(node)
        return (op.reason, "torch's") if free else None
    producer = getattr(reference, "producer", None)
    if producer is not None and fx_name in producer:  # an ONNX reference
        if op.onnx_order_free(reference.nodes[producer[fx_name]]):
            return op.onnx_reason, "the reference model's"
    return None


def order_free_groups(
    nodes: Sequence[onnx.NodeProto], reference: Any, partner: Mapping[str, str]
) -> dict[str, OrderFree]:
    """The candidate's values whose order the reference leaves free, by ONNX name
    (``partner``: ONNX value -> its reference partner)."""
    found: dict[str, OrderFree] = {}
    for node in nodes:
        for op in ORDER_FREE_OPS:
            if not op.lowers_to(node):
                continue
            fx = next((partner[o] for o in node.output if o in partner), None)
            free = _reference_order_free(reference, fx, op) if fx is not None else None
            if free is None:
                continue
            group = op.group(node, partner, *free)
            found.update((o, group) for o in group.outputs)
            break
    return found


def _in_order(value: Any, key: Any, axis: int) -> np.ndarray:
    """``value`` with each slice along ``axis`` in the order of ``key`` (of its shape)."""
    order = np.argsort(key, axis=axis, kind="stable")
    return np.take_along_axis(value, order, axis)


def as_sets(expected: Any, got: Any, name: str, view: SetOrder) -> tuple[Any, Any] | None:
    """Both values in a canonical order (of their own side's key; of their own values
    where the keys hold different elements, as tied indices may), None where they
    cannot be put in one (no array, another shape)."""
    e, g = np.asarray(to_numpy(expected)), np.asarray(to_numpy(got))
    if e.shape != g.shape or e.ndim == 0:
        return None
    axis = view.group.axis % e.ndim
    ek = gk = None
    if view.group.key is not None and view.ref_key is not None and view.cand_key is not None:
        ek, gk = np.asarray(to_numpy(view.ref_key)), np.asarray(to_numpy(view.cand_key))
        if ek.shape != e.shape or gk.shape != g.shape:
            ek = gk = None
        elif name != view.group.key and not np.array_equal(
            np.sort(ek, axis=axis), np.sort(gk, axis=axis)
        ):
            ek = gk = None  # other elements chosen (ties, or a fault): by their values
    if ek is None:
        ek, gk = e, g
    return _in_order(e, ek, axis), _in_order(g, gk, axis)


class UnorderedResult:
    """A value whose order the reference leaves free (``ctx.unordered``): when the two
    sides list it in different orders, the comparison is made again on both in a
    canonical order (as sets) and replaces the first; the rules after it judge that.
    Decides nothing itself."""

    name = "unordered_result"
    stage = STAGE_COMPARED
    own_error = True

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        d = ctx.diff
        return (
            ctx.unordered is not None
            and d is not None
            and not d.passed
            and not d.shape_mismatch
            and not d.dtype_mismatch
        )

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        view: SetOrder = ctx.unordered
        both = as_sets(expected, got, ctx.name, view)
        if both is None:
            return False
        e, g = both
        d = compare(
            e, g, ctx.atol, ctx.rtol, ctx.inherited, ctx.pair.kind == KIND_WEIGHT, ctx.policy
        )
        ctx.diff = d
        same = d.passed or (ctx.tie is not None and tied(d, ctx.tie, e, g))
        if same:
            ctx.reordered.add(ctx.name)
        reason = view.group.reason
        note = continued_note(reason, view.group.reference) if same else unordered_note(reason)
        record.comment = _join(record.comment, note)
        return False


def own_as_sets(expected: Any, got: Any, name: str, view: SetOrder | None) -> tuple[Any, Any]:
    """The own-error comparison's values as sets, where their order is free."""
    if view is None:
        return expected, got
    both = as_sets(expected, got, name, view)
    return both if both is not None else (expected, got)


__all__ = [
    "ORDER_FREE_OPS",
    "OrderFree",
    "SetOrder",
    "TopKUnsorted",
    "UnorderedResult",
    "as_sets",
    "continued_note",
    "order_free_groups",
    "own_as_sets",
    "unordered_note",
]
