"""Fault injectors: one change to a copy of an ONNX model, at a chosen depth.

Three kinds (issue 10): a weight (an initializer's values), an attribute (a node
attribute: Conv pads, Softmax axis, LayerNormalization epsilon, Resize mode, ...), a
swapped op (Add->Sub, Relu->Sigmoid, ...).  The node is chosen by depth (its position in
the graph: shallow, middle, deep), among the nodes a kind can change; a fault counts only
when the faulted model's whole-model onnxruntime output differs from the faithful one
beyond tolerance (a weight no input reaches is not a fault), else the next candidate at
that depth is tried.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

DEPTHS = {"shallow": 0.15, "middle": 0.5, "deep": 0.85}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
               onnx.TensorProto.BFLOAT16}  # fmt: skip


@dataclass
class Fault:
    kind: str  # "weight" | "attribute" | "op"
    depth: str  # "shallow" | "middle" | "deep"
    target: str  # the ONNX node name, or the initializer name for a weight
    op_type: str  # op of the node (the first consumer's op for a weight)
    position: int  # index of the node (first consumer for a weight) in the graph
    what: str  # human-readable description of the change
    apply: Callable[[onnx.ModelProto], onnx.ModelProto]

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.depth}"


def copy_model(model: onnx.ModelProto) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    return m


def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def change_initializer(name: str, fn: Callable[[np.ndarray], np.ndarray]):
    def apply(model: onnx.ModelProto) -> onnx.ModelProto:
        m = copy_model(model)
        for t in m.graph.initializer:
            if t.name == name:
                new = numpy_helper.from_array(fn(numpy_helper.to_array(t).copy()), name)
                new.metadata_props.extend(t.metadata_props)
                t.CopyFrom(new)
                return m
        raise KeyError(name)

    return apply


def set_attribute(node_name: str, key: str, value):
    def apply(model: onnx.ModelProto) -> onnx.ModelProto:
        m = copy_model(model)
        node = _node(m, node_name)
        kept = [a for a in node.attribute if a.name != key]
        del node.attribute[:]
        node.attribute.extend([*kept, helper.make_attribute(key, value)])
        return m

    return apply


def swap_op(node_name: str, new_op: str):
    """Replaces the node's op; attributes the new op does not know are dropped."""

    def apply(model: onnx.ModelProto) -> onnx.ModelProto:
        m = copy_model(model)
        node = _node(m, node_name)
        opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 18)
        known = set(onnx.defs.get_schema(new_op, opset).attributes)
        kept = [a for a in node.attribute if a.name in known]
        del node.attribute[:]
        node.attribute.extend(kept)
        node.op_type = new_op
        return m

    return apply


# --------------------------------------------------------------------------- candidates

SWAPS = {
    "Add": "Sub", "Sub": "Add", "Mul": "Add", "Div": "Mul", "Relu": "Sigmoid",
    "Sigmoid": "Tanh", "Tanh": "Sigmoid", "Softmax": "LogSoftmax", "LogSoftmax": "Softmax",
    "Erf": "Tanh", "Sin": "Cos", "Cos": "Sin", "Max": "Min", "Min": "Max",
    "ReduceMean": "ReduceMax", "ReduceMax": "ReduceMin", "ReduceSum": "ReduceMax",
    "Sqrt": "Abs", "Reciprocal": "Sqrt", "Softplus": "Relu", "HardSwish": "HardSigmoid",
    "Elu": "Relu", "Exp": "Sigmoid", "Neg": "Abs", "Abs": "Neg", "Pow": "Mul",
    "Gelu": "Relu", "Log": "Abs", "LeakyRelu": "Elu",
}  # fmt: skip


def _attr(node: onnx.NodeProto, key: str, default=None):
    for a in node.attribute:
        if a.name == key:
            return helper.get_attribute_value(a)
    return default


