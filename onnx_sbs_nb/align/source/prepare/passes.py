"""The re-trace's closing passes, run on the reproduction: sizes recomputed from the
inputs' (``run_decompositions``' own pass) and assertions removed (the exporter's
``remove_assertion_nodes``)."""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.fx

# the exporter's remove_assertion_nodes
ASSERTION_TARGETS = (
    "aten.sym_constrain_range_for_size.default",
    "aten._assert_async.default",
    "aten._assert_async.msg",
    "aten._assert_scalar.default",
    "aten._assert_tensor_metadata.default",
)


def reify_sizes(gm: torch.fx.GraphModule, fake_mode: Any) -> None:
    """The re-trace's last step, run on the reproduction: every symbolic size a node
    computes is recomputed from the inputs' sizes (``sym_size(cat, 1) - 1`` becomes the
    input's ``s50``, read once), as ``run_decompositions`` does with the same pass."""
    shape_env = getattr(fake_mode, "shape_env", None)
    if shape_env is None or not any(
        isinstance(n.meta.get("val"), torch.SymInt | torch.SymFloat | torch.SymBool)
        for n in gm.graph.nodes
    ):
        return
    from torch._export.passes._node_metadata_hook import (
        _node_metadata_hook,
        _set_node_metadata_hook,
    )
    from torch.export.exported_program import first_call_function_nn_module_stack
    from torch.fx.passes.runtime_assert import insert_deferred_runtime_asserts

    stack_trace = (
        'File "torch/fx/passes/runtime_assert.py", line 24, in insert_deferred_runtime_asserts'
    )
    hook = functools.partial(_node_metadata_hook, metadata={"stack_trace": stack_trace})
    with _set_node_metadata_hook(gm, hook):
        insert_deferred_runtime_asserts(
            gm,
            shape_env,
            f"exported program: {first_call_function_nn_module_stack(gm.graph)}",
            export=True,
        )


def remove_assertions(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and str(node.target) in ASSERTION_TARGETS:
            gm.graph.erase_node(node)
