"""Which ONNX ops may end the lowering of an fx node, whatever exporter made the model.

A model without exporter metadata (the TorchScript exporter, other converters, a graph
edited by hand) says nothing of which fx node each ONNX node lowers; its values are
paired by structure (:mod:`.foreign`), and an ONNX value may be an fx node's value only
when the node making it is one an exporter ends that fx node's lowering with: an
``aten.linear`` with a bias ends with ``Gemm`` or the bias ``Add`` (never with the
``MatMul`` before it, whose value lacks the bias), an ``aten.relu`` with ``Relu``.
"""

from __future__ import annotations

import torch

# fx op name (no "aten.", no overload, no leading "_") -> the ONNX ops its lowering may
# end with; ops missing here are matched by name (aten.erf -> Erf), see ends_of
_ENDS: dict[str, frozenset[str]] = {
    k: frozenset(v.split())
    for k, v in {
        "add": "Add Sum", "sub": "Sub", "rsub": "Sub", "mul": "Mul", "div": "Div Mul",
        "conv1d": "Conv Add", "conv2d": "Conv Add", "conv3d": "Conv Add",
        "convolution": "Conv Add ConvTranspose", "conv_transpose1d": "ConvTranspose Add",
        "conv_transpose2d": "ConvTranspose Add", "conv_transpose3d": "ConvTranspose Add",
        "matmul": "MatMul Gemm Reshape", "mm": "MatMul Gemm", "bmm": "MatMul",
        "addmm": "Gemm Add", "baddbmm": "Add", "einsum": "Einsum MatMul",
        "gelu": "Gelu Mul", "silu": "Mul Silu", "hardswish": "HardSwish Mul Div",
        "hardsigmoid": "HardSigmoid", "leaky_relu": "LeakyRelu", "prelu": "PRelu",
        "mish": "Mul Mish", "softplus": "Softplus", "hardtanh": "Clip", "relu6": "Clip",
        "clamp": "Clip Min Max", "clamp_min": "Max Clip", "clamp_max": "Min Clip",
        "softmax": "Softmax", "log_softmax": "LogSoftmax", "safe_softmax": "Softmax",
        "layer_norm": "LayerNormalization Add Mul", "rms_norm": "RMSNormalization Mul",
        "batch_norm": "BatchNormalization Add Mul", "instance_norm": "InstanceNormalization",
        "group_norm": "GroupNormalization Add Mul Reshape",
        "mean": "ReduceMean GlobalAveragePool AveragePool", "sum": "ReduceSum",
        "amax": "ReduceMax", "amin": "ReduceMin", "prod": "ReduceProd",
        "adaptive_avg_pool1d": "GlobalAveragePool AveragePool ReduceMean",
        "adaptive_avg_pool2d": "GlobalAveragePool AveragePool ReduceMean",
        "avg_pool2d": "AveragePool", "max_pool2d": "MaxPool", "max_pool1d": "MaxPool",
        "view": "Reshape Flatten Squeeze Unsqueeze", "unsafe_view": "Reshape Flatten",
        "reshape": "Reshape Flatten Squeeze Unsqueeze", "flatten": "Flatten Reshape",
        "squeeze": "Squeeze Reshape", "unsqueeze": "Unsqueeze Reshape",
        "transpose": "Transpose", "permute": "Transpose", "t": "Transpose",
        "numpy_T": "Transpose", "expand": "Expand", "repeat": "Tile Expand",
        "cat": "Concat", "concat": "Concat", "stack": "Concat Unsqueeze",
        "select": "Gather Squeeze Slice", "slice": "Slice", "narrow": "Slice",
        "index_select": "Gather", "embedding": "Gather", "index": "Gather GatherND",
        "clone": "Identity", "alias": "Identity", "contiguous": "Identity",
        "detach": "Identity", "dropout": "Identity", "to_copy": "Cast", "to": "Cast",
        "pow": "Pow Mul", "rsqrt": "Reciprocal Div", "reciprocal": "Reciprocal Div",
        "where": "Where", "masked_fill": "Where", "scaled_dot_product_attention": "MatMul",
        "zeros": "Expand ConstantOfShape", "ones": "Expand ConstantOfShape",
        "full": "Expand ConstantOfShape", "zeros_like": "ConstantOfShape Expand",
        "ones_like": "ConstantOfShape Expand", "full_like": "ConstantOfShape Expand",
        "abs": "Abs", "exp": "Exp", "log": "Log", "sqrt": "Sqrt", "neg": "Neg",
        "tanh": "Tanh", "sigmoid": "Sigmoid", "relu": "Relu", "erf": "Erf",
    }.items()
}  # fmt: skip

