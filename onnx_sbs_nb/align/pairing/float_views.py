"""Float views of a quantized model's integer values: nodes added to the candidate that
dequantize them with the model's own scales and zero points, so they pair with the float
torch values they stand for.

Some quantized values have no float twin in the model: ``quantize_dynamic`` multiplies by
an integer weight (``MatMulInteger`` / ``ConvInteger``) whose scale only meets the
product (``Mul(Cast(MatMulInteger(...)), Mul(x_scale, w_scale))``), ``DynamicQuantizeLinear``
hands on an integer activation, and ``MatMulNBits`` (weight-only int2/4/8) reads a packed
blocked weight.  Without a float twin a wrong weight scale, zero point or packing is only
seen in the node's float output, mixed with the activation's rounding.  The views:

- a ``MatMulInteger`` / ``ConvInteger`` integer weight: ``DequantizeLinear(w, w_scale,
  w_zero_point)``, per tensor or per channel (``axis``: the last axis of a MatMul's
  ``[K, N]``, the first of a Conv's ``[M, C, ...]``), the weight's scale read off the
  ``Mul`` of the two scales that multiplies the node's output;
- a ``DynamicQuantizeLinear(x) -> (y, y_scale, y_zero_point)``: ``DequantizeLinear`` of
  the three, the activation as the next node computes on it;
- a ``MatMulNBits`` weight: the same ``MatMulNBits`` (same packed weight, scales, zero
  points, group indices and attributes) applied to the identity ``[K, K]``: onnxruntime's
  own dequantization, the weight as ``[K, N]``.

Each view is a node of the candidate (it runs, is judged, and named when it fails: a
doubled scale fails at the weight's view) that no other node reads; its node carries the
metadata :data:`FLOAT_VIEW` (what it views), is named ``<node>/<kind>_float_view`` after
the node whose value it views, and its output ``<value>_float_view``.
:class:`.quantized.ThroughQuantization` pairs the views.
"""

from __future__ import annotations

import onnx
import onnx.helper as oh

#: metadata key on a view node: ``weight``, ``activation`` or ``helper``
FLOAT_VIEW = "onnx_sbs_nb.float_view"
VIEW_WEIGHT = "weight"
VIEW_ACTIVATION = "activation"
VIEW_HELPER = "helper"  # a node a view reads (the identity of a MatMulNBits view)
_SUFFIX = "_float_view"
_INTEGER_PRODUCTS = ("MatMulInteger", "ConvInteger")


def view_name(value: str) -> str:
    return f"{value}{_SUFFIX}"


def view_kind(node: onnx.NodeProto) -> str | None:
    """``weight``, ``activation``, ``helper`` or None (not a view)."""
    for p in node.metadata_props:
        if p.key == FLOAT_VIEW:
            return p.value
    return None


