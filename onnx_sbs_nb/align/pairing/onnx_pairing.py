"""Pairing the values of two ONNX models of one program.

Two exports of the same program (before and after an optimizer, two exporter versions,
float32 and float16) name most values alike: the dynamo exporter names each value after
the fx node that produced it and stores that fx node on each ONNX node.  Rules, in
order (each pair says which one made it):

1. ``name``: the same value name in both models (node outputs, graph inputs,
   initializers), when both are the same kind of thing: a name is only trusted as far as
   the exporter keeps it stable.  A value named after its fx node is the program's name;
   an exporter counter (``val_12``) may name another computation in another export, so
   it pairs only when both producers lower the same fx node with the same op; a value
   named after its fx node pairs with a graph tool's fused node that kept its name;
   constants pair when their shapes agree;
2. ``state_dict``: initializers whose ``pkg.torch.onnx.original_node_name`` (or name)
   matches the other model's;
3. ``metadata``: the last output of the last node carrying the same
   ``pkg.torch.onnx.fx_node`` in each model;
4. ``position``: graph inputs and outputs left over, by position.

The rules are the classes of :data:`ONNX_RULES`, run in that order on one
:class:`OnnxPairingContext`: the first, second and last are the ones the program's
pairing runs too (:mod:`.basic_rules`), told by the context what a same name is here.

Values pair only when their declared element types and ranks agree, or when both are
floating point of the same rank: then ``Pair.transform`` is :data:`TRANSFORM_CAST`
(``Pair.cast_to``: the candidate's element type), reference values fed to the candidate
are cast to its type (:func:`cast_value`) and the two values are compared in the less
precise of their types (:func:`in_common_precision`; the record says so).

The result is the :class:`~onnx_sbs_nb.align.pairing.names.Pairing` the engine uses for the
program against a model, with the *reference* model in the place of the program:
``Pair.fx_name`` holds the reference model's value name, ``Pair.onnx_name`` the
candidate's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from ...compare.value_facts import value_dtype_name
from ...convert import to_torch
from ...dtypes import ONNX_FLOAT_TYPES, ONNX_TO_TORCH, onnx_to_np_dtype
from ...records import KIND_INPUT, KIND_NODE, KIND_OUTPUT, KIND_WEIGHT
from ..source.fx_metadata import _FX_NAME, FX_NODE_KEY, fx_name_from_metadata
from ..source.loading import load_onnx_model
from .basic_rules import ByPosition, SameName, StateDictName, original_name
from .context import PairingContext, run_rules
from .graph_map import META_REPLACED
from .pairs import Pair, Pairing
from .rules import MetadataRule, PairingStep
from .values import TRANSFORM_CAST, onnx_value_types

_FLOATS = ONNX_FLOAT_TYPES


def _compatibility(ref_type: Any, cand_type: Any) -> tuple[bool, str | None]:
    """(may pair, transform): unknown types may pair, floats of one rank pair by a cast."""
    if ref_type is None or cand_type is None:
        return True, None
    (re, rr), (ce, cr) = ref_type, cand_type
    if rr is not None and cr is not None and rr != cr:
        return False, None
    if re == ce:
        return True, None
    if re in _FLOATS and ce in _FLOATS:
        return True, TRANSFORM_CAST
    return False, None


def _meta(proto: Any, key: str) -> str | None:
    for p in proto.metadata_props:
        if p.key == key:
            return p.value
    return None


def _fx_of_initializer(init: onnx.TensorProto) -> str | None:
    for p in init.metadata_props:
        if p.key == FX_NODE_KEY:
            m = _FX_NAME.match(p.value)
            return m.group(1) if m else None
    return None


# metadata-less nodes a converter adds around the computation, not in place of it
_PLUMBING = frozenset({"::Cast", "::CastLike", "::Identity"})


class _Side:
    def __init__(self, model: onnx.ModelProto):
        self.graph = g = model.graph
        self.types = onnx_value_types(model)
        self.inits = {i.name: i for i in g.initializer}
        self.inputs = [i.name for i in g.input if i.name not in self.inits]
        self.outputs = [o.name for o in g.output]
        # value -> (op, fx node, node name, original nodes it replaced)
        self.producer: dict[str, tuple[str, str | None, str, frozenset[str]]] = {}
        self.last_by_fx: dict[str, onnx.NodeProto] = {}
        for k, node in enumerate(g.node):
            fx = fx_name_from_metadata(node)
            if fx:
                self.last_by_fx[fx] = node
            replaced = frozenset(json.loads(_meta(node, META_REPLACED) or "[]"))
            op, name = f"{node.domain}::{node.op_type}", node.name or f"{node.op_type}_{k}"
            for o in node.output:
                if o:
                    self.producer[o] = (op, fx, name, replaced)
        self.produced = list(self.producer)
        # a value -> the graph output a converter's plumbing (Cast, Identity: no fx
        # metadata) hands it to, e.g. float16's Cast back to float32 (keep_io_types)
        self.output_of: dict[str, str] = {}
        plumbing = [
            n
            for n in g.node
            if f"{n.domain}::{n.op_type}" in _PLUMBING
            and len(n.input) >= 1
            and len(n.output) == 1
            and not fx_name_from_metadata(n)
        ]
        for _ in range(len(plumbing)):  # a chain of casts, followed back from the output
            added = False
            for n in plumbing:
                out = n.output[0]
                reached = out if out in self.outputs else self.output_of.get(out)
                if reached and n.input[0] not in self.output_of and n.input[0] != reached:
                    self.output_of[n.input[0]] = reached
                    added = True
            if not added:
                break
        self.values = set(self.inputs) | set(self.inits) | set(self.produced)
        # a constant onnxruntime folded keeps the fx node of the node it replaced
        # (optimize_model writes it on the initializer)
        self.init_fx = {n: _fx_of_initializer(i) for n, i in self.inits.items()}

    def kind(self, name: str) -> str:
        if name in self.inits:
            return KIND_WEIGHT
        if name in self.outputs:
            return KIND_OUTPUT
        if name in self.inputs:
            return KIND_INPUT
        return KIND_NODE


def _same_thing(name: str, ref: _Side, cand: _Side) -> bool:
    """Whether a name shared by both models names the same computation (see rule 1)."""
    r_in, c_in = name in ref.inputs, name in cand.inputs
    if r_in or c_in:
        return r_in and c_in
    if name in ref.outputs and name in cand.outputs:
        # the models' interface, which a converter keeps even where its own Cast takes an
        # output over (float16 with keep_io_types): the same output
        return True
    r_init, c_init = ref.inits.get(name), cand.inits.get(name)
    if r_init is not None and c_init is not None:
        return list(r_init.dims) == list(c_init.dims)
    if r_init is not None or c_init is not None:
        # a constant folded in one model: a value named after its fx node, or one whose
        # initializer says which fx node it was computed for
        folded, computed = (ref, cand) if r_init is not None else (cand, ref)
        fx = computed.producer[name][1]
        return fx == name or (fx is not None and folded.init_fx.get(name) == fx)
    (r_op, r_fx, r_node, r_rep), (c_op, c_fx, c_node, c_rep) = (
        ref.producer[name],
        cand.producer[name],
    )
    if r_node in c_rep or c_node in r_rep:
        return True  # an optimized model saying which original node it stands for
    if r_fx and c_fx and r_fx != c_fx:
        return False
    if r_fx == c_fx == name:
        return True
    bare = c_op if c_fx is None else r_op
    if (r_fx is None) != (c_fx is None) and name in (r_fx, c_fx) and bare not in _PLUMBING:
        # a graph tool's fused node (no metadata: SkipLayerNormalization, FastGelu) keeps
        # the value the exporter named after its fx node: the program's name, the same
        # value; a converter's Cast taking the name over (float16 outputs) is not
        return True
    return r_op == c_op


@dataclass
class OnnxPairingContext(PairingContext):
    """The shared context, and both models as the ONNX-to-ONNX rules read them."""

    reference: _Side
    candidate: _Side


class SameFxNode(MetadataRule):
    """The last output of the last node lowering the same fx node in each model."""

    def run(self, ctx: OnnxPairingContext) -> None:
        for fx, c_node in ctx.candidate.last_by_fx.items():
            r_node = ctx.reference.last_by_fx.get(fx)
            if r_node is None:
                continue
            c_out = next((o for o in reversed(c_node.output) if o), None)
            r_out = next((o for o in reversed(r_node.output) if o), None)
            if c_out and r_out:
                _pair_last_values(ctx, c_out, r_out)


def _pair_last_values(ctx: OnnxPairingContext, c_out: str, r_out: str) -> None:
    """Pairs the last values of one fx node's lowerings, and the graph outputs a
    converter's casts hand them to (float16 with keep_io_types: the Add, then its Cast
    back to float32 under the output's name): outputs pair with outputs; the candidate's
    value the Cast reads pairs with the same reference output too, so the node that
    computes it is still compared (and rerun on the reference's values)."""
    cand, ref, rule = ctx.candidate, ctx.reference, MetadataRule.name
    c_to, r_to = cand.output_of.get(c_out), ref.output_of.get(r_out)
    if c_to and r_to:
        ctx.try_pair(c_to, r_to, rule)
    elif c_to and r_out in ref.outputs:
        ctx.try_pair(c_to, r_out, rule)
        pair = ctx.pairing.by_onnx.get(c_to)
        if pair is not None and pair.fx_name == r_out:
            ctx.try_pair(c_out, r_out, rule, again=True)
        return
    elif r_to and c_out in cand.outputs:
        r_out = r_to  # the reference's value inside stays its own (one partner each)
    ctx.try_pair(c_out, r_out, rule)


# The ONNX-to-ONNX pairing: its rules, in the order they run.
ONNX_RULES: tuple[PairingStep, ...] = (SameName(), StateDictName(), SameFxNode(), ByPosition())


def onnx_pairing_context(reference: Any, candidate: Any) -> OnnxPairingContext:
    """What the ONNX-to-ONNX rules read: the context :func:`pair_onnx_models` runs them on."""
    ref = _Side(load_onnx_model(reference))
    cand = _Side(load_onnx_model(candidate))
    pairing = Pairing()
    taken_ref: set[str] = set()

    def try_pair(c: str, r: str, rule: str, again: bool = False) -> bool:
        """``again``: ``r`` may have a partner already (a value and its cast output)."""
        if c in pairing.by_onnx or (r in taken_ref and not again):
            return False
        ok, transform = _compatibility(ref.types.get(r), cand.types.get(c))
        if not ok:
            return False
        kind = KIND_WEIGHT if KIND_WEIGHT in (ref.kind(r), cand.kind(c)) else cand.kind(c)
        cast_to = cand.types[c][0] if transform == TRANSFORM_CAST else None
        pairing.add(Pair(c, r, rule, kind, transform, cast_to))
        taken_ref.add(r)
        return True

    return OnnxPairingContext(
        pairing=pairing,
        try_pair=try_pair,
        graph=cand.graph,
        inputs=cand.inputs,
        produced=cand.produced,
        initializers=cand.inits,
        outputs=cand.outputs,
        same_name=lambda name: name in ref.values and _same_thing(name, ref, cand),
        reference_by_original={original_name(i): n for n, i in ref.inits.items()},
        reference_inputs=ref.inputs,
        reference_outputs=ref.outputs,
        reference=ref,
        candidate=cand,
    )


def pair_onnx_models(reference: Any, candidate: Any) -> Pairing:
    """Pairs the values of ``candidate`` with those of ``reference`` (two ONNX models):
    runs :data:`ONNX_RULES` on :func:`onnx_pairing_context`."""
    return run_rules(ONNX_RULES, onnx_pairing_context(reference, candidate))


# coarser last: two float types are compared in the coarser one
_PRECISION = {"float64": 0, "float32": 1, "float16": 2, "bfloat16": 3}


def cast_value(value: Any, elem_type: int | None) -> Any:
    """A tensor (torch or numpy) cast to an ONNX element type; anything else unchanged."""
    if elem_type is None:
        return value
    if isinstance(value, torch.Tensor):
        dtype = ONNX_TO_TORCH.get(elem_type)
        return value if dtype is None or value.dtype == dtype else value.to(dtype)
    if isinstance(value, np.ndarray | np.generic):
        dtype = onnx_to_np_dtype(elem_type)
        return value if value.dtype == dtype else np.asarray(value).astype(dtype)
    return value


def in_common_precision(expected: Any, got: Any) -> tuple[Any, Any, str | None]:
    """Two float tensors of different types in the coarser of the two, and a note.

    The coarser type's tolerance is the one that applies: a float16 model is not held
    to float32 accuracy, and a float32 value rounded to float16 loses nothing that the
    float16 side has.
    """
    e, g = value_dtype_name(expected), value_dtype_name(got)
    if e == g or e not in _PRECISION or g not in _PRECISION:
        return expected, got, None
    low = e if _PRECISION[e] > _PRECISION[g] else g
    dtype = getattr(torch, low)
    expected, got = to_torch(expected).to(dtype), to_torch(got).to(dtype)
    return expected, got, f"{e} vs {g}: compared in {low}"


__all__ = [
    "ONNX_RULES",
    "TRANSFORM_CAST",
    "OnnxPairingContext",
    "SameFxNode",
    "cast_value",
    "in_common_precision",
    "onnx_pairing_context",
    "pair_onnx_models",
]
