"""Pairing values of the fx graph with values of the ONNX graph.

The rules are the classes of :data:`FX_RULES`, run in that order on one
:class:`FxPairingContext` (each record's ``paired_by`` is the name of the rule that
paired it; each rule's name and strength are declared once, in :mod:`.rules`; the types,
shapes and transforms a pair is checked by, in :mod:`.values`).  In order:

1. ``name`` (:class:`.SameName`): the ONNX value carries the fx node's name (the dynamo
   exporter names the value that implements an fx node after it);
2. ``state_dict`` (:class:`.StateDictName`, :class:`.fx_rules.FoldedWeights`): an initializer named
   after a parameter, buffer or constant, or one whose ``pkg.torch.onnx.original_node_name``
   says so; an initializer consumed by the ONNX node of an fx node whose weight argument
   has the same number of elements (the exporter folds ``weight.T`` of a linear into a new
   initializer) pairs with that weight, compared through the same transposition;
3. ``metadata`` (:class:`.fx_rules.ByMetadata`): an fx node not paired by name pairs with the last
   output of the ONNX nodes that carry it in ``pkg.torch.onnx.fx_node`` whose declared
   type matches;
4. ``metadata`` again (:class:`.fx_rules.GetitemOutputs`), for the outputs of a multi-output fx node
   (an LSTM, a Split); ``position`` (:class:`.fx_rules.SplitParts`) for the parts of a split whose
   lowering lost its metadata;
5. ``structure`` (:class:`.structure_rules.AroundPaired`): the values around paired ones, for a graph tool
   that dropped the metadata or renamed values;
6. ``position`` (:class:`.ByPosition`): graph inputs and outputs left over pair by
   position;
7. ``structure`` (:class:`.foreign.CorrespondingOps`), for a model without any exporter
   metadata (the TorchScript exporter's, another converter's): node by node, each value
   with the fx value of the same frontier, dtype and shape whose lowering its op ends;
8. ``dequantized`` (:class:`.quantized.ThroughQuantization`), for a quantized model: the
   pairs moved into the float domain (a quantized value onto its DequantizeLinear, a
   parameter onto its quantized weight's), quantization initializers unpaired, and the
   float views of integer values the model keeps no float form of paired
   (``float_views.py``, ``qoperator_views.py``).

A pair is only made between values whose declared element type, rank and known
dimensions agree; a pair made from metadata or position that the actual shapes then
disprove is dropped at run time (not the same value), so a pairing is never the cause
of a shape mismatch.
"""

from __future__ import annotations

import onnx
import torch

from ...records import KIND_INPUT, KIND_NODE, KIND_OUTPUT, KIND_WEIGHT
from ..source.fx_metadata import FxMetadata
from .basic_rules import ByPosition, OutputFixAliases, SameName, StateDictName
from .context import FxPairingContext, run_rules
from .foreign import CorrespondingOps
from .fx_rules import ByMetadata, FoldedWeights, GetitemOutputs, SplitParts
from .lowered_by import graph_outputs
from .pairs import Pair, Pairing
from .quantized import ThroughQuantization
from .rules import MetadataRule, NameRule, PairingStep
from .structure_rules import AroundPaired
from .values import (
    TRANSFORM_RESHAPE,
    fx_value_shape,
    onnx_value_types_and_shapes,
    other_float,
    reshape_target,
    transform_of,
)

# The fx-to-ONNX pairing: its rules, in the order they run (each record's paired_by is
# the name of the rule that paired it).
FX_RULES: tuple[PairingStep, ...] = (
    SameName(),  # node outputs, graph inputs, folded constants named after fx nodes
    OutputFixAliases(),  # X_orig inputs and V_alias_<i> outputs of the output fix
    StateDictName(),
    FoldedWeights(),  # e.g. the transposed weight of a linear
    ByMetadata(),
    GetitemOutputs(),
    SplitParts(),  # a split whose lowering lost its metadata, by the parts' place
    AroundPaired(),
    ByPosition(),
    CorrespondingOps(then=AroundPaired()),  # a model without metadata: node by node
    ThroughQuantization(),  # a quantized model: its values in the float domain
)


