"""Structural pairs that the pairs of their readers confirm.

A pair made by structure is a guess; where two dimensions are equally long (a sequence
as long as a head) a value and its transpose have one shape, and the walk may pair a
value with the wrong one of the two (:class:`..judge.shapes.PermutedPair` then unpairs
it).  The readers tell them apart: when every paired ONNX node reading the value has a
twin that reads the value's twin, the pair is the graph's own, and a value that agrees
with its twin only once transposed is a fault of the node making it (a Transpose given
the wrong permutation), not another layout.
"""

from __future__ import annotations

import torch

from .lowerings import COPIES, op_name
from .rules import StructureRule


def mark_read_by_twins(ctx) -> None:
    """Sets ``Pair.read_by_twins`` on each structural pair of ``ctx.pairing`` whose
    paired readers all read its twin (through copies), at least one of them."""
    pairing, fx_nodes = ctx.pairing, ctx.fx_nodes
    readers: dict[str, list] = {}
    for node in ctx.graph.node:
        for i in set(node.input):
            if i:
                readers.setdefault(i, []).append(node)
    for name, pair in pairing.by_onnx.items():
        fx = fx_nodes.get(pair.fx_name)
        if pair.rule != StructureRule.name or fx is None:
            continue
        found = []
        for m in readers.get(name, ()):
            for o in m.output:
                twin = pairing.by_onnx.get(o) if o else None
                reader = fx_nodes.get(twin.fx_name) if twin is not None else None
                if reader is not None:
                    found.append(fx in _read_by(reader))
        pair.read_by_twins = bool(found) and all(found)


def _read_by(node: torch.fx.Node) -> set[torch.fx.Node]:
    """The fx values ``node`` reads, and those its copy arguments copy."""
    found: set[torch.fx.Node] = set()
    stack = list(node.all_input_nodes)
    while stack:
        a = stack.pop()
        if a in found:
            continue
        found.add(a)
        if a.op == "call_function" and op_name(a) in COPIES:
            stack.extend(a.all_input_nodes)
    return found


__all__ = ["mark_read_by_twins"]
