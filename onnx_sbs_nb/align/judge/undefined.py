"""Values with no defined content: ``torch.empty`` and its kin hand back memory as it was.

A program may allocate with ``empty``/``new_empty``/``empty_like``/``empty_strided`` and
overwrite the buffer later (``copy_``, functionalized into a new value): the allocation
itself holds whatever the allocator left there, and its ONNX lowering (a
``ConstantOfShape``, zeros) holds something else.  Comparing the two would blame a faithful
export at an error of any size, differently on every run.  Such values, and values
computed only from them, are checked on shape and type only, and are never fed to the ONNX
side as torch values (an own-error run would read garbage): the model's own value stands.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

# fx targets whose value is uninitialised memory
EMPTY_TARGETS = frozenset(
    {
        "aten.empty.memory_format",
        "aten.empty.default",
        "aten.new_empty.default",
        "aten.new_empty_strided.default",
        "aten.empty_like.default",
        "aten.empty_strided.default",
        "aten.empty_permuted.default",
    }
)

UNDEFINED_NOTE = (
    "uninitialised memory (torch.empty and its kin): its content is whatever the allocator "
    "left there, so only the shape and type are compared"
)


def undefined_fx_values(nodes: Iterable[torch.fx.Node]) -> frozenset[str]:
    """fx nodes whose value has no defined content: the empty allocations, and the nodes
    all of whose tensor inputs are such values (a view, a cast of one)."""
    undefined: set[str] = set()
    for node in nodes:
        if node.op != "call_function":
            continue
        if str(node.target) in EMPTY_TARGETS:
            undefined.add(node.name)
            continue
        inputs = node.all_input_nodes
        if inputs and all(a.name in undefined for a in inputs):
            undefined.add(node.name)
    return frozenset(undefined)


def undefined_values(undefined: frozenset[str], by_onnx: Mapping[str, object]) -> set[str]:
    """ONNX value names paired with the fx values ``undefined`` names."""
    if not undefined:
        return set()
    return {name for name, pair in by_onnx.items() if getattr(pair, "fx_name", None) in undefined}
