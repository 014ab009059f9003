"""Cut a self-contained ONNX model out of a bigger one, around one node.

Used by replay bundles: the sub-model computes one node's outputs from the nearest values
that have a torch partner, so the discrepancy can be reproduced without the whole model.
Initializers stay initializers (with their data, external data loaded), model-local
functions used by the kept nodes come along, and so do the opset imports.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence

import onnx
from onnx import external_data_helper, helper

Shape = Sequence[int | str | None]
ValueShapes = Mapping[str, tuple[int, Shape | None]]


def find_node(model: onnx.ModelProto, node_name: str) -> tuple[int, onnx.NodeProto]:
    """Position and node of ``node_name`` in the main graph (clear error when missing)."""
    for i, node in enumerate(model.graph.node):
        if node.name == node_name:
            return i, node
    # A value name is accepted too: the node producing it.
    for i, node in enumerate(model.graph.node):
        if node_name and node_name in node.output:
            return i, node
    raise ValueError(
        f"no node named {node_name!r} in the ONNX model (nor a node producing a value of "
        f"that name); node names look like {[n.name for n in model.graph.node[:3]]}"
    )


def _subgraph_outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a subgraph (If/Loop/Scan body) reads from the enclosing scope."""
    defined = {i.name for i in graph.input} | {i.name for i in graph.initializer}
    defined |= {i.name for i in graph.sparse_initializer}
    used: set[str] = set()
    for node in graph.node:
        for name in node_input_names(node):
            if name and name not in defined:
                used.add(name)
        defined.update(o for o in node.output if o)
    return used - defined


def node_input_names(node: onnx.NodeProto) -> list[str]:
    """Explicit inputs, then the outer-scope names its subgraph attributes read."""
    names = [n for n in node.input if n]
    for att in node.attribute:
        graphs: Iterable[onnx.GraphProto] = ()
        if att.type == onnx.AttributeProto.GRAPH:
            graphs = (att.g,)
        elif att.type == onnx.AttributeProto.GRAPHS:
            graphs = att.graphs
        for g in graphs:
            for name in sorted(_subgraph_outer_names(g)):
                if name not in names:
                    names.append(name)
    return names


class _GraphIndex:
    def __init__(self, model: onnx.ModelProto) -> None:
        g = model.graph
        self.model = model
        self._inferred = False
        self.producer: dict[str, int] = {}
        for i, node in enumerate(g.node):
            for out in node.output:
                if out:
                    self.producer[out] = i
        self.initializers = {t.name: t for t in g.initializer}
        self.sparse_initializers = {t.name: t for t in g.sparse_initializer}
        self.graph_inputs = [i.name for i in g.input]
        self.value_info: dict[str, onnx.ValueInfoProto] = {}
        for vi in (*g.input, *g.value_info, *g.output):
            self.value_info.setdefault(vi.name, vi)

    def typed_value_info(self, name: str) -> onnx.ValueInfoProto | None:
        """A copy of the value's ValueInfo when its type is known (shape inference once)."""
        vi = self.value_info.get(name)
        if (vi is None or not vi.type.WhichOneof("value")) and not self._inferred:
            self._inferred = True
            try:
                inferred = onnx.shape_inference.infer_shapes(self.model)
            except Exception:  # inference is a convenience: a clear error follows if needed
                inferred = None
            if inferred is not None:
                for v in (*inferred.graph.value_info, *inferred.graph.output):
                    if v.type.WhichOneof("value"):
                        self.value_info.setdefault(v.name, v)
                        if not self.value_info[v.name].type.WhichOneof("value"):
                            self.value_info[v.name] = v
            vi = self.value_info.get(name)
        if vi is None or not vi.type.WhichOneof("value"):
            return None
        copy = onnx.ValueInfoProto()
        copy.CopyFrom(vi)
        return copy

    def is_constant(self, name: str) -> bool:
        return name in self.initializers or name in self.sparse_initializers


