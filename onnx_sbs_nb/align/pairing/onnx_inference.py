"""What ONNX shape inference says of a model without exporter metadata, and which of its
values are constants or sizes (a static program has no twin of them): read by the
structural pairing (:mod:`.foreign`) and the lowerings it infers (:mod:`.lowered_by`)."""

from __future__ import annotations

import onnx
import onnx.numpy_helper

# ONNX ops whose value is a size of their input: a static program has no twin of it
SIZE_OPS = frozenset({"Shape", "Size"})
_LARGE = 4096  # initializers above this many elements are left out of shape inference


def inferred_types(model: onnx.ModelProto) -> dict[str, tuple[int, tuple[int | None, ...]]]:
    """(elem_type, shape) of every value ONNX shape inference finds, run on a copy whose
    large weights are declared inputs (only their type and shape are read); empty when
    inference fails."""
    g = model.graph
    light = onnx.helper.make_graph([], g.name, list(g.input), list(g.output))
    light.node.extend(g.node)
    light.value_info.extend(g.value_info)
    declared = {i.name for i in g.input}
    for init in g.initializer:
        numel = 1
        for d in init.dims:
            numel *= d
        if numel <= _LARGE and not init.HasField("data_location"):
            light.initializer.append(init)
        elif init.name not in declared:
            light.input.append(
                onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            )
    copy = onnx.helper.make_model(light, opset_imports=list(model.opset_import))
    copy.ir_version = model.ir_version
    copy.functions.extend(model.functions)
    _fold_constants(copy)
    try:
        inferred = onnx.shape_inference.infer_shapes(copy, data_prop=True)
    except Exception:  # a model inference cannot read: no shapes, no structural pairs
        return {}
    found: dict[str, tuple[int, tuple[int | None, ...]]] = {}
    ig = inferred.graph
    for vi in (*ig.input, *ig.output, *ig.value_info):
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.elem_type and tt.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
            found[vi.name] = (tt.elem_type, dims)
    for init in g.initializer:
        found[init.name] = (init.data_type, tuple(int(d) for d in init.dims))
    return found


def constant_values(graph: onnx.GraphProto) -> set[str]:
    """Values no graph input computes: weights, constants, sizes and what only they
    make (a static program has no twin of a size or of arithmetic on it)."""
    const = {i.name for i in graph.initializer}
    for n in graph.node:
        ins = [i for i in n.input if i]
        if n.op_type in SIZE_OPS or all(i in const for i in ins):
            const.update(o for o in n.output if o)
    return const


def sizes_to_first_reader(graph: onnx.GraphProto, lowering: list[str | None]) -> list[str | None]:
    """Each node computing only sizes or constants that several lowerings read (a
    chunk's bounds, read by its three Slices) joins the lowering of its first reader:
    a wrong size shows first there, and the node is compared with it."""
    const = constant_values(graph)
    nodes = list(graph.node)
    readers: dict[str, list[int]] = {}
    for k, n in enumerate(nodes):
        for i in n.input:
            readers.setdefault(i, []).append(k)
    out = list(lowering)
    for k in range(len(nodes) - 1, -1, -1):
        outputs = [o for o in nodes[k].output if o]
        if out[k] is not None or not outputs or not all(o in const for o in outputs):
            continue
        firsts = sorted(r for o in outputs for r in readers.get(o, ()) if out[r] is not None)
        if firsts:
            out[k] = out[firsts[0]]
    return out


def _fold_constants(model: onnx.ModelProto) -> None:
    """Replaces the nodes computing from constants alone (a Mod of two Constants, the
    Reshape of it: the bounds of a Slice of a shape) by their values, so shape inference
    follows the sizes they compute; left as they are when evaluation fails."""
    g = model.graph
    known = {i.name for i in g.initializer}
    folded: list[onnx.NodeProto] = []
    for n in g.node:
        ins = [i for i in n.input if i]
        pure = n.domain in ("", "ai.onnx") and not n.op_type.startswith("Random")
        if pure and n.op_type not in SIZE_OPS and all(i in known for i in ins):
            folded.append(n)
            known.update(o for o in n.output if o)
    if not any(n.op_type != "Constant" for n in folded):
        return
    wanted = [o for n in folded for o in n.output if o]
    try:
        from onnx.reference import ReferenceEvaluator

        sub = onnx.helper.make_graph(
            folded,
            "constants",
            [],
            [onnx.helper.make_value_info(o, onnx.TypeProto()) for o in wanted],
            initializer=list(g.initializer),
        )
        sub_model = onnx.helper.make_model(sub, opset_imports=list(model.opset_import))
        values = ReferenceEvaluator(sub_model).run(None, {})
    except Exception:  # an op the reference evaluator lacks: sizes stay unknown
        return
    small = {o: v for o, v in zip(wanted, values) if getattr(v, "size", _LARGE + 1) <= _LARGE}
    keep = [n for n in g.node if not (n in folded and all(o in small for o in n.output if o))]
    del g.node[:]
    g.node.extend(keep)
    for name, value in small.items():
        g.initializer.append(onnx.numpy_helper.from_array(value, name))


__all__ = ["SIZE_OPS", "constant_values", "inferred_types", "sizes_to_first_reader"]
