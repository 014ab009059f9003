"""A candidate node's own error: its inputs taken from the reference, so the error it adds
is told apart from the error it inherits.

The engine computes these inputs (the values of reference partners, converted to the
candidate's layout, and values computed from them where a node has no partner); the
verdict on the result is the judge's.
"""

from __future__ import annotations

from typing import Any

from ..judge.judging import as_candidate
from ..pairing.names import Pairing
from .sides import OnnxSide


class NotComputed:
    """An own-error value that could not be computed (the message says why)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


class Pending:
    """An own-error input that a batch computes before the node reads it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def own_error_inputs(
    cand: OnnxSide,
    pairing: Pairing,
    idx: int,
    ref_env: dict[str, Any],
    cand_env: dict[str, Any],
    own: dict[Any, Any],
    unproven: set[str] | frozenset[str] = frozenset(),
    pending: set[str] | frozenset[str] = frozenset(),
) -> tuple[list[Any], frozenset[str]] | None:
    """Inputs of candidate node ``idx`` for its own-error run, or None when one is missing.

    An input with a reference partner gets the reference value; one without gets the
    value computed from reference values upstream (``own``), so chains of nodes without
    partners are judged from the nearest reference values.  A weight is the model's own
    constant: the node is judged with it.  Pairs in ``unproven`` (the values turned out to
    differ in shape) are not partners.  Also returns the lowerings (fx nodes) other than
    the node's own that had to be recomputed that way: the own error inherits theirs.
    ``pending``: values whose own-error value a batch of nodes computes with this one
    (``stretches.py``): they come as :class:`Pending` markers.
    """
    values = []
    taint: set[str] = set()
    group = cand.lowering[idx]
    for name in cand.graph.inputs[idx]:  # node_inputs(), listed once per model
        if not name:
            values.append(None)
        elif name in cand.initializers:
            values.append(cand.initializer(name))
        elif name in pairing.by_onnx and name not in unproven:
            pair = pairing.by_onnx[name]
            key = ("ref", name)
            if key not in own:
                if pair.fx_name not in ref_env:
                    return None
                own[key] = cand.as_runner_value(as_candidate(pair, ref_env[pair.fx_name]))
            values.append(own[key])
        elif (name in own and not isinstance(own[name], NotComputed)) or name in pending:
            values.append(own[name] if name in own else Pending(name))
            taint.update(own.get(("from", name), ()))
            producer = cand.producer.get(name)
            source = cand.lowering[producer] if producer is not None else None
            if source is not None and source != group:
                taint.add(source)
        elif name in cand_env and name in cand.feeds:
            values.append(cand_env[name])
        else:
            return None
    return values, frozenset(taint)


__all__ = ["NotComputed", "Pending", "own_error_inputs"]