def submodel_inputs(
    model: onnx.ModelProto, node_name: str, is_available: Callable[[str], bool]
) -> list[str]:
    """Inputs of the sub-model around ``node_name``.

    Walking back from the node's inputs, the nearest values for which
    ``is_available(name)`` is true (values with a torch partner) or graph inputs.
    Initializers are never returned: they stay initializers of the sub-model, so a
    corrupted weight is still inside the reproduction.  The order is the order of first
    encounter, starting with the node's own inputs.
    """
    index = _GraphIndex(model)
    _, node = find_node(model, node_name)
    result: list[str] = []
    seen: set[str] = set()
    stack = list(reversed(node_input_names(node)))
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if index.is_constant(name):
            continue
        if is_available(name) or name in index.graph_inputs or name not in index.producer:
            # a name nobody produces and no graph input is left to the caller's feeds
            result.append(name)
            continue
        producer = model.graph.node[index.producer[name]]
        stack.extend(reversed(node_input_names(producer)))
    return result


def _kept_nodes(
    model: onnx.ModelProto, index: _GraphIndex, target: onnx.NodeProto, inputs: set[str]
) -> list[int]:
    kept: set[int] = set()
    stack = list(node_input_names(target))
    seen: set[str] = set()
    missing: list[str] = []
    while stack:
        name = stack.pop()
        if name in seen or name in inputs or index.is_constant(name):
            continue
        seen.add(name)
        if name not in index.producer:
            missing.append(name)
            continue
        i = index.producer[name]
        if i not in kept:
            kept.add(i)
            stack.extend(node_input_names(model.graph.node[i]))
    if missing:
        raise ValueError(
            f"node {target.name!r} depends on {sorted(missing)} which are neither inputs of the "
            "sub-model nor produced by a node nor initializers; add them to input_names"
        )
    return sorted(kept)


def _used_functions(
    model: onnx.ModelProto, nodes: Iterable[onnx.NodeProto]
) -> list[onnx.FunctionProto]:
    """Model-local functions the nodes call, transitively, in the model's order."""
    funcs = {(f.domain, f.name, getattr(f, "overload", "")): f for f in model.functions}
    needed: set[tuple[str, str, str]] = set()

    def visit(node_list: Iterable[onnx.NodeProto]) -> None:
        for node in node_list:
            key = (node.domain, node.op_type, getattr(node, "overload", ""))
            if key in funcs and key not in needed:
                needed.add(key)
                visit(funcs[key].node)
            for att in node.attribute:
                if att.type == onnx.AttributeProto.GRAPH:
                    visit(att.g.node)
                elif att.type == onnx.AttributeProto.GRAPHS:
                    for g in att.graphs:
                        visit(g.node)

    visit(nodes)
    return [f for key, f in funcs.items() if key in needed]


def _value_info(
    name: str, index: _GraphIndex, value_shapes: ValueShapes | None
) -> onnx.ValueInfoProto:
    if value_shapes and name in value_shapes:
        elem_type, shape = value_shapes[name]
        return helper.make_tensor_value_info(
            name, int(elem_type), None if shape is None else list(shape)
        )
    vi = index.typed_value_info(name)
    if vi is not None:
        return vi
    raise ValueError(
        f"the type of {name!r} is unknown: give it in value_shapes as (onnx elem_type, shape), "
        "or run onnx.shape_inference.infer_shapes on the model first"
    )


def _inline_tensor(tensor: onnx.TensorProto, base_dir: str | None) -> onnx.TensorProto:
    """A copy with its external data loaded, so the sub-model has no dangling reference."""
    out = onnx.TensorProto()
    out.CopyFrom(tensor)
    if external_data_helper.uses_external_data(out):
        if base_dir is None:
            raise ValueError(
                f"initializer {tensor.name!r} stores its data in an external file; give base_dir "
                "(the folder of the .onnx file) or load the model with its external data"
            )
        external_data_helper.load_external_data_for_tensor(out, base_dir)
        del out.external_data[:]
        out.data_location = onnx.TensorProto.DEFAULT
    return out


