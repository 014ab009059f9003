"""Writes into a program's inputs, as the exporter's re-trace records them.

A program that writes in place into a user input or a buffer (a static KV cache's
``keys.index_copy_(2, cache_position, k)``, a step counter's ``add_``) holds the
in-place call on the placeholder.  The re-trace functionalizes it: the call becomes its
functional op (``index_copy``, then its decomposition), later reads read that result, and
the value each written input ends with is returned first among the outputs, in the
inputs' order, as a ``BUFFER_MUTATION`` (target: the buffer) or ``USER_INPUT_MUTATION``
(target: the input's name) output.  :mod:`.reproduce` walks the writes as it walks those
on values the program made; this module says which inputs it may write, and builds the
outputs and their specs.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from .unsupported import Unsupported


def _writable_kinds() -> dict[Any, Any]:
    from torch.export.graph_signature import InputKind, OutputKind

    return {
        InputKind.BUFFER: OutputKind.BUFFER_MUTATION,
        InputKind.USER_INPUT: OutputKind.USER_INPUT_MUTATION,
    }


def check_writable(ep: torch.export.ExportedProgram, writes: Any) -> None:
    """Raises :class:`.unsupported.Unsupported` when a call ``writes`` (a predicate on
    nodes) writes into a placeholder that is neither a user input nor a buffer (a
    parameter, a constant)."""

    written = set()
    for n in ep.graph.nodes:
        if (
            n.op == "call_function"
            and writes(n)
            and n.args
            and isinstance(n.args[0], torch.fx.Node)
        ):
            source = written_input(n.args[0])
            if source is not None:
                written.add(source.name)
    kinds = _writable_kinds()
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if name in written and spec.kind not in kinds:
            raise Unsupported(f"the program writes into its {spec.kind.name} {name!r}")


def mutation_outputs(
    ep: torch.export.ExportedProgram, final: dict[str, Any]
) -> tuple[list[Any], list[Any]]:
    """The values written inputs end with (``final``: placeholder name -> node of the new
    graph) and their output specs, in the inputs' order, as the re-trace returns them."""
    from torch.export.graph_signature import OutputSpec, TensorArgument

    kinds = _writable_kinds()
    values, specs = [], []
    for spec in ep.graph_signature.input_specs:
        name = getattr(spec.arg, "name", None)
        if name not in final:
            continue
        kind = kinds.get(spec.kind)
        if kind is None:
            raise Unsupported(f"the program writes into its {spec.kind.name} {name!r}")
        value = final[name]
        if not isinstance(value, torch.fx.Node):
            raise Unsupported(f"the value written into {name!r} is not one node")
        target = spec.target if kind.name == "BUFFER_MUTATION" else name
        values.append(value)
        specs.append(OutputSpec(kind, TensorArgument(name=value.name), target))
    return values, specs


def written_input(target: torch.fx.Node) -> torch.fx.Node | None:
    """The placeholder a write into ``target`` writes: the placeholder itself, or a
    ``.to()`` of it that converts nothing (the re-trace decomposes it into the input
    itself, so writing through it writes the input); None for anything else."""
    if target.op == "placeholder":
        return target
    source = target.args[0] if target.op == "call_function" and target.args else None
    if not isinstance(source, torch.fx.Node) or source.op != "placeholder":
        return None
    t = target.target
    if not isinstance(t, torch._ops.OpOverload) or t.overloadpacket is not torch.ops.aten.to:
        return None
    ret = t._schema.returns[0].alias_info if len(t._schema.returns) == 1 else None
    if ret is None or t._schema.is_mutable or target.kwargs.get("copy"):
        return None
    a, b = source.meta.get("val"), target.meta.get("val")
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
        return None
    same = (a.dtype, a.device, a.layout, a.shape, a.stride()) == (
        b.dtype,
        b.device,
        b.layout,
        b.shape,
        b.stride(),
    )
    return source if same else None


def read_only_before(write: torch.fx.Node, target: torch.fx.Node) -> bool:
    """Whether every read of the input ``write`` writes (through ``target``, the input or
    its identity ``.to()``) comes before the write: a later read of the input itself
    would read the value as written, which the walk does not give it."""
    source = written_input(target)
    readers = set(target.users) | (set(source.users) if source is not None else set())
    readers -= {write, target}
    # a view of the input read after the write would read the written value too
    return all(r < write and not _aliases(r) for r in readers)


def _aliases(node: torch.fx.Node) -> bool:
    """A reader that may hold the input's memory (a view, the output, a getitem of one)."""
    t = node.target
    if node.op != "call_function":
        return True
    if t is operator.getitem:
        return _aliases(node.args[0])
    if not isinstance(t, torch._ops.OpOverload):
        return False  # size arithmetic
    return any(r.alias_info is not None for r in t._schema.returns)
