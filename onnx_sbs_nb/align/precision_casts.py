"""The Casts a converter leaves between two nodes it keeps in float32.

onnxconverter-common (1.16) converts each blocked node alone: a Cast down to float16
after it, a Cast up to float32 before the next.  Between two blocked nodes the value makes
that round trip, so a value that does not fit float16 (an ``Exp`` feeding a ``ReduceSum``
and a ``Div``, both blocked) becomes infinite there, and the model kept in float32 to
avoid the overflow overflows anyway.  :func:`repair_round_trips` feeds the float32 value
itself to the Cast up (a Cast of a float32 to float32 is the value), and drops the Cast
down when nothing else reads it.
"""

from __future__ import annotations

import onnx

_LOW = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)
_HIGH = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE)


def _cast_to(node: onnx.NodeProto) -> int | None:
    if node.op_type != "Cast" or node.domain not in ("", "ai.onnx") or not node.input:
        return None
    return next((a.i for a in node.attribute if a.name == "to"), None)


def _types(graph: onnx.GraphProto) -> dict[str, int]:
    types = {
        vi.name: vi.type.tensor_type.elem_type
        for vi in (*graph.input, *graph.value_info, *graph.output)
    }
    types.update({i.name: i.data_type for i in graph.initializer})
    return types


def repair_round_trips(model: onnx.ModelProto) -> list[str]:
    """Removes the round trips float32 -> low precision -> float32 of ``model`` (in
    place): every Cast up that reads a Cast down reads the float32 value instead.
    Returns the names of the values no longer rounded on their way."""
    g = model.graph
    types = _types(g)
    producer = {o: n for n in g.node for o in n.output if o}
    repaired: list[str] = []
    for node in g.node:
        up = _cast_to(node)
        if up not in _HIGH:
            continue
        down = producer.get(node.input[0])
        if down is None or _cast_to(down) not in _LOW:
            continue
        source = down.input[0]
        if types.get(source) != up:
            continue  # the value was not in the type the Cast up makes: a real rounding
        node.input[0] = source
        repaired.append(source)
    if repaired:
        _drop_unread_casts(g)
    return repaired


def _drop_unread_casts(g: onnx.GraphProto) -> None:
    """Casts down whose output nobody reads any more (after the repair)."""
    while True:
        read = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        dead = [
            k
            for k, n in enumerate(g.node)
            if _cast_to(n) in _LOW and not any(o in read for o in n.output if o)
        ]
        if not dead:
            return
        for k in reversed(dead):
            del g.node[k]


__all__ = ["repair_round_trips"]