def _inline_attribute_tensors(node: onnx.NodeProto, base_dir: str | None) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    for att in out.attribute:
        if att.type == onnx.AttributeProto.TENSOR and external_data_helper.uses_external_data(
            att.t
        ):
            att.t.CopyFrom(_inline_tensor(att.t, base_dir))
    return out


def extract_submodel(
    model: onnx.ModelProto,
    node_name: str,
    input_names: Sequence[str],
    value_shapes: ValueShapes | None = None,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    check: bool = True,
) -> onnx.ModelProto:
    """A self-contained model computing ``node_name``'s outputs from ``input_names``.

    ``value_shapes`` maps value names to ``(onnx elem_type, shape)`` (the real shapes seen
    during the run); names it lacks take the model's own value_info.  The model keeps the
    opset imports, the model-local functions the kept nodes use (transitively) and the
    initializers they read, with external data loaded from ``base_dir``.
    """
    index = _GraphIndex(model)
    _, target = find_node(model, node_name)
    inputs = list(dict.fromkeys(input_names))
    bad = [n for n in inputs if index.is_constant(n)]
    if bad:
        raise ValueError(f"{bad} are initializers: they stay initializers, not sub-model inputs")
    kept = _kept_nodes(model, index, target, set(inputs))
    target_pos = index.producer[next(o for o in target.output if o)]
    kept = sorted({*kept, target_pos})
    bdir = None if base_dir is None else os.fspath(base_dir)
    nodes = [_inline_attribute_tensors(model.graph.node[i], bdir) for i in kept]

    used: set[str] = set()
    for node in nodes:
        used.update(node_input_names(node))
    initializers = [
        _inline_tensor(index.initializers[n], bdir) for n in index.initializers if n in used
    ]
    sparse = []
    for name, sp in index.sparse_initializers.items():
        if name in used:
            copy = onnx.SparseTensorProto()
            copy.CopyFrom(sp)
            sparse.append(copy)

    outputs = [o for o in target.output if o]
    graph = helper.make_graph(
        nodes,
        f"sub_{target.name or outputs[0]}",
        [_value_info(n, index, value_shapes) for n in inputs],
        [_value_info(n, index, value_shapes) for n in outputs],
        initializer=initializers,
        sparse_initializer=sparse,
    )
    # intermediate types help runtimes and readers; take what the model or run knows
    for node in nodes:
        for out in node.output:
            if out and out not in outputs:
                try:
                    graph.value_info.append(_value_info(out, index, value_shapes))
                except ValueError:
                    pass
    sub = helper.make_model(
        graph,
        opset_imports=list(model.opset_import),
        functions=_used_functions(model, nodes),
        ir_version=model.ir_version,
        producer_name="onnx_sbs_nb.submodel",
    )
    if check:
        onnx.checker.check_model(sub, full_check=False)
    return sub


def prefix_model(
    model: onnx.ModelProto,
    node_name: str,
    *,
    base_dir: str | os.PathLike[str] | None = None,
    value_shapes: ValueShapes | None = None,
) -> onnx.ModelProto:
    """The part of the model from its original inputs to ``node_name``'s outputs.

    Only the graph inputs that part reads are kept as inputs.
    """
    inputs = submodel_inputs(model, node_name, lambda _name: False)
    graph_inputs = {i.name for i in model.graph.input}
    unknown = [n for n in inputs if n not in graph_inputs]
    if unknown:
        raise ValueError(f"{unknown} are read by the model but produced by nothing")
    ordered = [i.name for i in model.graph.input if i.name in set(inputs)]
    return extract_submodel(model, node_name, ordered, value_shapes, base_dir=base_dir)


__all__ = [
    "extract_submodel",
    "find_node",
    "node_input_names",
    "prefix_model",
    "submodel_inputs",
]
