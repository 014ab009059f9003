"""One ONNX model against itself: the pairing of a run on two devices or two runtimes.

Both sides are the same graph, so every graph input and node output pairs with its
namesake: the registry's name rule (:class:`.basic_rules.SameName`) on a context whose
reference is the model itself.  Initializers are not compared (both sides hold the same
bytes), and each pair says the rule that made it, as every other pairing's do.
"""

from __future__ import annotations

import onnx

from ...records import KIND_INPUT, KIND_NODE, KIND_OUTPUT
from .basic_rules import SameName
from .context import PairingContext
from .pairs import Pair, Pairing
from .rules import PairingStep

# The same-model pairing: its rules, in the order they run.
SAME_MODEL_RULES: tuple[PairingStep, ...] = (SameName(),)


def same_model_context(model: onnx.ModelProto) -> PairingContext:
    """What the rules read when both sides are ``model``."""
    g = model.graph
    inits = {i.name for i in g.initializer}
    inputs = [i.name for i in g.input if i.name not in inits]
    produced = list(dict.fromkeys(o for node in g.node for o in node.output if o))
    outputs = [o.name for o in g.output]
    input_set, output_set = set(inputs), set(outputs)
    pairing = Pairing()

    def try_pair(cand: str, ref: str, rule: str, transform: str | None = None) -> bool:
        if cand in pairing.by_onnx:
            return False
        if cand in input_set:
            kind = KIND_INPUT  # an input returned as it is stays an input
        else:
            kind = KIND_OUTPUT if cand in output_set else KIND_NODE
        pairing.add(Pair(cand, ref, rule, kind, transform))
        return True

    return PairingContext(
        pairing=pairing,
        try_pair=try_pair,
        graph=g,
        inputs=inputs,
        produced=produced,
        initializers={},  # the same bytes on both sides: nothing to compare
        outputs=outputs,
        same_name=lambda name: True,
        reference_by_original={},
        reference_inputs=inputs,
        reference_outputs=outputs,
    )


def same_model_pairing(model: onnx.ModelProto) -> Pairing:
    """Every graph input and node output paired with its namesake on the other side."""
    ctx = same_model_context(model)
    # not run_rules: its last step marks graph outputs, and an input the graph returns as
    # it is stays an input here
    for step in SAME_MODEL_RULES:
        step.pair(ctx)
    return ctx.pairing


__all__ = ["SAME_MODEL_RULES", "same_model_context", "same_model_pairing"]
