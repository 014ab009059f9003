"""Which inferred lowerings a comparison covers.

A model without exporter metadata gets its lowering from the pairs (names.py
``structural_lowering``): every ONNX node joins the fx node its value, or its consumers'
values, pair with. That says nothing where the fx node's own inputs went unpaired: with
only the graph's output paired, the whole graph would be one "lowering" and count as
compared. An fx node each of whose tensor inputs is paired bounds its lowering on both
sides, so its ONNX nodes are covered by the comparison at its output.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from .pairs import Pairing


def _tensor_inputs(node: torch.fx.Node) -> list[torch.fx.Node]:
    return [a for a in node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]


def _from_inputs(graph: torch.fx.Graph, user_inputs: set[str]) -> set[str]:
    """The nodes computed from a user input (the others are constants: a GRU's zero
    initial state, an arange of static size, which the model holds as constants)."""
    out: set[str] = set()
    for n in graph.nodes:
        if n.name in user_inputs or any(a.name in out for a in n.all_input_nodes):
            out.add(n.name)
    return out


def _inputs_paired(
    node: torch.fx.Node, paired: set[str], user_inputs: set[str], live: set[str]
) -> bool:
    for a in node.all_input_nodes:
        if a.name in paired or a.name not in live:
            continue
        if a.op == "placeholder":
            if a.name in user_inputs:
                return False  # a user input nothing pairs: the lowering starts unbounded
            continue  # a weight, buffer or constant: compared by content
        if a.op == "call_function" and isinstance(a.meta.get("val"), (tuple, list)):
            # a getitem of a multi-output node: the node's own inputs bound it
            if not all(
                x.name in paired or x.op == "placeholder" or x.name not in live
                for x in _tensor_inputs(a)
            ):
                return False
            continue
        if isinstance(a.meta.get("val"), torch.Tensor):
            return False
    return True


def bounded_lowerings(
    graph: torch.fx.Graph,
    pairing: Pairing,
    lowering: Iterable[str | None],
    user_inputs: Iterable[str],
) -> frozenset[str]:
    """The fx nodes of ``lowering`` whose tensor inputs all have a paired value."""
    wanted = {f for f in lowering if f is not None}
    paired = set(pairing.by_fx)
    users = set(user_inputs)
    live = _from_inputs(graph, users)
    return frozenset(
        n.name
        for n in graph.nodes
        if n.name in wanted and n.op == "call_function" and _inputs_paired(n, paired, users, live)
    )


__all__ = ["bounded_lowerings"]
