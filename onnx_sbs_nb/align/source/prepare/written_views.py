"""Views of values written in place, as the exporter's re-trace functionalizes them.

Functionalization makes a view of a written value again where it is read, from the value
as written (``replayed``).  A view made *after* every write into its base is made twice
more than the user wrote it: where the program makes it, the re-trace records the chain
of views from the base up to it and drops it again (names taken, nodes dead: an
``unsqueeze``, then ``unsqueeze_1``, ``expand`` for the ``expand`` of it), and where it
is read, the chain once more, kept (``unsqueeze_2``, ``expand_1``: a static KV cache's
``repeat_kv`` of the written cache).  :mod:`.reproduce` makes the kept chain where it
is read, as for any replayed view, and takes the dropped chain's names where the view
stands (``chains``), so the reproduction is named as the re-trace names it.

A decomposed view made after the writes (``reshape`` of the expanded cache: ``clone``
and ``_unsafe_view``) is spliced where it stands, its input replayed there (``spliced``);
one whose expansion makes views again, or a view of it, is declined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.fx

from .unsupported import Unsupported

Pred = Callable[[torch.fx.Node], bool]


@dataclass
class WrittenViews:
    # views made where they are read (functionalization's replay)
    replayed: set[torch.fx.Node] = field(default_factory=set)
    # a view made after every write into its base -> the views from the base up to it
    chains: dict[torch.fx.Node, list[torch.fx.Node]] = field(default_factory=dict)
    # decomposed views made after the writes: spliced where they stand
    spliced: set[torch.fx.Node] = field(default_factory=set)


def written_views(
    graph: torch.fx.Graph, pure_view: Pred, writes: Pred, decomposed: Pred
) -> WrittenViews:
    """The views of ``graph``'s written values and how the walk makes them."""

    into: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # base -> the writes into it
    for n in graph.nodes:
        if n.op == "call_function" and writes(n):
            into.setdefault(n.args[0], []).append(n)
    found = WrittenViews()
    if not into:
        return found
    for node in graph.nodes:
        if node.op != "call_function" or not pure_view(node):
            continue
        root, chain, collecting = node.args[0], [node], True
        while isinstance(root, torch.fx.Node) and root.op == "call_function":
            if root in into:
                break
            if writes(root):
                collecting = False  # the views below a write are views of its value
            elif pure_view(root):
                if collecting:
                    chain.append(root)
            else:
                break
            root = root.args[0]
        if root not in into:
            continue
        if any(w > node for w in into[root]):
            found.replayed.add(node)  # a later write changes it: made where it is read
            continue
        if decomposed(node):
            found.spliced.add(node)
            continue
        found.replayed.add(node)
        found.chains[node] = chain[::-1]
    for node, chain in found.chains.items():
        if any(v in found.spliced for v in chain):
            raise Unsupported(f"node {node.name!r} views a decomposed view of a written value")
    return found


def reserve_dropped_names(
    graph: torch.fx.Graph, chain: list[torch.fx.Node], name: Callable
) -> None:
    """Takes the names the re-trace gives the chain it records and drops where a view of
    a written value is made (``name``: the walk's candidate name for a target)."""
    namespace = graph._graph_namespace
    for view in chain:
        namespace.create_name(name(graph, view.target), None)
