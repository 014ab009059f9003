"""Pairing through the quantization nodes of a quantized model (onnxruntime's
``quantize_static`` QDQ, ``quantize_dynamic``): the values are compared in the float domain,
dequantized with the model's own scales and zero points.

- a value that the model only quantizes (its one consumer a ``QuantizeLinear`` read by a
  ``DequantizeLinear``) is compared as the ``DequantizeLinear`` gives it: that is the
  value the model computes on (a Relu folded into the QuantizeLinear's range, for one);
- an initializer that feeds a quantization node (a quantized weight, a scale, a zero
  point) is no torch parameter: a pair a name or a size made with it is undone, and the
  parameter pairs with the ``DequantizeLinear`` output of its quantized weight, where the
  model has one (QDQ); weights of ``MatMulInteger`` / ``ConvInteger`` / ``MatMulNBits``
  have none: the float view added for them (``float_views.py``) pairs with the weight of
  the fx node the product's float output is, through a transposition where the product
  multiplies by ``weight.T`` (a linear);
- a ``DynamicQuantizeLinear``'s float view pairs with the fx value its input pairs with: a
  second pair of that value, the quantized form the next node computes on.
"""

from __future__ import annotations

import onnx
import torch

from .context import FxPairingContext
from .float_view_nodes import (
    VIEW_ACTIVATION,
    VIEW_OUTPUT,
    VIEW_WEIGHT,
    multiplied_as_stored,
    view_kind,
    view_name,
)
from .pairs import Pair, Pairing
from .rules import DequantizedRule, NameRule
from .values import TRANSFORM_TRANSPOSE

#: the ops of a quantized model whose inputs are quantized values, scales or zero points
QUANT_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "MatMulInteger",
        "ConvInteger",
        "QLinearMatMul",
        "QLinearConv",
        "QLinearAdd",
        "QLinearMul",
        "QGemm",
        "MatMulNBits",
        "DynamicQuantizeMatMul",
    }
)


def is_quantized(graph: onnx.GraphProto) -> bool:
    """Whether the graph quantizes anything."""
    return any(n.op_type in QUANT_OPS for n in graph.node)


def _tensor_of(ctx: FxPairingContext, fx: str | None) -> str | None:
    """The fx node whose tensor an ONNX node's single output is: ``fx`` itself, or for an
    fx node of several outputs (a BatchNorm folded into its Conv returns a tuple) its
    ``getitem`` of output 0; None when it has none."""
    node = ctx.fx_nodes.get(fx) if fx else None
    if node is None or not isinstance(node.meta.get("val"), tuple | list):
        return fx
    first = (
        u.name
        for u in node.users
        if "getitem" in str(u.target) and len(u.args) > 1 and u.args[1] == 0
    )
    return next(first, None)


def _unpair(pairing: Pairing, pair: Pair) -> None:
    del pairing.by_onnx[pair.onnx_name]
    rest = tuple(p for p in pairing.by_fx.get(pair.fx_name, ()) if p is not pair)
    if rest:
        pairing.by_fx[pair.fx_name] = rest
    else:
        pairing.by_fx.pop(pair.fx_name, None)


