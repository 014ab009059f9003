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
  own dequantization, the weight as ``[K, N]``; not for a weight whose product with the
  identity costs more than :data:`NBITS_VIEW_MAX_MACS` (a large model's: its error shows
  in the node's output only).

QOperator models (``QLinearConv`` ...) get their views in ``qoperator_views.py``.

Each view is a node of the candidate (it runs, is judged, and named when it fails: a
doubled scale fails at the weight's view) that no other node reads; its node carries the
metadata :data:`FLOAT_VIEW` (what it views), is named ``<node>/<kind>_float_view`` after
the node whose value it views, and its output ``<value>_float_view``.
:class:`.quantized.ThroughQuantization` pairs the views.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
import onnx.helper as oh

#: metadata key on a view node: ``weight``, ``activation``, ``output`` or ``helper``
FLOAT_VIEW = "onnx_sbs_nb.float_view"
VIEW_WEIGHT = "weight"
VIEW_ACTIVATION = "activation"
VIEW_OUTPUT = "output"  # a QOperator node's integer output (qoperator_views.py)
VIEW_HELPER = "helper"  # a node a view reads (the identity of a MatMulNBits view)
#: metadata on a weight view the product multiplies by as it is (``x @ view``: a MatMul's
#: ``[K, N]``), so a linear's square weight pairs through its transposition even after
#: onnxruntime's optimizer rewrote the product (MatMulIntegerToFloat)
AS_STORED = "onnx_sbs_nb.float_view_multiplied_as_stored"
_SUFFIX = "_float_view"
_INTEGER_PRODUCTS = ("MatMulInteger", "ConvInteger")
#: the most multiply-adds (K·K·N) a MatMulNBits weight view may cost, and K·K the most
#: elements its run-time identity has (4096 x 4096 x 128: a second or so on a CPU)
NBITS_VIEW_MAX_MACS = 1 << 31


def view_name(value: str) -> str:
    return f"{value}{_SUFFIX}"


def multiplied_as_stored(node: onnx.NodeProto) -> bool:
    """Whether a weight view is multiplied by as it is (:data:`AS_STORED`)."""
    return any(p.key == AS_STORED for p in node.metadata_props)


def view_kind(node: onnx.NodeProto) -> str | None:
    """``weight``, ``activation``, ``output``, ``helper`` or None (not a view)."""
    for p in node.metadata_props:
        if p.key == FLOAT_VIEW:
            return p.value
    return None


@dataclass
class Views:
    """The model read once, and the views made for it: nodes to add before or after a
    node (by its index), their value infos and the initializers they read."""

    graph: onnx.GraphProto
    opset: int
    inits: dict[str, onnx.TensorProto]
    consumers: dict[str, list[onnx.NodeProto]] = field(default_factory=dict)
    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)
    taken: set[str] = field(default_factory=set)
    before: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)
    after: dict[int, list[onnx.NodeProto]] = field(default_factory=dict)
    infos: list[onnx.ValueInfoProto] = field(default_factory=list)
    extra_inits: list[onnx.TensorProto] = field(default_factory=list)

    @classmethod
    def of(cls, model: onnx.ModelProto) -> Views:
        g = model.graph
        opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        views = cls(g, opset, {i.name: i for i in g.initializer})
        for node in g.node:
            for i in node.input:
                if i:
                    views.consumers.setdefault(i, []).append(node)
            for o in node.output:
                if o:
                    views.producer[o] = node
        views.taken = set(views.producer) | set(views.inits)
        return views

    def add(self, k: int, nodes: list, info: onnx.ValueInfoProto, after: bool = False) -> None:
        (self.after if after else self.before).setdefault(k, []).extend(nodes)
        self.infos.append(info)

    def model(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """A copy of ``model`` with the views; ``model`` itself when there are none."""
        if not self.before and not self.after:
            return model
        out = onnx.ModelProto()
        out.CopyFrom(model)
        nodes = []
        for k, node in enumerate(self.graph.node):
            nodes.extend(self.before.get(k, ()))
            nodes.append(node)
            nodes.extend(self.after.get(k, ()))
        del out.graph.node[:]
        out.graph.node.extend(nodes)
        out.graph.value_info.extend(self.infos)
        out.graph.initializer.extend(self.extra_inits)
        return out


def with_float_views(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when it has nothing to view, else a copy with the views added
    (module docstring; QOperator's in ``qoperator_views.py``); the user's model is never
    changed."""
    from .qoperator_views import QOPERATOR_OPS, add_qoperator_views

    ops = {n.op_type for n in model.graph.node}
    if not ops & {*_INTEGER_PRODUCTS, "DynamicQuantizeLinear", "MatMulNBits", *QOPERATOR_OPS}:
        return model
    views = Views.of(model)
    for k, node in enumerate(model.graph.node):
        if node.op_type in _INTEGER_PRODUCTS:
            made = _integer_weight_view(node, views)
            if made:
                views.add(k, [made[0]], made[1])
        elif node.op_type == "DynamicQuantizeLinear":
            made = _activation_view(node, views.graph, views.taken)
            if made:
                views.add(k, [made[0]], made[1], after=True)
        elif node.op_type == "MatMulNBits" and node.domain == "com.microsoft":
            nbits = _nbits_weight_view(node, views.inits, views.taken)
            if nbits:
                views.add(k, nbits[0], nbits[1])
                views.extra_inits.append(nbits[2])
    add_qoperator_views(views)
    return views.model(model)


def fresh(name: str, taken: set[str]) -> str:
    out, k = name, 0
    while out in taken:
        k += 1
        out = f"{name}_{k}"
    taken.add(out)
    return out


def view_node(
    op: str,
    inputs: list[str],
    output: str,
    kind: str,
    of: onnx.NodeProto,
    label: str | None = None,
    as_stored: bool = False,
    **attrs,
) -> onnx.NodeProto:
    """A view node, named after the node whose value it views (a culprit names it):
    ``<node>/<label or kind>_float_view``, a helper ``<node>/<op>_for_float_view``."""
    domain = attrs.pop("domain", "")
    what = f"{op}_for_float_view" if kind == VIEW_HELPER else f"{label or kind}_float_view"
    name = f"{of.name or output}/{what}"
    node = oh.make_node(op, inputs, [output], name=name, domain=domain, **attrs)
    p = node.metadata_props.add()
    p.key, p.value = FLOAT_VIEW, kind
    if as_stored:
        p = node.metadata_props.add()
        p.key, p.value = AS_STORED, "1"
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
    node: onnx.NodeProto, views: Views
) -> tuple[onnx.NodeProto, onnx.ValueInfoProto] | None:
    if len(node.input) < 2 or node.input[1] not in views.inits:
        return None
    scale = _weight_scale(node, views.inits, views.consumers, views.producer)
    if scale is None:
        return None
    zp = node.input[3] if len(node.input) > 3 else ""
    # per channel: the output axis, a MatMul's N (last), a Conv's M (first)
    matmul = node.op_type == "MatMulInteger"
    axis = -1 if matmul else 0
    return dequantized_weight(node, node.input[1], scale, zp, axis, views, as_stored=matmul)


def dequantized_weight(
    node: onnx.NodeProto,
    weight: str,
    scale: str,
    zp: str,
    axis: int,
    views: Views,
    label: str | None = None,
    as_stored: bool = False,
) -> tuple[onnx.NodeProto, onnx.ValueInfoProto] | None:
    """``DequantizeLinear(weight, scale, zp)`` of ``node``'s weight initializer, per tensor
    or per channel along ``axis`` (negative: from the end), as a weight view."""
    inits = views.inits
    if weight not in inits or scale not in inits or zp and zp not in inits:
        return None
    s_dims = list(inits[scale].dims)
    zp_dims = list(inits[zp].dims) if zp else s_dims
    if zp_dims != s_dims or len(s_dims) > 1:
        return None  # DequantizeLinear wants a scale and zero point of one shape
    dims = list(inits[weight].dims)
    attrs = {}
    if s_dims and s_dims[0] != 1:
        # per channel; an axis needs opset 13
        axis = axis % len(dims) if dims else 0
        if views.opset < 13 or not dims or dims[axis] != s_dims[0]:
            return None
        attrs["axis"] = axis
    out = fresh(view_name(weight), views.taken)
    view = view_node(
        "DequantizeLinear",
        [weight, scale] + ([zp] if zp else []),
        out,
        VIEW_WEIGHT,
        node,
        label,
        as_stored,
        **attrs,
    )
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
    out = fresh(view_name(node.output[0]), taken)
    view = view_node("DequantizeLinear", list(node.output[:3]), out, VIEW_ACTIVATION, node)
    return view, oh.make_tensor_value_info(out, onnx.TensorProto.FLOAT, shape)


def _nbits_weight_view(
    node: onnx.NodeProto, inits: dict, taken: set
) -> tuple[list[onnx.NodeProto], onnx.ValueInfoProto, onnx.TensorProto] | None:
    attrs = {a.name: a for a in node.attribute}
    if len(node.input) < 3 or node.input[1] not in inits or "K" not in attrs or "N" not in attrs:
        return None
    k, n = attrs["K"].i, attrs["N"].i
    if k * k * n > NBITS_VIEW_MAX_MACS:
        return None
    scales = inits.get(node.input[2])
    if scales is None:
        return None
    elem = scales.data_type  # MatMulNBits' T1: the activation's, the output's type
    w = node.input[1]
    shape_name = fresh(f"{w}_identity_shape", taken)
    zeros, eye, out = (fresh(f"{w}_{s}", taken) for s in ("zeros", "identity", "float_view"))
    shape = oh.make_tensor(shape_name, onnx.TensorProto.INT64, [2], [k, k])
    # the identity is made at run time: an initializer of K*K floats would bloat the model
    zero = oh.make_tensor("value", elem, [1], [0])
    nodes = [
        view_node("ConstantOfShape", [shape_name], zeros, VIEW_HELPER, node, value=zero),
        view_node("EyeLike", [zeros], eye, VIEW_HELPER, node),
        # inputs after the group indices (a bias) are left out: the weight alone
        view_node(
            "MatMulNBits",
            [eye, *node.input[1:5]],
            out,
            VIEW_WEIGHT,
            node,
            as_stored=True,
            domain="com.microsoft",
            **{a.name: oh.get_attribute_value(a) for a in node.attribute},
        ),
    ]
    return nodes, oh.make_tensor_value_info(out, elem, [k, n]), shape


__all__ = [
    "AS_STORED",
    "FLOAT_VIEW",
    "NBITS_VIEW_MAX_MACS",
    "VIEW_ACTIVATION",
    "VIEW_HELPER",
    "VIEW_OUTPUT",
    "VIEW_WEIGHT",
    "Views",
    "dequantized_weight",
    "fresh",
    "multiplied_as_stored",
    "view_node",
    "view_kind",
    "view_name",
    "with_float_views",
]
