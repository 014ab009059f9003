"""A reproduced preparation, renamed to the names the ONNX model gives its fx nodes.

Where sizes are symbolic, the exporter's re-trace numbers nodes after calls it records
and drops again (every ``s0 * s1`` the shape arithmetic computes takes a ``mul``), so the
same graph comes out as ``add_43`` there and ``add`` in :mod:`.reproduce`.  The model
says what each name it uses stands for: ``pkg.torch.onnx.fx_node`` is the node as
``format_node`` prints it, arguments by name.  Walking the reproduced graph in order,
with each node's arguments already renamed, a node whose printed call is one the model
describes takes that description's name.  The result is only used when
:func:`.check.disagreement` then finds nothing, so a wrong guess costs a re-trace,
never a wrong pairing.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..fx_metadata import FxMetadata
from .check import NodePrinter
from .graphs import copy_graph_module, with_graph

_HEAD = re.compile(r"^%[^ ]+ : (\[num_users=\d+\] )?")
_NAME = re.compile(r"%([A-Za-z_][A-Za-z0-9_]*)")
_PENDING = "_sbs_pending_"
_TARGET = re.compile(r"\[target=([^\]]*)\]")
_SUFFIX = re.compile(r"_\d+$")


def _call(text: str) -> str:
    """A printed node without its own name and its number of users: what it computes."""
    return _HEAD.sub("", text.strip(), count=1)


@dataclass
class _Description:
    name: str
    reads: list[str]  # the names its arguments print, in order


def adopt_model_names(
    program: torch.export.ExportedProgram, metadata: FxMetadata
) -> torch.export.ExportedProgram | None:
    """A copy of ``program`` whose nodes carry the names ``metadata`` gives the same calls;
    None when no node's name changes (nothing to try).

    A node the model does not describe (its lowering folded away) is named by the first
    described node that reads it.  A node named by neither keeps its name where no
    description uses it (a value of that name in the model is then its own, or values
    disprove the pair), and takes a fresh one where one does: it is another node there."""
    described: dict[str, list[_Description]] = defaultdict(list)
    seen: set[str] = set()
    computes: dict[str, str | None] = {}  # a described name -> the op it calls
    for text, name in zip(metadata.texts, metadata.names):
        if text is None or name is None or name in seen:
            continue
        seen.add(name)
        computes[name] = _target(text)
        call = _call(text)
        described[_NAME.sub("%?", call)].append(_Description(name, _NAME.findall(call)))
    model_names = seen | {r for group in described.values() for d in group for r in d.reads}
    gm = copy_graph_module(program.graph_module)
    graph = gm.graph
    original = {n: n.name for n in graph.nodes}
    calls = [n for n in graph.nodes if n.op == "call_function"]
    pending = {}
    for k, node in enumerate(calls):
        # a name no description uses: what a node reads is then either named or pending
        node.name = f"{_PENDING}{k}"
        pending[node.name] = node
    printed = NodePrinter()
    taken = {n.name for n in graph.nodes if n.op != "call_function"}

    def binds(mine: str, theirs: str) -> bool:
        """A pending node may take a name the model describes only if it calls that op,
        and one it does not describe only if the name is made from its op's (the tracer
        names a node after its op: an ``unsqueeze`` is never ``mul_62``)."""
        node = pending[mine]
        if theirs in computes:
            return computes[theirs] == _target(printed(node))
        return _SUFFIX.sub("", theirs) in _bases(node, original[node])

    def kept(node: torch.fx.Node, found: tuple[_Description, dict[str, str]]) -> int:
        """How many names a match leaves as built."""
        description, bound = found
        same = sum(original[pending[mine]] == theirs for mine, theirs in bound.items())
        return same + (original[node] == description.name)

    # first the matches that keep every name as built, then those that keep the node's
    # own, then the rest, each pass in graph order: look-alike chains (three
    # ``unsqueeze`` chains building a mask, one folded away in the model) are told apart
    # by the names the reproduction shares with the re-trace (shape arithmetic shifts
    # the numbers of some ops only)
    passes = (
        lambda node, m: kept(node, m) == len(m[1]) + 1,  # every name as built
        lambda node, m: original[node] == m[0].name,  # the node's own name as built
        lambda node, m: True,
    )
    matched: set[torch.fx.Node] = set()
    for accepts in passes:
        for node in calls:
            if node in matched:
                continue
            # a node named as another's argument still binds its own pending arguments
            own = None if node.name in pending else node.name
            call = _call(printed(node))
            matches = _consistent(
                described.get(_NAME.sub("%?", call)), _NAME.findall(call), taken, binds, own
            )
            matches = [m for m in matches if accepts(node, m)]
            found = max(matches, key=lambda m: kept(node, m), default=None)
            if found is None:
                continue
            matched.add(node)
            described[_NAME.sub("%?", call)].remove(found[0])
            renames = [*found[1].items()]
            if own is None:
                renames.append((node.name, found[0].name))
            for mine, theirs in renames:
                pending.pop(mine).name = theirs
                taken.add(theirs)
    if all(n.name == original[n] for n in graph.nodes if n.name not in pending):
        return None
    for node in pending.values():
        node.name = original[node]
    _settle_names(graph, set(graph.nodes) - set(pending.values()), model_names)
    _keep_user_names(graph, original)
    gm.recompile()
    return with_graph(program, gm)


def unnamed_values(program: torch.export.ExportedProgram, values: set[str]) -> list[str]:
    """The model's values named as a node of ``program``'s ops would be (``mul_689``)
    that no node of it is: a graph tool's fused node keeps the names of the values it
    computes and describes none of them, so renaming cannot reach them, and a value no
    node is named after pairs with nothing."""
    graph = program.graph
    names = {n.name for n in graph.nodes}
    bases = set()
    for node in graph.nodes:
        if node.op == "call_function":
            bases |= _bases(node, node.name)
    return sorted(v for v in values - names if _SUFFIX.sub("", v) in bases)


def _bases(node: torch.fx.Node, name: str) -> set[str]:
    """The names a tracer may give ``node`` before numbering them: its op's, as packet
    (``unsqueeze``) or with its overload (``sym_size_int``), and its own name's."""
    bases = {_SUFFIX.sub("", name)}
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        packet = target.overloadpacket.__name__
        bases |= {packet, f"{packet}_{target._overloadname}"}
    return bases


