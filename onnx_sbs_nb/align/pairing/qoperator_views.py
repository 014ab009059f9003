"""Float views of a QOperator model (``quantize_static(quant_format=QOperator)``): its
``QLinearConv`` / ``QLinearMatMul`` / ``QGemm`` / ``QLinearAdd`` ... compute on integers
from end to end, with a ``DequantizeLinear`` only at the model's float outputs, so no
value inside has a float twin.  Dequantized with the scale and zero point the model gives
each integer value (a QLinear node's output scale and zero point, carried through the
ops that only move values: a ``Reshape``, a ``MaxPool``), every one does:

- each integer output of a QLinear node, and of an op moving one: ``DequantizeLinear``
  with that scale and zero point (kind ``output``), paired with the fx value its name
  (``<value>_quantized``) or metadata says, or the activation the quantizer folded into
  its range (a Conv's output range starting at 0 is the Relu after it);
- each ``QuantizeLinear`` output no ``DequantizeLinear`` reads: its dequantization
  (kind ``activation``, as a ``DynamicQuantizeLinear``'s);
- each integer weight of a ``QLinearConv`` / ``QLinearMatMul`` / ``QGemm``, per tensor or
  per channel, and its int32 bias, dequantized with the product of the input's and the
  weight's scales, and the constant operand of a ``QLinearAdd`` / ``QLinearMul`` (a
  MatMul's bias) with its own (kind ``weight``).

The view nodes themselves: ``float_views.py``.
"""

from __future__ import annotations

import onnx
import onnx.helper as oh

from .float_view_nodes import (
    VIEW_ACTIVATION,
    VIEW_HELPER,
    VIEW_OUTPUT,
    Views,
    dequantized_weight,
    fresh,
    view_name,
    view_node,
)

# op -> (the input index of its output's scale, of its output's zero point)
_OUTPUT_PARAMS = {
    "QLinearConv": (6, 7),
    "QLinearMatMul": (6, 7),
    "QLinearAdd": (6, 7),
    "QLinearMul": (6, 7),
    "QGemm": (7, 8),
    "QLinearSigmoid": (3, 4),
    "QLinearLeakyRelu": (3, 4),
    "QLinearSoftmax": (3, 4),
    "QLinearAveragePool": (3, 4),
    "QLinearGlobalAveragePool": (3, 4),
    "QLinearConcat": (0, 1),
}
# op -> (weight, weight scale, weight zero point, input scale, bias) input indices
_WEIGHTS = {
    "QLinearConv": (3, 4, 5, 1, 8),
    "QLinearMatMul": (3, 4, 5, 1, None),
    "QGemm": (3, 4, 5, 1, 6),
    # a constant operand (a MatMul's bias added by a QLinearAdd), either one
    "QLinearAdd": (3, 4, 5, 1, None),
    "QLinearMul": (3, 4, 5, 1, None),
}
# ops that move an integer value without changing it: its scale and zero point stay
_MOVES = frozenset(
    {
        "Reshape",
        "Transpose",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "MaxPool",
        "Identity",
        "Slice",
        "Gather",
        "Expand",
    }
)
QOPERATOR_OPS = frozenset(_OUTPUT_PARAMS)


def add_qoperator_views(views: Views) -> None:
    """Adds the views of the module docstring to ``views``."""
    g = views.graph
    if not any(n.op_type in QOPERATOR_OPS for n in g.node):
        return
    graph_io = {i.name for i in g.input} | {o.name for o in g.output}
    params: dict[str, tuple[str, str]] = {}  # integer value -> (scale, zero point)
    for k, node in enumerate(g.node):
        if not node.output or not node.output[0]:
            continue
        out = node.output[0]
        if node.op_type in _OUTPUT_PARAMS:
            s, z = _OUTPUT_PARAMS[node.op_type]
            if len(node.input) > s and node.input[s]:
                params[out] = (node.input[s], node.input[z] if len(node.input) > z else "")
            if node.op_type in _WEIGHTS:
                _weight_views(k, node, views)
        elif node.op_type == "QuantizeLinear" and len(node.input) > 1:
            if node.input[0] not in graph_io and not _dequantized(out, views):
                _view(k, node, out, (node.input[1], _input(node, 2)), VIEW_ACTIVATION, views)
            continue
        elif node.op_type in _MOVES and node.input and node.input[0] in params:
            params[out] = params[node.input[0]]
        else:
            continue
        if out in params and out not in graph_io and not _dequantized(out, views):
            _view(k, node, out, params[out], VIEW_OUTPUT, views)


def _input(node: onnx.NodeProto, k: int) -> str:
    return node.input[k] if len(node.input) > k else ""


def _dequantized(value: str, views: Views) -> bool:
    """Whether the model dequantizes ``value`` itself (QDQ, a float output)."""
    return any(c.op_type == "DequantizeLinear" for c in views.consumers.get(value, ()))


def _view(
    k: int, node: onnx.NodeProto, value: str, qparams: tuple[str, str], kind: str, views: Views
) -> None:
    scale, zp = qparams
    out = fresh(view_name(value), views.taken)
    inputs = [value, scale] + ([zp] if zp else [])
    elem = views.inits[scale].data_type if scale in views.inits else onnx.TensorProto.FLOAT
    if (
        scale in views.inits
        and len(views.inits[scale].dims) == 1
        and views.inits[scale].dims[0] > 1
    ):
        return  # a per-axis activation: its axis is not known here
    views.add(
        k,
        [view_node("DequantizeLinear", inputs, out, kind, node)],
        oh.make_tensor_value_info(out, elem, None),
        after=True,
    )


def _weight_views(k: int, node: onnx.NodeProto, views: Views) -> None:
    """The weight and the bias of a QLinear product, dequantized (module docstring)."""
    w, ws, wz, xs, b = _WEIGHTS[node.op_type]
    if node.op_type in ("QLinearAdd", "QLinearMul") and node.input[0] in views.inits:
        w, ws, wz = 0, 1, 2
    if len(node.input) <= wz or node.input[w] not in views.inits:
        return
    if node.op_type == "QLinearConv":
        axis = 0  # [M, C, ...]
    elif node.op_type == "QGemm":
        trans = [a.i for a in node.attribute if a.name == "transB"]
        axis = 0 if trans and trans[0] else 1
    else:
        axis = -1  # MatMul's [K, N]
    as_stored = node.op_type != "QLinearConv" and axis != 0
    made = dequantized_weight(
        node, node.input[w], node.input[ws], node.input[wz], axis, views, as_stored=as_stored
    )
    if made:
        views.add(k, [made[0]], made[1])
    bias = _input(node, b) if b is not None else ""
    if not bias or bias not in views.inits or node.input[xs] not in views.inits:
        return
    # an int32 bias is quantized with the input's scale times the weight's, zero point 0
    scale = fresh(f"{bias}_scale_for_float_view", views.taken)
    mul = view_node("Mul", [node.input[xs], node.input[ws]], scale, VIEW_HELPER, node)
    ws_init = views.inits[node.input[ws]]
    views.taken.add(scale)
    # its shape and type, for dequantized_weight to read (no data: it is computed)
    shape_only = onnx.TensorProto(name=scale, data_type=ws_init.data_type, dims=ws_init.dims)
    views.inits[scale] = shape_only
    made = dequantized_weight(node, bias, scale, "", 0, views, label="bias")
    del views.inits[scale]
    if made:
        views.add(k, [mul, made[0]], made[1])
        views.infos.append(oh.make_tensor_value_info(scale, ws_init.data_type, list(ws_init.dims)))


__all__ = ["QOPERATOR_OPS", "add_qoperator_views"]