class ThroughQuantization(DequantizedRule):
    """Runs last: moves the pairs of quantized values onto their dequantized twins and
    undoes the pairs of quantization initializers (module docstring)."""

    def run(self, ctx: FxPairingContext) -> None:
        g = ctx.graph
        if not is_quantized(g):
            return
        consumers: dict[str, list[onnx.NodeProto]] = {}
        for node in g.node:
            for i in node.input:
                if i:
                    consumers.setdefault(i, []).append(node)
        fixed = set(ctx.outputs) | set(ctx.inputs)  # the graph's own inputs and outputs
        self._weights(ctx, consumers)
        producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
        types = _elem_types(ctx)
        for name in list(ctx.pairing.by_onnx):
            pair = ctx.pairing.by_onnx[name]
            if name in ctx.initializers:
                continue
            if name in fixed:
                # a graph input (or output) keeps its pair; the value the model computes
                # on, its QuantizeLinear/DequantizeLinear's, is a second pair of the same
                # torch value: a QDQ that clips the input is judged there, not in its reader
                dq = _dequantized(name, consumers) if name in ctx.inputs else None
                if dq is not None and dq not in ctx.pairing.by_onnx:
                    ctx.try_pair(dq, pair.fx_name, self.name, pair.transform)
                continue
            if _quantized_twin(ctx, types.get(name), pair.fx_name):
                # an integer value of QLinear ops (QOperator): the quantized form of a
                # float torch value, not that value; no dequantized twin is computed
                _unpair(ctx.pairing, pair)
                continue
            dq = _dequantized(name, consumers)
            if dq is None or dq in ctx.pairing.by_onnx:
                continue
            _unpair(ctx.pairing, pair)
            if not ctx.try_pair(dq, pair.fx_name, self.name, pair.transform):
                ctx.pairing.add(pair)  # the dequantized value does not fit: keep the pair
                continue
            # the value before its QuantizeLinear is its producer's fx node's, where the
            # quantizer folded the next op into the range (a Gemm's output renamed ``relu``
            # is torch's ``linear``): it pairs with that fx node when nothing else did
            fx = _tensor_of(ctx, ctx.fx_of[producer[name]] if name in producer else None)
            if fx and fx != pair.fx_name and fx not in ctx.pairing.by_fx:
                ctx.try_pair(name, fx, self.name)
        self._views(ctx, consumers)

    def _views(self, ctx: FxPairingContext, consumers: dict) -> None:
        """Pairs the float views (``float_views.py``; module docstring)."""
        producer = {o: n for n in ctx.graph.node for o in n.output if o}
        index = {id(n): k for k, n in enumerate(ctx.graph.node)}
        # the values first: a QLinear product's weight pairs with its output's fx node
        for kinds in ((VIEW_ACTIVATION, VIEW_OUTPUT), (VIEW_WEIGHT,)):
            for node in ctx.graph.node:
                kind = view_kind(node)
                out = node.output[0] if node.output else ""
                if kind not in kinds or not out or out in ctx.pairing.by_onnx:
                    continue
                if kind == VIEW_ACTIVATION:
                    quantizer = producer.get(node.input[0])
                    pair = ctx.pairing.by_onnx.get(quantizer.input[0]) if quantizer else None
                    fx = ctx.fx_nodes.get(pair.fx_name) if pair is not None else None
                    if fx is not None and fx.op == "call_function":  # not a program input
                        ctx.try_pair(out, pair.fx_name, self.name, pair.transform)
                elif kind == VIEW_OUTPUT:
                    fx = _output_fx(ctx, node.input[0], producer.get(node.input[0]), index)
                    if fx is not None:
                        ctx.try_pair(out, fx.name, self.name)
                else:
                    weight = node.input[1] if node.op_type == "MatMulNBits" else node.input[0]
                    users = consumers.get(weight, [])
                    product = next((u for u in users if view_kind(u) is None), None)
                    if product is not None:
                        fx = _product_fx(ctx, product, index, consumers)
                        if fx is not None:
                            _pair_weight(ctx, out, multiplied_as_stored(node), fx, self.name)

    def _weights(self, ctx: FxPairingContext, consumers: dict) -> None:
        for name in ctx.initializers:
            users = consumers.get(name, [])
            if not any(u.op_type in QUANT_OPS for u in users):
                continue
            pair = ctx.pairing.by_onnx.get(name)
            if pair is None or pair.fx_name not in ctx.weights or pair.rule == NameRule.name:
                continue  # the program's own quantized constant, named after it: its twin
            _unpair(ctx.pairing, pair)
            dqs = [u for u in users if u.op_type == "DequantizeLinear" and u.input[0] == name]
            if len(dqs) == 1 and dqs[0].output[0] not in ctx.pairing.by_onnx:
                ctx.try_pair(dqs[0].output[0], pair.fx_name, self.name, pair.transform)
        # a parameter no rule paired (its float initializer is gone): the DequantizeLinear
        # of the initializer the quantizer named after it (``<name>_quantized``)
        paired_fx = set(ctx.pairing.by_fx)
        for fx_name, sd in ctx.weights.items():
            if fx_name in paired_fx:
                continue
            for u in consumers.get(f"{sd}_quantized", []):
                if u.op_type == "DequantizeLinear" and u.output[0] not in ctx.pairing.by_onnx:
                    ctx.try_pair(u.output[0], fx_name, self.name)
                    break


# the activations a quantizer folds into the output range of the op before them
_FOLDED = ("relu", "hardtanh", "clamp")


def _folded(fx: torch.fx.Node) -> bool:
    return fx.op == "call_function" and any(a in str(fx.target) for a in _FOLDED)


def _output_fx(
    ctx: FxPairingContext, value: str, producer: onnx.NodeProto | None, index: dict
) -> torch.fx.Node | None:
    """The fx value a QOperator node's integer output stands for: the one its name
    (``<fx name>_quantized``) or its node's metadata says, or the activation after it that
    the quantizer folded into the output's range (no ONNX node of its own computes it)."""
    base = value[: -len("_quantized")] if value.endswith("_quantized") else None
    fx = ctx.fx_nodes.get(base) if base else None
    if fx is None and producer is not None and id(producer) in index:
        fx = ctx.fx_nodes.get(ctx.fx_of[index[id(producer)]] or "")
    if fx is None or fx.op != "call_function":
        return None
    users = list(fx.users)
    if len(users) == 1 and _folded(users[0]) and users[0].name not in ctx.pairing.by_fx:
        return users[0]
    return fx


