"""Which nodes an exclusion needs so that a default onnxruntime session keeps the node in float.

onnxruntime's session optimizer ``WeightBiasQuantization`` (basic level, so on in any
default session) quantizes the float weight of a Conv, ConvTranspose or Gemm whose input 0
comes from a per-tensor ``DequantizeLinear`` (symmetric per-tensor int8, its bias int32),
and the QDQ fusions then run it as an integer kernel.  ``quantize_static`` with
``nodes_to_exclude=[gemm]`` leaves the Gemm's input quantized by its producer's QDQ pair, so
the node is quantized again, per tensor, as soon as the model is deployed: the exclusion
buys nothing there, however much it buys with the graph run as written.

The exclusion holds once the node's input 0 no longer comes from a ``DequantizeLinear``:
the producer of that input is excluded too (a Relu the quantizer folded into the pair then
runs in float after it; a Gemm before it keeps its input's pair and is quantized the same
way again, but its output stays float).  :func:`helpers` finds them one step upstream at a
time, quantizing again after each, as the quantizer decides where the pairs go.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx

# the ops onnxruntime's WeightBiasQuantization quantizes again (seen in onnxruntime 1.32;
# an older onnxruntime without it keeps them float, and the deployed measure shows it)
REQUANTIZED = ("Conv", "ConvTranspose", "Gemm")
# the optimizer's name, for InferenceSession(..., disabled_optimizers=[...])
WEIGHT_BIAS_QUANTIZATION = "WeightBiasQuantization"
# how far upstream helpers are looked for: a node fed by a chain of this many quantized
# producers stays quantized in a session whatever the advice
MAX_HELPERS = 3


def requantized_in_session(q: onnx.ModelProto, name: str) -> list[str] | None:
    """The names the value the node ``name`` of the quantized model ``q`` reads through a
    per-tensor DequantizeLinear may have in the float model (its QuantizeLinear's input in
    QDQ, the DequantizeLinear's output in QOperator), when a default session quantizes the
    node again (None: it stays float)."""
    node = next((n for n in q.graph.node if n.name == name), None)
    if node is None or node.op_type not in REQUANTIZED or node.domain not in ("", "ai.onnx"):
        return None  # quantized as asked (QOperator replaces it), or not an op it touches
    producer = {o: n for n in q.graph.node for o in n.output if o}
    dq = producer.get(node.input[0]) if node.input else None
    if dq is None or dq.op_type != "DequantizeLinear":
        return None
    consts = {i.name: i for i in q.graph.initializer}
    scale = consts.get(dq.input[1]) if len(dq.input) > 1 else None
    if scale is not None and len(scale.dims) > 0 and any(d != 1 for d in scale.dims):
        return None  # a per-channel input: the optimizer needs a per-tensor one
    weights = consts.get(node.input[1]) if len(node.input) > 1 else None
    if weights is None or weights.data_type != onnx.TensorProto.FLOAT:
        return None  # quantized as asked (a DequantizeLinear's weights), or computed
    q_node = producer.get(dq.input[0])
    before = [q_node.input[0]] if q_node is not None and q_node.op_type == "QuantizeLinear" else []
    return [*before, dq.output[0]]


def helpers(
    model: onnx.ModelProto,
    node: str,
    quantize: Callable[[list[str]], onnx.ModelProto],
    exclude: list[str],
    q: onnx.ModelProto,
) -> tuple[list[str], onnx.ModelProto, bool]:
    """(the float model's nodes to exclude with ``node`` on top of ``exclude``, the model
    quantized with them, whether ``node`` then stays float in a default session).  ``q``: the
    model quantized with ``exclude + [node]``."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    added: list[str] = []
    for _ in range(MAX_HELPERS):
        values = requantized_in_session(q, node)
        if values is None:
            return added, q, True
        up = next((producer[v] for v in values if v in producer), None)
        if up is None or not up.name or up.name in exclude or up.name in added or up.name == node:
            return added, q, False  # fed by a graph input's pair: nothing upstream to exclude
        added.append(up.name)
        q = quantize([*exclude, node, *added])
    return added, q, requantized_in_session(q, node) is None
