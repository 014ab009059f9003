"""Fused nodes: ONNX nodes a graph tool made from the lowerings of several fx nodes.

onnxruntime's transformer optimizer, transformers' fused export and the like replace a
stretch of the exporter's nodes (a residual add and an RMSNorm) by one contrib node
(``SkipSimplifiedLayerNormalization``) that carries no ``pkg.torch.onnx.fx_node``
metadata.  Its values keep their names, so they pair; what is lost is which fx nodes it
computes.  Two answers follow from the pairs:

- its lowering is the fx node its value pairs with (not, as for a Cast an optimizer
  added, the lowering of whatever produced its first input: along a residual stream that
  would make every fused norm of the model part of the embedding's lowering);
- the fx nodes it replaced are those between its paired inputs and its paired outputs.
"""

from __future__ import annotations

import onnx
import torch

from ...records import KIND_INPUT
from .lowered_by import lowering_of_nodes
from .pairs import Pairing


def fused_lowering(
    nodes: list[onnx.NodeProto],
    producer: dict[str, int],
    fx_names: list[str | None],
    fused: dict[int, list[str]],
) -> list[str | None]:
    """Each ONNX node's fx node: its metadata's; for a fused node (``fused``, from
    :func:`replaced_fx_nodes`) the last fx node it computes, the one its value pairs
    with; else (a node an optimizer added, a Cast say) its first computed input's."""
    names = list(fx_names)
    for k, region in fused.items():
        names[k] = region[-1]
    return lowering_of_nodes(nodes, producer, names)


def _twins(values: list[str], pairing: Pairing, computed: bool = False) -> list[str]:
    """The fx nodes ``values`` pair with, in order (``computed``: no graph input)."""
    found = []
    for v in values:
        p = pairing.by_onnx.get(v) if v else None
        if p is not None and not (computed and p.kind == KIND_INPUT) and p.fx_name not in found:
            found.append(p.fx_name)
    return found


def replaced_fx_nodes(
    nodes: list[onnx.NodeProto],
    fx_names: list[str | None],
    pairing: Pairing,
    graph: torch.fx.Graph,
) -> dict[int, list[str]]:
    """For each ONNX node without metadata whose inputs and first output pair (a node a
    graph tool made), the fx nodes it computes (the program's, in graph order, its first
    output's twin last): those that descend from its inputs' twins and lead to its
    outputs' twins.  A node without metadata whose inputs have no twin is a piece of a
    lowering (the exporter's own, or an optimizer's Cast), not a fusion."""
    by_name = {n.name: n for n in graph.nodes}
    order = {n: k for k, n in enumerate(graph.nodes)}
    result: dict[int, list[str]] = {}
    for k, node in enumerate(nodes):
        if fx_names[k] is not None:
            continue
        first = _twins(node.output[:1], pairing, computed=True)
        ends = [by_name[f] for f in _twins(node.output, pairing, computed=True) if f in by_name]
        starts = {by_name[f] for f in _twins(node.input, pairing) if f in by_name}
        if not first or first[0] not in by_name or not starts:
            continue
        inside = sorted(_between(starts, ends), key=order.__getitem__)
        if by_name[first[0]] in inside:
            inside.remove(by_name[first[0]])
            result[k] = [n.name for n in inside] + [first[0]]
    return result


def _between(starts: set[torch.fx.Node], ends: list[torch.fx.Node]) -> set[torch.fx.Node]:
    """Call nodes that are ends or ancestors of one, and descend from a start."""
    upstream: set[torch.fx.Node] = set()
    stack = list(ends)
    while stack:
        n = stack.pop()
        if n in upstream or n in starts or n.op != "call_function":
            continue
        upstream.add(n)
        stack.extend(n.all_input_nodes)
    reached: set[torch.fx.Node] = set()
    stack = [u for s in starts for u in s.users]
    while stack:
        n = stack.pop()
        if n in reached or n not in upstream:
            continue
        reached.add(n)
        stack.extend(n.users)
    return reached


__all__ = ["fused_lowering", "replaced_fx_nodes"]
