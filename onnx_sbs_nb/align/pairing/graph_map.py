"""How an optimized graph relates to its original, node by node.

A fused or contrib node keeps the names of the values it produces; its
:class:`OptimizedNode` says which original nodes it stands for (``replaced``) and which
original values it made internal (``internal``).  onnxruntime writes nodes without their
``metadata_props``: each node gets those of the original node it comes from
(:func:`carry_metadata`), so pairing by the exporter's ``pkg.torch.onnx.fx_node`` keeps
working on the optimized graph.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import onnx

from ..source.fx_metadata import FX_NODE_KEY

# Values of OptimizedNode.kind
NODE_UNCHANGED = "unchanged"  # the original node, as it was


NODE_REWRITTEN = "rewritten"  # one original node, changed (inputs, op or attributes)


NODE_FUSED = "fused"  # stands for several original nodes


NODE_INSERTED = "inserted"  # new: stands for no original node (a layout Transpose, say)


# metadata this module writes on the optimized nodes (the exporter's keys are carried over)
META_KIND = "pkg.onnx_sbs_nb.optimized_kind"


META_REPLACED = "pkg.onnx_sbs_nb.replaced"


META_INTERNAL = "pkg.onnx_sbs_nb.internal_values"


META_GROUP = "pkg.onnx_sbs_nb.part_of"


@dataclass
class OptimizedNode:
    """One node of the optimized graph, mapped onto the original graph."""

    name: str  # its name (or OpType_index when it has none), as the engine names it
    index: int  # position in the optimized graph
    op_type: str
    domain: str
    kind: str  # NODE_UNCHANGED, NODE_REWRITTEN, NODE_FUSED or NODE_INSERTED
    replaced: list[str] = field(default_factory=list)  # original node names
    internal: list[str] = field(default_factory=list)  # original values it made internal
    origin: str | None = None  # the original node whose metadata it carries
    group: str | None = None  # the node it is part of (its own name, or its fused node's)


# ---------------------------------------------------------------- mapping
def node_name(node: onnx.NodeProto, k: int) -> str:
    """A node's name as the engine names it."""
    return node.name or f"{node.op_type}_{k}"


def _opset(model: onnx.ModelProto, domain: str) -> int | None:
    for o in model.opset_import:
        if o.domain == domain or (domain in ("", "ai.onnx") and o.domain in ("", "ai.onnx")):
            return o.version
    return None


def _attributes(node: onnx.NodeProto, opset: int | None) -> dict[str, bytes]:
    """Attributes with the schema's defaults filled in (onnxruntime writes them out)."""
    attrs = {}
    for a in node.attribute:
        b = onnx.AttributeProto()
        b.CopyFrom(a)
        b.ClearField("doc_string")
        attrs[a.name] = b.SerializeToString()
    if opset is not None:
        try:
            schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        except Exception:
            return attrs
        for name, spec in schema.attributes.items():
            if name not in attrs and spec.default_value.type:
                d = onnx.AttributeProto()
                d.CopyFrom(spec.default_value)
                d.name = name
                attrs[name] = d.SerializeToString()
    return attrs


def _same_node(a: onnx.NodeProto, ma: onnx.ModelProto, b: onnx.NodeProto, mb) -> bool:
    if (a.op_type, a.domain, list(a.input), list(a.output)) != (
        b.op_type,
        b.domain,
        list(b.input),
        list(b.output),
    ):
        return False
    return _attributes(a, _opset(ma, a.domain)) == _attributes(b, _opset(mb, b.domain))


@dataclass
class GraphMap:
    """How an optimized graph relates to its original (see :func:`map_onto_original`)."""

    nodes: list[OptimizedNode]
    internal: dict[str, str]  # original value -> optimized node it is internal to
    folded: dict[str, str]  # original node -> initializer now holding its output
    removed: list[str]  # original nodes no longer computed
    renamed: dict[str, str]  # original value -> optimized value computing it anew


