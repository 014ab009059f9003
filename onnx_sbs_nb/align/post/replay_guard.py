"""The run's memory guard, applied to a replay bundle's sub-model before onnxruntime runs it.

A bundle comes from someone else: its ``model.onnx`` can ask for an output of gigabytes
(a ``ConstantOfShape`` of ``[1e9]`` in a file of 142 bytes).  The run refuses such a node
before it allocates (``engine/limits.py``); a replay runs the whole sub-model at once, so
the shapes of every value are inferred first (onnx shape inference with the feeds' shapes
and constant folding of shape values) and a value larger than the memory free is refused
the same way, naming it.  Values whose shapes inference cannot tell are let through (the
runtime's own checks apply).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import onnx

from ..engine.limits import OutputTooLargeError, refuse_if_too_large

_ITEMSIZE = {
    onnx.TensorProto.BOOL: 1,
    onnx.TensorProto.INT8: 1,
    onnx.TensorProto.UINT8: 1,
    onnx.TensorProto.FLOAT16: 2,
    onnx.TensorProto.BFLOAT16: 2,
    onnx.TensorProto.INT16: 2,
    onnx.TensorProto.UINT16: 2,
    onnx.TensorProto.DOUBLE: 8,
    onnx.TensorProto.INT64: 8,
    onnx.TensorProto.UINT64: 8,
    onnx.TensorProto.COMPLEX64: 8,
    onnx.TensorProto.COMPLEX128: 16,
}


def _static(value: onnx.ValueInfoProto) -> tuple[list[int], int] | None:
    t = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not t.HasField("shape"):
        return None
    dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
    if any(d < 0 for d in dims):
        return None
    return dims, _ITEMSIZE.get(t.elem_type, 4)


def check_replay_memory(path: str, feeds: Mapping[str, Any]) -> None:
    """Raises OutputTooLargeError naming the first value of the model at ``path`` that,
    run on ``feeds``, would not fit in the memory free."""
    model = onnx.load(path, load_external_data=False)
    for inp in model.graph.input:
        shape = getattr(feeds.get(inp.name), "shape", None)
        if shape is None or not inp.type.HasField("tensor_type"):
            continue
        dims = inp.type.tensor_type.shape
        dims.ClearField("dim")
        for n in shape:
            dims.dim.add().dim_value = int(n)
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False, data_prop=True)
    except Exception:  # a model inference cannot read: onnxruntime says what is wrong
        return
    producer = {o: n for n in inferred.graph.node for o in n.output}
    for value in [*inferred.graph.value_info, *inferred.graph.output]:
        found = _static(value)
        if found is None or math.prod(found[0]) == 0:
            continue
        try:
            refuse_if_too_large(found[0], found[1], "cpu")
        except OutputTooLargeError as e:
            node = producer.get(value.name)
            who = f"node {node.name or node.op_type!r} ({node.op_type})" if node else "a value"
            raise OutputTooLargeError(f"{who}, value {value.name!r}: {e}") from None


__all__ = ["check_replay_memory"]