def _attribute_changes(node: onnx.NodeProto) -> Iterator[tuple[str, object, str]]:
    """(attribute, new value, description) of changes that keep the output shape."""
    op = node.op_type
    if op in ("Conv", "ConvTranspose"):
        pads = list(_attr(node, "pads", []) or [])
        half = len(pads) // 2
        for i in range(half):
            if pads[i] > 0:
                new = list(pads)
                if pads[i + half] > 0:
                    new[i], new[i + half] = pads[i] + 1, pads[i + half] - 1
                else:
                    new[i], new[i + half] = pads[i] - 1, pads[i + half] + 1
                yield "pads", new, f"pads {pads} -> {new}"
                break
    elif op in ("Softmax", "LogSoftmax"):
        axis = _attr(node, "axis", -1)
        new = -2 if axis in (-1,) else -1
        yield "axis", new, f"axis {axis} -> {new}"
    elif op in (
        "LayerNormalization", "GroupNormalization", "InstanceNormalization",
        "BatchNormalization", "SkipLayerNormalization", "RMSNormalization",
    ):  # fmt: skip
        eps = _attr(node, "epsilon", 1e-5)
        yield "epsilon", 1.0, f"epsilon {eps:g} -> 1.0"
    elif op == "Resize":
        mode = _attr(node, "mode", b"nearest")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        new = "linear" if mode == "nearest" else "nearest"
        yield "mode", new, f"mode {mode} -> {new}"
    elif op == "Gemm":
        yield "alpha", 1.5, f"alpha {_attr(node, 'alpha', 1.0):g} -> 1.5"
    elif op == "TopK":
        largest = _attr(node, "largest", 1)
        yield "largest", 1 - largest, f"largest {largest} -> {1 - largest}"
    elif op == "CumSum":
        rev = _attr(node, "reverse", 0)
        yield "reverse", 1 - rev, f"reverse {rev} -> {1 - rev}"
    elif op in ("LeakyRelu", "Elu", "HardSigmoid", "Selu", "Celu"):
        alpha = _attr(node, "alpha", 0.01)
        yield "alpha", float(alpha) * 2 + 0.3, f"alpha {alpha:g} -> {float(alpha) * 2 + 0.3:g}"
    elif op == "GRU":
        lbr = _attr(node, "linear_before_reset", 0)
        yield "linear_before_reset", 1 - lbr, f"linear_before_reset {lbr} -> {1 - lbr}"
    elif op == "LSTM":
        yield "clip", 0.05, "clip none -> 0.05"
    elif op == "Trilu":
        up = _attr(node, "upper", 1)
        yield "upper", 1 - up, f"upper {up} -> {1 - up}"
    elif op in ("ScatterElements", "ScatterND"):
        red = _attr(node, "reduction", b"none")
        red = red.decode() if isinstance(red, bytes) else red
        new = "mul" if red == "add" else "add"
        yield "reduction", new, f"reduction {red} -> {new}"
    elif op == "DepthToSpace":
        mode = _attr(node, "mode", b"DCR")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        new = "CRD" if mode == "DCR" else "DCR"
        yield "mode", new, f"mode {mode} -> {new}"
    elif op in ("AveragePool",):
        cip = _attr(node, "count_include_pad", 0)
        yield "count_include_pad", 1 - cip, f"count_include_pad {cip} -> {1 - cip}"
    elif op == "Einsum":
        eq = _attr(node, "equation", b"")
        eq = eq.decode() if isinstance(eq, bytes) else eq
        lhs, _, rhs = eq.partition("->")
        terms = lhs.split(",")
        if len(terms) == 2 and len(terms[1]) >= 2:
            t = terms[1]
            new_eq = f"{terms[0]},{t[:-2]}{t[-1]}{t[-2]}->{rhs}"
            yield "equation", new_eq, f"equation {eq} -> {new_eq}"


def _float_values(model: onnx.ModelProto) -> set[str]:
    g = model.graph
    out = set()
    for vi in [*g.value_info, *g.output, *g.input]:
        if vi.type.tensor_type.elem_type in FLOAT_TYPES:
            out.add(vi.name)
    return out


def _by_depth(items: list, position: Callable, n: int, depth: str) -> list:
    target = DEPTHS[depth] * max(n - 1, 1)
    return sorted(items, key=lambda it: (abs(position(it) - target), position(it)))


def candidates(
    model: onnx.ModelProto, kind: str, depth: str, prefer_ops: tuple[str, ...] = ()
) -> Iterator[Fault]:
    """Faults of one kind, nearest the depth first (preferred ops first for attributes)."""
    nodes = list(model.graph.node)
    n = len(nodes)
    floats = _float_values(model)
    if kind == "weight":
        first_use: dict[str, int] = {}
        for i, node in enumerate(nodes):
            for inp in node.input:
                first_use.setdefault(inp, i)
        inits = [
            t
            for t in model.graph.initializer
            if t.data_type in FLOAT_TYPES
            and int(np.prod(t.dims)) > 1
            and t.name in first_use
            and nodes[first_use[t.name]].op_type not in ("Shape", "Cast", "ConstantOfShape")
        ]
        for t in _by_depth(inits, lambda t: first_use[t.name], n, depth):
            pos = first_use[t.name]
            yield Fault(
                "weight",
                depth,
                t.name,
                nodes[pos].op_type,
                pos,
                f"initializer {t.name} x1.5 + 0.1 (consumed by {nodes[pos].name})",
                change_initializer(t.name, lambda a: (a * 1.5 + 0.1).astype(a.dtype)),
            )
    elif kind == "attribute":
        changeable = [(i, nd) for i, nd in enumerate(nodes) if any(_attribute_changes(nd))]
        preferred = [it for it in changeable if it[1].op_type in prefer_ops]
        others = [it for it in changeable if it[1].op_type not in prefer_ops]
        for group in (preferred, others):
            for i, nd in _by_depth(group, lambda it: it[0], n, depth):
                for key, value, what in _attribute_changes(nd):
                    yield Fault(
                        "attribute",
                        depth,
                        nd.name,
                        nd.op_type,
                        i,
                        f"{nd.name} ({nd.op_type}) {what}",
                        set_attribute(nd.name, key, value),
                    )
    elif kind == "op":
        swappable = [
            (i, nd)
            for i, nd in enumerate(nodes)
            if nd.op_type in SWAPS and nd.domain in ("", "ai.onnx") and nd.output[0] in floats
        ]
        for i, nd in _by_depth(swappable, lambda it: it[0], n, depth):
            new = SWAPS[nd.op_type]
            yield Fault("op", depth, nd.name, nd.op_type, i, f"{nd.name}: {nd.op_type} -> {new}",
                        swap_op(nd.name, new))  # fmt: skip
    else:
        raise ValueError(kind)


