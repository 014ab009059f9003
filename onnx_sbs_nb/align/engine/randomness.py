"""Values drawn at random: the two sides make independent draws, so they never agree.

A program that draws noise in its forward (a VAE's ``randn_like``, diffusion noise, a
``rand`` mask) exports to ONNX random ops.  Comparing those values would report a faithful
export as wrong, and every value computed from them would inherit the difference.  The
engine checks their shape and type only, then lets the candidate continue from the
reference's draw, so everything after it is compared as usual.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence

import onnx
from onnx import numpy_helper

from .plan import SideGraph

RANDOM_OPS = frozenset(
    {
        "RandomNormal",
        "RandomNormalLike",
        "RandomUniform",
        "RandomUniformLike",
        "Bernoulli",
        "Multinomial",
    }
)


def random_nodes(
    nodes: Sequence[onnx.NodeProto], initializers: Mapping[str, onnx.TensorProto] | None = None
) -> tuple[int, ...]:
    """Indices of the nodes that draw random values (standard domain): the random ops,
    and a Dropout in training mode (its ``training_mode`` input not a constant false).
    ``initializers``: by name, to read that input when it is one."""
    found = []
    constants: dict[str, onnx.TensorProto] = {}  # Constant nodes' tensors, as met
    for k, n in enumerate(nodes):
        if n.domain not in ("", "ai.onnx"):
            continue
        if n.op_type == "Constant" and n.output:
            tensor = next((a.t for a in n.attribute if a.name == "value"), None)
            if tensor is not None:
                constants[n.output[0]] = tensor
        elif n.op_type in RANDOM_OPS or (
            n.op_type == "Dropout" and _trains(n, constants, initializers or {})
        ):
            found.append(k)
    return tuple(found)


def _trains(
    node: onnx.NodeProto,
    constants: Mapping[str, onnx.TensorProto],
    initializers: Mapping[str, onnx.TensorProto],
) -> bool:
    if len(node.input) < 3 or not node.input[2]:
        return False  # no training_mode: inference, the identity
    mode = node.input[2]
    tensor = constants.get(mode)
    if tensor is None:
        tensor = initializers.get(mode)
    if tensor is None:
        return True  # computed: it may train
    try:
        return bool(numpy_helper.to_array(tensor).any())
    except Exception:
        return True


def random_values(
    graph: SideGraph, drawing: Sequence[int], paired: Container[str]
) -> frozenset[str]:
    """The paired values that are random draws, or are computed from draws through values
    without a partner (a Cast of the draw, say): the first values along each path where
    the reference's draw can take over.  Past them, nothing is random any more."""
    if not drawing:
        return frozenset()
    sources = set(drawing)
    tainted: set[str] = set()
    found: set[str] = set()
    for k in range(drawing[0], len(graph.outputs)):
        if k in sources or any(i in tainted for i in graph.inputs[k]):
            for o in graph.outputs[k]:
                if o:
                    (found if o in paired else tainted).add(o)
    return frozenset(found)


__all__ = ["RANDOM_OPS", "random_nodes", "random_values"]
