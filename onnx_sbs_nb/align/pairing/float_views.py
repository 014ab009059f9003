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
metadata ``float_view_nodes.FLOAT_VIEW`` (what it views), is named ``<node>/<kind>_float_view`` after
the node whose value it views, and its output ``<value>_float_view``.
:class:`.quantized.ThroughQuantization` pairs the views.
"""

from __future__ import annotations

import onnx
import onnx.helper as oh

from .float_view_nodes import (
    VIEW_ACTIVATION,
    VIEW_HELPER,
    VIEW_WEIGHT,
    Views,
    dequantized_weight,
    fresh,
    view_name,
    view_node,
)
from .qoperator_views import QOPERATOR_OPS, add_qoperator_views

_INTEGER_PRODUCTS = ("MatMulInteger", "ConvInteger")
#: the most multiply-adds (K·K·N) a MatMulNBits weight view may cost, and K·K the most
#: elements its run-time identity has (4096 x 4096 x 128: a second or so on a CPU)
NBITS_VIEW_MAX_MACS = 1 << 31


def with_float_views(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` itself when it has nothing to view, else a copy with the views added
    (module docstring; QOperator's in ``qoperator_views.py``); the user's model is never
    changed."""
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


__all__ = ["NBITS_VIEW_MAX_MACS", "with_float_views"]