# --------------------------------------------------------------------------- validity


def _float_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """The model with its bfloat16 inputs and outputs cast from and to float32: numpy (and
    so onnxruntime's run) has no bfloat16."""
    bf16 = onnx.TensorProto.BFLOAT16
    g = model.graph
    if not any(v.type.tensor_type.elem_type == bf16 for v in [*g.input, *g.output]):
        return model
    m = copy_model(model)
    g = m.graph
    head, tail = [], []
    for v in g.input:
        if v.type.tensor_type.elem_type == bf16:
            inner = f"{v.name}__bf16"
            for node in g.node:
                node.input[:] = [inner if i == v.name else i for i in node.input]
            for out in g.output:
                if out.name == v.name:
                    raise ValueError("a bfloat16 input that is also an output")
            head.append(helper.make_node("Cast", [v.name], [inner], to=bf16))
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    for v in g.output:
        if v.type.tensor_type.elem_type == bf16:
            inner = f"{v.name}__bf16"
            for node in g.node:
                node.output[:] = [inner if o == v.name else o for o in node.output]
                node.input[:] = [inner if i == v.name else i for i in node.input]
            tail.append(helper.make_node("Cast", [inner], [v.name], to=onnx.TensorProto.FLOAT))
            v.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    nodes = [*head, *g.node, *tail]
    del g.node[:]
    g.node.extend(nodes)
    return m


def ort_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray] | None:
    """Whole-model onnxruntime outputs, or None when onnxruntime rejects the model
    (bfloat16 inputs and outputs are fed and returned as float32).  A model onnxruntime
    has no kernel for (bfloat16 MatMul on CPU) runs in the ONNX reference evaluator."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4
    model = _float_io(model)
    try:
        sess = ort.InferenceSession(
            model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
    except Exception as e:
        if "NOT_IMPLEMENTED" not in str(e):
            return None
        return _reference_outputs(model, feeds)
    try:
        return sess.run(None, feeds)
    except Exception:
        return None


def _reference_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]):
    from onnx.reference import ReferenceEvaluator

    try:
        return [np.asarray(o) for o in ReferenceEvaluator(model).run(None, feeds)]
    except Exception:
        return None


# relative to the output's scale; bfloat16 (an ml_dtypes type, not np.floating) keeps
# 8 bits of mantissa: a difference of a few of its steps is rounding, not a fault
_OUTPUT_TOLERANCES = {"float16": 1e-2, "bfloat16": 5e-2}


def outputs_differ(
    expected: list[np.ndarray], got: list[np.ndarray], declared: list[str] | None = None
) -> bool:
    """Beyond tolerance: 1e-3 relative to the output's scale (1e-2 in float16, 5e-2 in
    bfloat16).  ``declared``: the outputs' element types in the model, when they come
    back in another one (bfloat16 outputs are returned as float32)."""
    for k, (a, b) in enumerate(zip(expected, got)):
        kind = declared[k] if declared and k < len(declared) else a.dtype.name
        if a.shape != b.shape or a.dtype != b.dtype:
            return True
        if not (np.issubdtype(a.dtype, np.floating) or a.dtype.name in _OUTPUT_TOLERANCES):
            if not np.array_equal(a, b):
                return True
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        if np.isnan(a64).sum() != np.isnan(b64).sum():
            return True
        tol = _OUTPUT_TOLERANCES.get(kind, 1e-3) * max(1.0, float(np.nanmax(np.abs(a64))))
        if np.nanmax(np.abs(a64 - b64)) > tol:
            return True
    return False


def pick_fault(
    model: onnx.ModelProto,
    feeds: dict[str, np.ndarray],
    kind: str,
    depth: str,
    prefer_ops: tuple[str, ...] = (),
    reference: list[np.ndarray] | None = None,
    tries: int = 40,
) -> tuple[Fault, onnx.ModelProto] | None:
    """The first candidate whose fault changes the whole-model output beyond tolerance."""
    reference = reference if reference is not None else ort_outputs(model, feeds)
    declared = [
        onnx.TensorProto.DataType.Name(o.type.tensor_type.elem_type).lower()
        for o in model.graph.output
    ]
    for k, fault in enumerate(candidates(model, kind, depth, prefer_ops)):
        if k >= tries:
            break
        bad = fault.apply(model)
        got = ort_outputs(bad, feeds)
        if got is not None and outputs_differ(reference, got, declared):
            return fault, bad
    return None