def with_float_views(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when it has nothing to view, else a copy with the views added
    (module docstring); the user's model is never changed."""
    g = model.graph
    if not any(
        n.op_type in (*_INTEGER_PRODUCTS, "DynamicQuantizeLinear", "MatMulNBits") for n in g.node
    ):
        return model
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    inits = {i.name: i for i in g.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    producer: dict[str, onnx.NodeProto] = {}
    for node in g.node:
        for i in node.input:
            if i:
                consumers.setdefault(i, []).append(node)
        for o in node.output:
            if o:
                producer[o] = node
    taken = {o for n in g.node for o in n.output} | set(inits)
    before: dict[int, list[onnx.NodeProto]] = {}  # node index -> views to add before it
    after: dict[int, list[onnx.NodeProto]] = {}
    infos: list[onnx.ValueInfoProto] = []
    extra_inits: list[onnx.TensorProto] = []
    for k, node in enumerate(g.node):
        if node.op_type in _INTEGER_PRODUCTS:
            made = _integer_weight_view(node, inits, consumers, producer, opset, taken)
            if made:
                before.setdefault(k, []).append(made[0])
                infos.append(made[1])
        elif node.op_type == "DynamicQuantizeLinear":
            made = _activation_view(node, g, taken)
            if made:
                after.setdefault(k, []).append(made[0])
                infos.append(made[1])
        elif node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            nbits = _nbits_weight_view(node, inits, taken)
            if nbits:
                before.setdefault(k, []).extend(nbits[0])
                infos.append(nbits[1])
                extra_inits.append(nbits[2])
    if not before and not after:
        return model
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = []
    for k, node in enumerate(g.node):
        nodes.extend(before.get(k, ()))
        nodes.append(node)
        nodes.extend(after.get(k, ()))
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    out.graph.value_info.extend(infos)
    out.graph.initializer.extend(extra_inits)
    return out


def _fresh(name: str, taken: set[str]) -> str:
    out, k = name, 0
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    taken.add(out)
    return out


def _view_node(
    op: str, inputs: list[str], output: str, kind: str, of: onnx.NodeProto, **attrs
) -> onnx.NodeProto:
    """A view node, named after the node whose value it views (a culprit names it)."""
    domain = attrs.pop("domain", "")
    what = f"{op}_for_float_view" if kind == VIEW_HELPER else f"{kind}_float_view"
    name = f"{of.name or output}/{what}"
    node = oh.make_node(op, inputs, [output], name=name, domain=domain, **attrs)
    p = node.metadata_props.add()
    p.key, p.value = FLOAT_VIEW, kind
    return node


def _weight_scale(node: onnx.NodeProto, inits: dict, consumers: dict, producer: dict) -> str | None:
    """The scale of an integer product's weight: the initializer among the two scales
    whose product multiplies the node's output cast to float
    (``Mul(Cast(node), Mul(a_scale, w_scale))``, as ``quantize_dynamic`` writes it)."""
    casts = [c for c in consumers.get(node.output[0], []) if c.op_type == "Cast"]
    if len(casts) != 1:
        return None
    for mul in consumers.get(casts[0].output[0], []):
        if mul.op_type != "Mul":
            continue
        other = next((i for i in mul.input if i != casts[0].output[0]), None)
        if other in inits:
            return other
        scales = producer.get(other)
        if scales is None or scales.op_type != "Mul":
            continue
        found = [i for i in scales.input if i in inits]
        if len(found) == 1:
            return found[0]
    return None


def _integer_weight_view(
    node: onnx.NodeProto, inits: dict, consumers: dict, producer: dict, opset: int, taken: set
) -> tuple[onnx.NodeProto, onnx.ValueInfoProto] | None:
    if len(node.input) < 2 or node.input[1] not in inits:
        return None
    w = inits[node.input[1]]
    scale = _weight_scale(node, inits, consumers, producer)
    if scale is None:
        return None
    zp = node.input[3] if len(node.input) > 3 and node.input[3] else ""
    s_dims = list(inits[scale].dims)
    zp_dims = list(inits[zp].dims) if zp in inits else s_dims
    if zp and zp not in inits or zp_dims != s_dims or len(s_dims) > 1:
        return None  # DequantizeLinear wants a scale and zero point of one shape
    dims = list(w.dims)
    attrs = {}
    if s_dims and s_dims[0] != 1:
        # per channel: the output axis (a MatMul's N, a Conv's M); an axis needs opset 13
        axis = len(dims) - 1 if node.op_type == "MatMulInteger" else 0
        if opset < 13 or not dims or dims[axis] != s_dims[0]:
            return None
        attrs["axis"] = axis
    out = _fresh(view_name(w.name), taken)
    inputs = [w.name, scale] + ([zp] if zp else [])
    view = _view_node("DequantizeLinear", inputs, out, VIEW_WEIGHT, node, **attrs)
    return view, oh.make_tensor_value_info(out, inits[scale].data_type, dims)


def _activation_view(
    node: onnx.NodeProto, g: onnx.GraphProto, taken: set
) -> tuple[onnx.NodeProto, onnx.ValueInfoProto] | None:
    if len(node.output) < 3 or not all(node.output[:3]):
        return None
    if any(i.name == node.input[0] for i in g.input):
        return None  # a program input: its view would pair with nothing computed
    shape = None
    for vi in (*g.input, *g.value_info):
        if vi.name == node.input[0] and vi.type.tensor_type.HasField("shape"):
            dims = vi.type.tensor_type.shape.dim
            shape = [d.dim_value if d.HasField("dim_value") else None for d in dims]
    out = _fresh(view_name(node.output[0]), taken)
    view = _view_node("DequantizeLinear", list(node.output[:3]), out, VIEW_ACTIVATION, node)
    return view, oh.make_tensor_value_info(out, onnx.TensorProto.FLOAT, shape)


def _nbits_weight_view(
    node: onnx.NodeProto, inits: dict, taken: set
) -> tuple[list[onnx.NodeProto], onnx.ValueInfoProto, onnx.TensorProto] | None:
    attrs = {a.name: a for a in node.attribute}
    if len(node.input) < 3 or node.input[1] not in inits or "K" not in attrs or "N" not in attrs:
        return None
    k, n = attrs["K"].i, attrs["N"].i
    scales = inits.get(node.input[2])
    if scales is None:
        return None
    elem = scales.data_type  # MatMulNBits' T1: the activation's, the output's type
    w = node.input[1]
    shape_name = _fresh(f"{w}_identity_shape", taken)
    zeros, eye, out = (_fresh(f"{w}_{s}", taken) for s in ("zeros", "identity", "float_view"))
    shape = oh.make_tensor(shape_name, onnx.TensorProto.INT64, [2], [k, k])
    # the identity is made at run time: an initializer of K*K floats would bloat the model
    zero = oh.make_tensor("value", elem, [1], [0])
    nodes = [
        _view_node("ConstantOfShape", [shape_name], zeros, VIEW_HELPER, node, value=zero),
        _view_node("EyeLike", [zeros], eye, VIEW_HELPER, node),
        # inputs after the group indices (a bias) are left out: the weight alone
        _view_node(
            "MatMulNBits",
            [eye, *node.input[1:5]],
            out,
            VIEW_WEIGHT,
            node,
            domain="com.microsoft",
            **{a.name: oh.get_attribute_value(a) for a in node.attribute},
        ),
    ]
    return nodes, oh.make_tensor_value_info(out, elem, [k, n]), shape


__all__ = [
    "FLOAT_VIEW",
    "VIEW_ACTIVATION",
    "VIEW_WEIGHT",
    "view_kind",
    "view_name",
    "with_float_views",
]