def _target(text: str) -> str | None:
    found = _TARGET.search(text)
    return found and found.group(1)


def _consistent(
    candidates: list[_Description] | None,
    reads: list[str],
    taken: set[str],
    binds: Callable[[str, str], bool],
    own: str | None = None,
) -> list[tuple[_Description, dict[str, str]]]:
    """The descriptions whose arguments agree with ``reads`` (named arguments equal, each
    pending one read under one name no node has yet, and that ``binds`` allows), each
    with the names it gives the pending ones, in the model's order; ``own``: the node's
    name where it has one already (only its description then)."""
    matches = []
    for description in candidates or ():
        if len(description.reads) != len(reads):
            continue
        if description.name != own if own is not None else description.name in taken:
            continue
        bound: dict[str, str] = {}
        for mine, theirs in zip(reads, description.reads):
            if mine.startswith(_PENDING):
                if theirs in taken or bound.setdefault(mine, theirs) != theirs:
                    break
                if not binds(mine, theirs):
                    break
            elif mine != theirs:
                break
        else:
            if len(set(bound.values())) == len(bound):
                matches.append((description, bound))
    return matches


def _settle_names(graph: torch.fx.Graph, named: set[torch.fx.Node], reserved: set[str]) -> None:
    """Makes every name unique again: a node the model does not describe keeps its name
    unless the model gives that name to another node, and then takes a fresh one."""
    used = {n.name for n in named}
    namespace = graph._graph_namespace
    for node in graph.nodes:
        if node not in named:
            base, name, k = node.name, node.name, 0
            while name in used or name in reserved:
                k += 1
                name = f"{base}_sbs{k}"
            node.name = name
            used.add(name)
        namespace._obj_to_name[node] = node.name
        namespace._used_names.add(node.name)


def _keep_user_names(graph: torch.fx.Graph, original: dict[torch.fx.Node, str]) -> None:
    """A node the reproduction copied from the user's graph is known to the user by its
    name, and has no provenance besides (:func:`.provenance.user_node_name`): renamed, it
    records the name it had."""
    from torch.fx.traceback import NodeSource, NodeSourceAction

    for node in graph.nodes:
        if (
            node.op == "call_function"
            and node.name != original[node]
            and not node.meta.get("from_node")
        ):
            source = NodeSource(None, "adopt_model_names", NodeSourceAction.REPLACE)
            source.node_info = NodeSource.NodeInfo(original[node], str(node.target), id(graph))
            node.meta = {**node.meta, "from_node": [source]}
