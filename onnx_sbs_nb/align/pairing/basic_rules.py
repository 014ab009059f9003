"""The rules both pairings share: the same name, a weight's original name, a place among
the graph inputs or outputs.  What counts as "the same name" differs between the program
and an ONNX model, and each side says it in :attr:`.PairingContext.same_name`."""

from __future__ import annotations

import re

import onnx

from ..source.fx_metadata import ORIGINAL_NAME_KEY
from .context import PairingContext
from .rules import NameRule, PositionRule, StateDictRule


def original_name(init: onnx.TensorProto) -> str:
    """The name an initializer had in the program: its
    ``pkg.torch.onnx.original_node_name``, else its own."""
    for p in init.metadata_props:
        if p.key == ORIGINAL_NAME_KEY and p.value:
            return p.value
    return init.name


class SameName(NameRule):
    """A candidate value (graph input, node output, initializer) pairs with the reference
    value of the same name, when the reference side says it is the same value."""

    def run(self, ctx: PairingContext) -> None:
        for name in [*ctx.inputs, *ctx.produced, *ctx.initializers]:
            if ctx.same_name(name):
                ctx.try_pair(name, name, NameRule.name)


class StateDictName(StateDictRule):
    """An initializer pairs with the reference weight of its original (state-dict) name."""

    def run(self, ctx: PairingContext) -> None:
        for name, init in ctx.initializers.items():
            if name in ctx.pairing.by_onnx:
                continue
            ref = ctx.reference_by_original.get(original_name(init))
            if ref is not None:
                ctx.try_pair(name, ref, StateDictRule.name)


# onnx_ir's OutputFixPass (run by the exporter): a graph input returned as it is gets an
# Identity named after it, the input renamed with this suffix; a value returned twice is
# returned again through an Identity named f"{value}_alias_{position}"
ALIASED_INPUT_SUFFIX = "_orig"
_ALIAS_OUTPUT = re.compile(r"^(?P<value>.+)_alias_\d+$")


class OutputFixAliases(NameRule):
    """The Identities the exporter's output fix adds, proven by their place.  A graph
    input the program also returns unchanged (a cache's cross-attention tensors, a sliding
    window's size) is renamed ``X_orig`` and returned as ``Identity(X_orig)`` named ``X``:
    ``X_orig`` is the program's input ``X``.  A value the program returns twice (the
    length two cache layers share) is returned the second time as ``Identity(V)`` named
    ``V_alias_<i>``: that output is the program's value ``V`` again."""

    def run(self, ctx: PairingContext) -> None:
        reference, outputs = set(ctx.reference_inputs), set(ctx.outputs)
        inputs = set(ctx.inputs)
        for node in ctx.graph.node:
            if node.op_type != "Identity" or node.domain not in ("", "ai.onnx"):
                continue
            if len(node.input) != 1 or len(node.output) != 1 or node.output[0] not in outputs:
                continue
            source, out = node.input[0], node.output[0]
            if source == out + ALIASED_INPUT_SUFFIX and source in inputs and out in reference:
                ctx.try_pair(source, out, NameRule.name)
                continue
            m = _ALIAS_OUTPUT.match(out)
            pair = ctx.pairing.by_onnx.get(source)
            if m and m.group("value") == source and source in outputs and pair is not None:
                ctx.try_pair(out, pair.fx_name, NameRule.name)


class ByPosition(PositionRule):
    """Graph inputs (and outputs) left over pair by position, when both sides have as
    many."""

    def run(self, ctx: PairingContext) -> None:
        for cand, ref in (
            (ctx.inputs, ctx.reference_inputs),
            (ctx.outputs, ctx.reference_outputs),
        ):
            if len(cand) != len(ref):
                continue
            for c, r in zip(cand, ref):
                if c not in ctx.pairing.by_onnx and r not in ctx.pairing.by_fx:
                    ctx.try_pair(c, r, PositionRule.name)


__all__ = [
    "ALIASED_INPUT_SUFFIX",
    "OutputFixAliases",
    "ByPosition",
    "SameName",
    "StateDictName",
    "original_name",
]
