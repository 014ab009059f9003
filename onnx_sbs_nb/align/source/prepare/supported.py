"""What the reproduction declines, before it walks anything.

Sizes the data decides, subgraphs, mutation outputs, writes it cannot functionalize,
custom ops and module calls raise :class:`.unsupported.Unsupported`: the program then goes
to the exporter's re-trace (:mod:`.exporter`).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .aliasing import NO_OPS, functional_form, is_symbolic_arithmetic, writes
from .graphs import is_op
from .input_writes import check_writable
from .unsupported import Unsupported


def check_supported(ep: torch.export.ExportedProgram) -> None:
    from torch.export.graph_signature import OutputKind

    gm = ep.graph_module
    for name, _ in gm.named_children():
        raise Unsupported(f"the program holds submodules (subgraphs: {name!r})")
    for spec in ep.graph_signature.output_specs:
        if spec.kind not in (OutputKind.USER_OUTPUT,):
            raise Unsupported(f"the program has {spec.kind.name} outputs (mutations)")
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    check_writable(ep, lambda n: writes(n) and n.target not in NO_OPS)
    for node in ep.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if free_unbacked_symbols(node.meta.get("val")):
            # sizes only the data decides (nonzero, item): tracing a call alone would
            # ask for them again
            raise Unsupported(f"node {node.name!r} has a data-dependent size")
        if node.op != "call_function":
            raise Unsupported(f"node {node.name!r} is a {node.op}")
        t = node.target
        if is_op(t):
            if t._schema.is_mutable and t not in NO_OPS and functional_form(node) is None:
                raise Unsupported(f"node {node.name!r} mutates ({t})")
            if t.namespace not in ("aten", "prims"):
                raise Unsupported(f"node {node.name!r} calls a custom op ({t})")
        elif t is not operator.getitem and not is_symbolic_arithmetic(t):
            raise Unsupported(f"node {node.name!r} calls {t!r}")


def fake_mode_of(ep: torch.export.ExportedProgram) -> Any:
    from torch._guards import detect_fake_mode

    vals = [n.meta.get("val") for n in ep.graph.nodes if n.op == "placeholder"]
    mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    if mode is None:
        raise Unsupported("the program's placeholders carry no fake tensors")
    return mode