def _product_fx(
    ctx: FxPairingContext, product: onnx.NodeProto, index: dict, consumers: dict
) -> torch.fx.Node | None:
    """The fx node an integer product computes: its metadata's, else the fx node of the
    first value paired (itself or its float view) down its chain of single consumers
    (``Cast``, ``Mul`` by the scales, ``Add`` of the bias, a ``QLinearAdd``), before the
    activation folded into its range."""
    name = ctx.fx_of[index[id(product)]] if id(product) in index else None
    if name in ctx.fx_nodes:
        return ctx.fx_nodes[name]
    value = product.output[0]
    for _ in range(4):
        # the value's pair, or its float view's (a QOperator integer output)
        pair = ctx.pairing.by_onnx.get(value) or ctx.pairing.by_onnx.get(view_name(value))
        if pair is not None:
            fx = ctx.fx_nodes.get(pair.fx_name)
            if fx is not None and _folded(fx) and isinstance(fx.args[0], torch.fx.Node):
                return fx.args[0]  # the activation folded into the product's range
            return fx
        users = [u for u in consumers.get(value, []) if view_kind(u) is None]
        if len(users) != 1 or not users[0].output:
            return None
        value = users[0].output[0]
    return None


def _pair_weight(
    ctx: FxPairingContext, view: str, as_stored: bool, fx: torch.fx.Node, rule: str
) -> None:
    """Pairs a weight's float view with the one unpaired weight of ``fx`` of as many
    elements; a MatMul's ``[K, N]`` view of a linear's ``[N, K]`` weight through its
    transposition."""
    shape = ctx.onnx_shapes.get(view)
    if shape is None or None in shape:
        return
    numel = 1
    for d in shape:
        numel *= d
    cands = []
    for w in fx.all_input_nodes:
        val = w.meta.get("val")
        if w.name in ctx.weights and w.name not in ctx.pairing.by_fx:
            if isinstance(val, torch.Tensor) and val.numel() == numel:
                cands.append((w.name, tuple(val.shape)))
    if len(cands) != 1:
        return
    w, w_shape = cands[0]
    # a square weight: transposed where the product multiplies by the view as it is
    transposed = (
        len(shape) == 2
        and w_shape == tuple(shape[::-1])
        and (w_shape != tuple(shape) or (as_stored and "linear" in str(fx.target)))
    )
    ctx.try_pair(view, w, rule, TRANSFORM_TRANSPOSE if transposed else None)


_QUANTIZED_TYPES = frozenset(
    {
        onnx.TensorProto.INT8,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.INT4,
        onnx.TensorProto.UINT4,
        onnx.TensorProto.INT16,
        onnx.TensorProto.UINT16,
    }
)


# ops whose output is quantized when they quantize, or when their first input is
_QUANTIZING = frozenset(
    {
        "QuantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "QLinearAdd",
        "QLinearMul",
        "QLinearAveragePool",
        "QLinearGlobalAveragePool",
        "QLinearConcat",
        "QLinearSigmoid",
        "QLinearLeakyRelu",
    }
)
_KEEPS_TYPE = frozenset(
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
        "Concat",
        "Split",
        "Expand",
    }
)


def _elem_types(ctx: FxPairingContext) -> dict[str, int]:
    """Each value's element type: the declared one, else quantized integer where a
    quantizing node (a contrib QLinear op shape inference cannot read) or a node that
    keeps its first input's type over a quantized value writes it."""
    types = {k: v[0] for k, v in ctx.onnx_types.items()}
    types.update({k: v.data_type for k, v in ctx.initializers.items()})
    for node in ctx.graph.node:
        quantized = node.op_type in _QUANTIZING or (
            node.op_type in _KEEPS_TYPE
            and node.input
            and types.get(node.input[0]) in _QUANTIZED_TYPES
        )
        if quantized and node.output and node.output[0]:
            types.setdefault(node.output[0], onnx.TensorProto.UINT8)
    return types


def _quantized_twin(ctx: FxPairingContext, elem_type: int | None, fx_name: str) -> bool:
    """Whether an ONNX value of ``elem_type`` is a quantized integer paired with the float
    fx value ``fx_name``."""
    node = ctx.fx_nodes.get(fx_name)
    val = node.meta.get("val") if node is not None else None
    return (
        elem_type in _QUANTIZED_TYPES
        and getattr(val, "dtype", None) is not None
        and val.dtype.is_floating_point
    )


def _dequantized(name: str, consumers: dict[str, list[onnx.NodeProto]]) -> str | None:
    """The DequantizeLinear output that ``name`` only reaches through one QuantizeLinear."""
    users = consumers.get(name, [])
    if len(users) != 1 or users[0].op_type != "QuantizeLinear" or users[0].input[0] != name:
        return None
    dqs = [u for u in consumers.get(users[0].output[0], []) if u.op_type == "DequantizeLinear"]
    return dqs[0].output[0] if dqs else None


__all__ = ["QUANT_OPS", "ThroughQuantization", "is_quantized"]