# the outputs of multi-output fx nodes, by the op they come from: what ends a getitem's
# lowering (the parts of a split; an RNN's outputs, transposed and squeezed to torch's
# layout; a batch norm's normalized value)
_GETITEM_ENDS: dict[str, frozenset[str]] = {
    k: frozenset(v.split())
    for k, v in {
        "split": "Slice Split Gather Squeeze", "split_with_sizes": "Slice Split",
        "unsafe_split": "Slice Split", "chunk": "Slice Split", "unbind": "Gather Squeeze Split",
        "native_batch_norm_legit_no_training": "BatchNormalization Add Mul",
        "native_batch_norm": "BatchNormalization Add Mul",
        "native_batch_norm_legit": "BatchNormalization Add Mul",
        "native_layer_norm": "LayerNormalization Add Mul",
        "max_pool2d_with_indices": "MaxPool", "topk": "TopK", "sort": "TopK",
        "gru": "GRU Squeeze Transpose Reshape Concat", "lstm": "LSTM Squeeze Transpose Reshape Concat",
        "rnn_tanh": "RNN Squeeze Transpose Reshape", "rnn_relu": "RNN Squeeze Transpose Reshape",
        "var_mean": "ReduceMean Mul Div", "max": "ReduceMax ArgMax", "min": "ReduceMin ArgMin",
    }.items()
}  # fmt: skip

# fx ops that keep their input's value (the lowering is nothing, or an Identity)
COPIES = frozenset({"clone", "alias", "contiguous", "detach", "dropout", "lift_fresh_copy"})
# fx ops that move or select values without computing new ones: an exporter merges them
# with their neighbours (two transposes into one), so a pairing may step over them
LAYOUT = frozenset({
    "view", "unsafe_view", "reshape", "flatten", "squeeze", "unsqueeze", "transpose",
    "permute", "t", "numpy_T", "expand", "expand_as", "repeat", "select", "slice", "narrow",
    "split", "split_with_sizes", "unsafe_split", "chunk", "unbind", "cat", "concat", "stack",
}) | COPIES  # fmt: skip
# fx ops an exporter folds into the weights of the Conv/Gemm before them (a batch norm in
# an eval export, an affine scale and shift)
FOLDABLE = frozenset({"batch_norm", "native_batch_norm_legit_no_training", "add", "sub",
                      "mul", "div"})  # fmt: skip


def op_name(node: torch.fx.Node) -> str:
    """``aten.add.Tensor`` -> ``add``, ``aten._softmax.default`` -> ``softmax``,
    ``operator.getitem`` -> ``getitem``."""
    target = node.target
    name = getattr(target, "__name__", None) or str(target)
    packet = getattr(target, "_opname", None) or name.split(".")[0]
    return str(packet).lstrip("_")


def ends_of(node: torch.fx.Node) -> frozenset[str]:
    """The ONNX op types that may end ``node``'s lowering (empty: none known)."""
    name = op_name(node)
    if name == "getitem":
        src = node.args[0] if node.args else None
        if not isinstance(src, torch.fx.Node):
            return frozenset()
        return _GETITEM_ENDS.get(op_name(src), frozenset())
    if name == "linear":
        # a bias is added last; without one the product is the value
        bias = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        return frozenset({"Gemm", "Reshape", "Add" if bias is not None else "MatMul"})
    if name in COPIES and node.args and isinstance(node.args[0], torch.fx.Node):
        # a copy's value is its input's: what ends the input's lowering ends it too
        return _ENDS[name] | ends_of(node.args[0]) if name in _ENDS else ends_of(node.args[0])
    found = _ENDS.get(name)
    if found is not None:
        return found
    # an elementwise op of the same name (aten.floor -> Floor, aten.cos -> Cos)
    return frozenset({_CAMEL.get(name, name.replace("_", "").capitalize())})


_CAMEL = {"logical_not": "Not", "bitwise_not": "Not", "eq": "Equal", "gt": "Greater",
          "lt": "Less", "ge": "GreaterOrEqual", "le": "LessOrEqual"}  # fmt: skip


def is_getitem_of(node: torch.fx.Node, names: frozenset[str] | set[str]) -> bool:
    src = node.args[0] if op_name(node) == "getitem" and node.args else None
    return isinstance(src, torch.fx.Node) and op_name(src) in names


__all__ = ["COPIES", "FOLDABLE", "LAYOUT", "ends_of", "is_getitem_of", "op_name"]
