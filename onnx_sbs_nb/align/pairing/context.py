"""What a pairing rule reads, and the shape every rule has.

A rule is a small class (:class:`.rules.PairingStep`): it derives from its rule's
declaration in :mod:`.rules` (which
gives it its ``name``, the ``Record.paired_by`` of the pairs it makes, and its
``strength``) and has ``pair(ctx) -> int``, the pairs it made.  A pairing is an ordered
tuple of rule objects run on one context (:func:`run_rules`); each pairing lists its
tuple (``names.FX_RULES``, ``onnx_pairing.ONNX_RULES``, ``same_model.SAME_MODEL_RULES``,
``deployed.DEPLOYED_RULES``), and adding a rule is one class and one entry there.  Like
the exporter's capture strategies, each rule names itself in what it makes: ``try_pair``
is given the rule's name.

The pairings of two graphs fill the same context: the *candidate* is always an ONNX
model, the *reference* the program (fx-to-ONNX) or an ONNX model (ONNX-to-ONNX, the same
model on two devices); rules that need more of one side read a subclass
(:class:`FxPairingContext`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import onnx
import torch

from ...records import KIND_OUTPUT
from .pairs import Pairing
from .rules import PairingStep

# (candidate value, reference value, rule name, transform=None) -> whether it paired
TryPair = Callable[..., bool]


@dataclass
class PairingContext:
    pairing: Pairing
    try_pair: TryPair
    graph: onnx.GraphProto  # the candidate model's main graph
    # the candidate's values: its graph inputs (initializers left out), the values its
    # nodes produce (in node order), its initializers and its graph outputs
    inputs: list[str]
    produced: list[str]
    initializers: dict[str, onnx.TensorProto]
    outputs: list[str]
    # whether a candidate value's name names the same value on the reference side
    same_name: Callable[[str], bool]
    # the reference's weight for a candidate initializer's original (state-dict) name
    reference_by_original: dict[str, str]
    reference_inputs: list[str]
    reference_outputs: list[str]

    def mark_outputs(self) -> None:
        """Graph outputs always show as outputs, whichever rule paired them."""
        for o in self.outputs:
            p = self.pairing.by_onnx.get(o)
            if p is not None:
                p.kind = KIND_OUTPUT


@dataclass
class FxPairingContext(PairingContext):
    """What the fx-to-ONNX rules read besides the shared context: the program's nodes and
    weights, and the candidate's declared types and shapes and each node's fx node."""

    fx_nodes: dict[str, torch.fx.Node]
    weights: dict[str, str]  # placeholder -> state-dict name
    fx_of: list[str | None]  # per ONNX node, the fx node its metadata names
    onnx_types: dict[str, tuple[int, int | None]]
    onnx_shapes: dict[str, tuple[int | None, ...]]
    model: onnx.ModelProto | None = None  # the candidate (shape inference reads it)


def run_rules(rules: Iterable[PairingStep], ctx: PairingContext) -> Pairing:
    """Runs ``rules`` in order on ``ctx``: the pairing they made."""
    for rule in rules:
        rule.pair(ctx)
    ctx.mark_outputs()
    return ctx.pairing


__all__ = ["FxPairingContext", "PairingContext", "TryPair", "run_rules"]