def map_onto_original(original: onnx.ModelProto, optimized: onnx.ModelProto) -> GraphMap:
    """For each optimized node, the original nodes it stands for.

    An optimized node stands for the original nodes that computed its outputs from its
    inputs: walking the original graph back from the producers of its outputs, through
    values that no longer exist in the optimized graph, until its own inputs (or any
    value still computed, stored or fed).  A node that keeps an original node's name and
    op but writes new values (a float16 node onnxruntime runs in float32 between Casts)
    is that node, its values renamed.  New nodes wired to a mapped node through new
    values (the Transposes around an NHWC kernel, a bias DequantizeLinear, precision
    Casts) form one group with it, named after the member onnxruntime named after a
    replaced node.
    """
    og, ng = original.graph, optimized.graph
    orig_names = [node_name(n, k) for k, n in enumerate(og.node)]
    names = [node_name(n, j) for j, n in enumerate(ng.node)]
    orig_producer = {o: k for k, n in enumerate(og.node) for o in n.output if o}
    orig_values = set(orig_producer) | {i.name for i in og.input} | {i.name for i in og.initializer}
    new_inits = {i.name for i in ng.initializer}
    new_produced = {o: j for j, n in enumerate(ng.node) for o in n.output if o}
    available = new_inits | {i.name for i in ng.input} | set(new_produced)

    twins, renamed = _twins(og, ng, orig_names, names, orig_values, available)
    back = {new: old for old, new in renamed.items()}
    computed = available | set(renamed)  # original values still computed, maybe renamed
    covering: list[list[int]] = []
    touched: dict[int, int] = {}  # adapter node -> the twin whose original value it writes
    for j, node in enumerate(ng.node):
        if j in twins:
            covering.append([twins[j]])
            continue
        outs = [back.get(o, o) for o in node.output if o]
        ins = {back.get(i, i) for i in node.input if i}
        stop = (computed - set(outs)) | ins
        ks, twin = _covered(og, orig_producer, stop, outs, set(twins.values()))
        covering.append(ks)
        if not ks and twin is not None:
            touched[j] = next(t for t, k in twins.items() if k == twin)
    covered = {k for ks in covering for k in ks}

    # groups: a mapped node plus the new nodes wired to it through new values
    group_of: dict[int, int] = {}
    members: dict[int, list[int]] = {}

    def new_inputs(p: int) -> list[str]:
        return [i for i in ng.node[p].input if i and i not in orig_values and i in new_produced]

    for j in range(len(ng.node)):
        if not covering[j] or j in group_of:
            continue
        group = [j]
        stack = new_inputs(j)
        while stack:
            p = new_produced[stack.pop()]
            if covering[p] or p in group_of or p in group:
                continue
            group.append(p)
            stack.extend(new_inputs(p))
        group += [a for a, t in touched.items() if t == j and a not in group_of]
        for p in group:
            group_of[p] = j
        members[j] = group

    nodes = [
        OptimizedNode(names[j], j, node.op_type, node.domain, NODE_INSERTED)
        for j, node in enumerate(ng.node)
    ]
    internal: dict[str, str] = {}
    for j, group in members.items():
        ks = sorted({k for p in group for k in covering[p]})
        replaced = [orig_names[k] for k in ks]
        main = _main_member(group, names, replaced)
        firsts = [orig_producer.get(back.get(o, o)) for o in ng.node[j].output if o]
        origin = orig_names[firsts[0]] if firsts and firsts[0] in ks else replaced[-1]
        hidden = [
            o
            for k in ks
            for o in og.node[k].output
            if o and o not in computed and o not in internal
        ]
        for o in hidden:
            internal[o] = names[main]
        if len(ks) > 1:
            kind = NODE_FUSED
        elif (
            len(group) == 1
            and replaced[0] == names[j]
            and _same_node(og.node[ks[0]], original, ng.node[j], optimized)
        ):
            kind = NODE_UNCHANGED
        else:
            kind = NODE_REWRITTEN
        for p in group:
            nodes[p].group, nodes[p].origin = names[main], origin
        m = nodes[main]
        m.kind, m.replaced, m.internal = kind, replaced, hidden
    for n in nodes:
        if n.group is None:
            n.group = n.name
    _inserted_origins(optimized, nodes)
    folded: dict[str, str] = {}
    removed: list[str] = []
    for k, n in enumerate(og.node):
        if k in covered:
            continue
        stored = [o for o in n.output if o and o in new_inits]
        if stored:
            folded[orig_names[k]] = stored[0]
        else:
            removed.append(orig_names[k])
    return GraphMap(nodes, internal, folded, removed, renamed)


def _twins(og, ng, orig_names, names, orig_values, available):
    """Optimized nodes that keep an original node's name and op but write new values.

    Returns ({optimized index: original index}, {original value: new value}); the
    renames come from the twins' outputs, and from their inputs where an original value
    that no longer exists is fed under a new name.
    """
    by_name = {name: k for k, name in enumerate(orig_names)}
    twins: dict[int, int] = {}
    renamed: dict[str, str] = {}
    for j, node in enumerate(ng.node):
        k = by_name.get(names[j])
        if k is None:
            continue
        orig = og.node[k]
        if (orig.op_type, orig.domain, len(orig.output)) != (
            node.op_type,
            node.domain,
            len(node.output),
        ):
            continue
        if any(o in orig_values for o in node.output if o):
            continue  # it keeps its names: an ordinary node
        twins[j] = k
        for a, b in zip(orig.output, node.output):
            if a and b and a not in available:
                renamed[a] = b
    for j, k in twins.items():
        for a, b in zip(og.node[k].input, ng.node[j].input):
            if a and b and a != b and a not in available and b not in orig_values:
                renamed.setdefault(a, b)
    return twins, renamed