def fx_pairing_context(
    graph: torch.fx.Graph,
    model: onnx.ModelProto,
    weights: dict[str, str],
    user_inputs: list[str],
    trusted: set[str] | None = None,
    metadata: FxMetadata | None = None,
    outputs: list[str] | None = None,
) -> FxPairingContext:
    """What the fx-to-ONNX rules read: the context :func:`pair_values` runs them on.

    ``trusted``: when the program is not known to be the one the model was lowered from,
    the fx nodes its metadata describes exactly; computed values of other fx nodes are
    not paired by name or metadata (the same name may be another computation).
    ``metadata``: the model's :class:`FxMetadata`, when the caller reads it too.
    ``outputs``: the fx values the program returns (:func:`returned_outputs`); by
    default every value of the graph's output node.
    """
    g = model.graph
    fx_nodes = {n.name: n for n in graph.nodes}
    onnx_types, onnx_shapes = onnx_value_types_and_shapes(model)
    initializers = {i.name: i for i in g.initializer}
    produced = list(dict.fromkeys(o for node in g.node for o in node.output if o))
    graph_inputs = [i.name for i in g.input if i.name not in initializers]
    onnx_outputs = [o.name for o in g.output]
    fx_outputs = graph_outputs(graph) if outputs is None else list(outputs)
    fx_output_set = set(fx_outputs)
    pairing = Pairing()

    def kind_of(fx_name: str, onnx_name: str) -> str:
        if fx_name in weights or onnx_name in initializers and fx_name not in fx_nodes:
            return KIND_WEIGHT
        node = fx_nodes.get(fx_name)
        if node is not None and node.op == "placeholder":
            return KIND_WEIGHT if fx_name in weights else KIND_INPUT
        if fx_name in fx_output_set or onnx_name in onnx_outputs:
            return KIND_OUTPUT
        return KIND_NODE

    def try_pair(onnx_name: str, fx_name: str, rule: str, transform: str | None = None) -> bool:
        if onnx_name in pairing.by_onnx:
            return False
        node = fx_nodes.get(fx_name)
        if node is None:
            return False
        if (
            trusted is not None
            and rule in (NameRule.name, MetadataRule.name)
            and node.op == "call_function"
            and fx_name not in trusted
            and not ("getitem" in str(node.target) and node.args and str(node.args[0]) in trusted)
        ):
            return False
        coarser = other_float(node, onnx_types.get(onnx_name))
        found = transform_of(
            node, onnx_types.get(onnx_name), onnx_shapes.get(onnx_name), rule, transform, coarser
        )
        if found is None:
            return False
        transform, squeeze = found
        pair = Pair(onnx_name, fx_name, rule, kind_of(fx_name, onnx_name), transform)
        pair.squeeze = squeeze
        if transform is None:
            declared, fx_shape = onnx_shapes.get(onnx_name), fx_value_shape(node)
            pair.declared = (
                declared is not None
                and fx_shape is not None
                and None not in fx_shape
                and tuple(declared) == fx_shape
            )
        if transform == TRANSFORM_RESHAPE and squeeze is None:
            pair.shape = reshape_target(onnx_shapes.get(onnx_name))
        if coarser:
            pair.cast_to = onnx_types[onnx_name][0]
        pairing.add(pair)
        return True

    return FxPairingContext(
        pairing=pairing,
        try_pair=try_pair,
        graph=g,
        inputs=graph_inputs,
        produced=produced,
        initializers=initializers,
        outputs=onnx_outputs,
        same_name=lambda name: name in fx_nodes and fx_nodes[name].op != "output",
        reference_by_original={t: ph for ph, t in weights.items()},
        reference_inputs=user_inputs,
        reference_outputs=fx_outputs,
        fx_nodes=fx_nodes,
        weights=weights,
        fx_of=(metadata or FxMetadata(model)).names,  # read once: protobuf is slow
        onnx_types=onnx_types,
        onnx_shapes=onnx_shapes,
        model=model,
    )


def pair_values(
    graph: torch.fx.Graph,
    model: onnx.ModelProto,
    weights: dict[str, str],
    user_inputs: list[str],
    trusted: set[str] | None = None,
    metadata: FxMetadata | None = None,
    outputs: list[str] | None = None,
) -> Pairing:
    """Pairs fx values (by node name) with ONNX values (by value name): runs
    :data:`FX_RULES` on :func:`fx_pairing_context` (which says what the arguments are)."""
    return run_rules(
        FX_RULES, fx_pairing_context(graph, model, weights, user_inputs, trusted, metadata, outputs)
    )
