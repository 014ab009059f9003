"""The rules both pairings share: the same name, a weight's original name, a place among
the graph inputs or outputs.  What counts as "the same name" differs between the program
and an ONNX model, and each side says it in :attr:`.PairingContext.same_name`."""

from __future__ import annotations

import onnx

from ...records import PAIRED_BY_NAME, PAIRED_BY_POSITION, PAIRED_BY_STATE_DICT
from ..source.fx_metadata import ORIGINAL_NAME_KEY
from .context import PairingContext, PairingStep
from .rules import rule


def original_name(init: onnx.TensorProto) -> str:
    """The name an initializer had in the program: its
    ``pkg.torch.onnx.original_node_name``, else its own."""
    for p in init.metadata_props:
        if p.key == ORIGINAL_NAME_KEY and p.value:
            return p.value
    return init.name


class SameName(PairingStep):
    """A candidate value (graph input, node output, initializer) pairs with the reference
    value of the same name, when the reference side says it is the same value."""

    declared = rule(PAIRED_BY_NAME)

    def run(self, ctx: PairingContext) -> None:
        for name in [*ctx.inputs, *ctx.produced, *ctx.initializers]:
            if ctx.same_name(name):
                ctx.try_pair(name, name, PAIRED_BY_NAME)


class StateDictName(PairingStep):
    """An initializer pairs with the reference weight of its original (state-dict) name."""

    declared = rule(PAIRED_BY_STATE_DICT)

    def run(self, ctx: PairingContext) -> None:
        for name, init in ctx.initializers.items():
            if name in ctx.pairing.by_onnx:
                continue
            ref = ctx.reference_by_original.get(original_name(init))
            if ref is not None:
                ctx.try_pair(name, ref, PAIRED_BY_STATE_DICT)


class ByPosition(PairingStep):
    """Graph inputs (and outputs) left over pair by position, when both sides have as
    many."""

    declared = rule(PAIRED_BY_POSITION)

    def run(self, ctx: PairingContext) -> None:
        for cand, ref in (
            (ctx.inputs, ctx.reference_inputs),
            (ctx.outputs, ctx.reference_outputs),
        ):
            if len(cand) != len(ref):
                continue
            for c, r in zip(cand, ref):
                if c not in ctx.pairing.by_onnx and r not in ctx.pairing.by_fx:
                    ctx.try_pair(c, r, PAIRED_BY_POSITION)


__all__ = ["ByPosition", "SameName", "StateDictName", "original_name"]