def _covered(og, orig_producer, stop, outputs, twin_owned) -> tuple[list[int], int | None]:
    """Original nodes between a node's inputs (``stop``) and its ``outputs``.

    Also returns an original node the walk reached that a twin already stands for.
    """
    stack = [orig_producer[o] for o in outputs if o in orig_producer]
    seen: set[int] = set()
    twin = None
    while stack:
        k = stack.pop()
        if k in seen:
            continue
        if k in twin_owned:
            twin = k
            continue
        seen.add(k)
        for v in og.node[k].input:
            if v and v not in stop and v in orig_producer:
                stack.append(orig_producer[v])
    return sorted(seen), twin


def _main_member(group: list[int], names: list[str], replaced: list[str]) -> int:
    """The member onnxruntime named after a replaced node (it names new nodes so)."""
    best, best_len = group[0], -1
    for p in group:
        for r in replaced:
            if r in names[p] and len(r) > best_len:
                best, best_len = p, len(r)
    return best


def _inserted_origins(optimized: onnx.ModelProto, nodes: list[OptimizedNode]) -> None:
    """A new node in no group takes the origin of the nearest mapped node it feeds
    (else of the nearest one feeding it), so it carries an fx node too."""
    g = optimized.graph
    consumers: dict[str, list[int]] = {}
    producer: dict[str, int] = {}
    for j, n in enumerate(g.node):
        for i in n.input:
            consumers.setdefault(i, []).append(j)
        for o in n.output:
            if o:
                producer[o] = j

    def search(start: int, step) -> str | None:
        frontier, seen = [start], {start}
        while frontier:
            nxt = []
            for j in frontier:
                for k in step(j):
                    if k in seen:
                        continue
                    seen.add(k)
                    if nodes[k].origin is not None:
                        return nodes[k].origin
                    nxt.append(k)
            frontier = nxt
        return None

    def downstream(j: int) -> list[int]:
        return [k for o in g.node[j].output for k in consumers.get(o, ())]

    def upstream(j: int) -> list[int]:
        return [producer[i] for i in g.node[j].input if i in producer]

    for j, n in enumerate(nodes):
        if n.origin is None:
            n.origin = search(j, downstream) or search(j, upstream)


def carry_metadata(
    original: onnx.ModelProto, optimized: onnx.ModelProto, nodes: list[OptimizedNode]
) -> None:
    """Gives each optimized node the metadata of its origin, plus what it replaced."""
    og, ng = original.graph, optimized.graph
    by_name = {node_name(n, k): n for k, n in enumerate(og.node)}
    for mapped, node in zip(nodes, ng.node):
        if not node.metadata_props and mapped.origin in by_name:
            for p in by_name[mapped.origin].metadata_props:
                node.metadata_props.add(key=p.key, value=p.value)
        if mapped.kind != NODE_UNCHANGED:
            _set_meta(node, META_KIND, mapped.kind)
            if mapped.replaced:
                _set_meta(node, META_REPLACED, json.dumps(mapped.replaced))
            if mapped.internal:
                _set_meta(node, META_INTERNAL, json.dumps(mapped.internal))
            if mapped.group != mapped.name:
                _set_meta(node, META_GROUP, mapped.group)
    inits = {i.name: i for i in og.initializer}
    producer = {o: n for n in og.node for o in n.output if o}
    for init in ng.initializer:
        if init.metadata_props:
            continue
        src = inits.get(init.name)
        if src is not None:
            for p in src.metadata_props:
                init.metadata_props.add(key=p.key, value=p.value)
        elif init.name in producer:
            # a folded constant: the fx node it was computed for
            for p in producer[init.name].metadata_props:
                if p.key == FX_NODE_KEY:
                    init.metadata_props.add(key=p.key, value=p.value)
    if not optimized.metadata_props:
        for p in original.metadata_props:
            optimized.metadata_props.add(key=p.key, value=p.value)


def _set_meta(node: onnx.NodeProto, key: str, value: str) -> None:
    for p in node.metadata_props:
        if p.key == key:
            p.value = value
            return
    node.metadata_props.add(key=key, value=value)


def drop_stale_value_info(model: onnx.ModelProto) -> None:
    """onnxruntime keeps the value_info of values it removed; they describe nothing."""
    g = model.graph
    live = {i.name for i in g.input} | {i.name for i in g.initializer}
    for n in g.node:
        live.update(n.input)
        live.update(n.output)
    kept = [vi for vi in g.value_info if vi.name in live]
    del g.value_info[:]
    g.value_info.extend(kept)


__all__ = [
    "META_GROUP",
    "META_INTERNAL",
    "META_KIND",
    "META_REPLACED",
    "NODE_FUSED",
    "NODE_INSERTED",
    "NODE_REWRITTEN",
    "NODE_UNCHANGED",
    "GraphMap",
    "OptimizedNode",
    "carry_metadata",
    "drop_stale_value_info",
    "map_onto_original",
    "node_name",
]
