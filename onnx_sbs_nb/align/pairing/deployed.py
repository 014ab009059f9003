"""The candidate as deployed: the graph onnxruntime runs after its optimizations.

With ``optimize=`` (and ``providers=``) a run's candidate is not the ONNX model as given
but the model onnxruntime executes at that level on those providers
(:func:`~onnx_sbs_nb.align.pairing.optimized.optimize_model`); its nodes run one at a time as
usual.  :func:`deploy` makes the swap; :class:`Deployment` then tells the run what the
optimizers did, so the records say it:

- a value written by a fused or rewritten node: the comment names the original nodes
  the node replaced;
- a reference value whose partner the fusion made internal (computed inside a fused
  kernel, no longer a value of the graph): status ``internal`` and "internal to fused
  node X (op)", never an unpaired value;
- an original value onnxruntime computes anew under another name and type (a float16
  node run in float32 between Casts on CPU): paired with the new value through a cast
  by rule ``renamed`` (:class:`ThroughRenames`), compared in the coarser type, the
  comment saying so;
- a value onnxruntime created (a layout Transpose, a precision Cast): the comment says
  which fused node it belongs to.

One module serves both runs that compare a deployed graph: the program against it
(``AlignedRun``) and another ONNX model against it (``two_models.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from ...records import STATUS_INTERNAL, STATUS_UNPAIRED_EP, Record
from ...records import join_comments as _join
from .graph_map import NODE_FUSED, NODE_INSERTED, NODE_REWRITTEN, NODE_UNCHANGED, OptimizedNode
from .onnx_pairing import _compatibility
from .optimized import OptimizedModel, optimize_model
from .pairs import Pair, Pairing
from .rules import PairingStep, RenamedRule
from .values import TRANSFORM_CAST, onnx_value_types


@dataclass
class DeployedPairingContext:
    """What the rules of the deployed graph read: the pairing of the reference with the
    optimized model (which they complete), the pairing with the model as given, and what
    onnxruntime renamed."""

    pairing: Pairing  # reference vs the optimized model
    original: Pairing  # reference vs the model as given
    renamed: Mapping[str, str]  # original value -> the optimized value computing it anew
    original_types: dict[str, tuple[int, int | None]]
    types: dict[str, tuple[int, int | None]]  # the optimized model's
    notes: dict[str, str] = field(default_factory=dict)  # optimized value -> comment


class ThroughRenames(RenamedRule):
    """A value onnxruntime computes anew under another name (a float16 node run in float32
    between Casts) pairs with the reference partner of the original value, through a cast
    when the types differ."""

    def run(self, ctx: DeployedPairingContext) -> None:
        for old, new in ctx.renamed.items():
            p = ctx.original.by_onnx.get(old)
            if p is None or new in ctx.pairing.by_onnx or p.fx_name in ctx.pairing.by_fx:
                continue
            ok, transform = _compatibility(ctx.original_types.get(old), ctx.types.get(new))
            if not ok:
                continue
            cast_to = ctx.types[new][0] if transform == TRANSFORM_CAST else None
            ctx.pairing.add(Pair(new, p.fx_name, self.name, p.kind, transform, cast_to))
            ctx.notes[new] = (
                f"onnxruntime computes {old!r} as {new!r}"
                + (f" ({_type_name(ctx.types[new][0])})" if new in ctx.types else "")
                + f"; paired through it (its original paired by {p.rule})"
            )


# The deployed graph's own pairing, run after the ordinary one on the optimized model
# (each record's paired_by is the name of the rule that paired it).
DEPLOYED_RULES: tuple[PairingStep, ...] = (ThroughRenames(),)


@dataclass
class Deployment:
    """The optimized candidate of a run and what its records should say about it."""

    optimized: OptimizedModel
    internal: dict[str, str] = field(default_factory=dict)  # reference value -> comment
    notes: dict[str, str] = field(default_factory=dict)  # candidate value -> comment

    @property
    def model(self) -> onnx.ModelProto:
        """The model the run executes (optimized, metadata carried over)."""
        return self.optimized.model

    @property
    def original(self) -> onnx.ModelProto:
        return self.optimized.original

    def link(self, pairing: Pairing, original: Pairing) -> None:
        """Completes ``pairing`` (reference vs optimized) from ``original`` (reference vs
        the model as given) and prepares the comments.

        Values onnxruntime renamed pair with the reference partner of their original
        name (the rules of :data:`DEPLOYED_RULES`); reference values whose partner the
        fusion made internal are noted.
        """
        om = self.optimized
        ctx = DeployedPairingContext(
            pairing, original, om.renamed, onnx_value_types(om.original), onnx_value_types(om.model)
        )
        for step in DEPLOYED_RULES:
            step.pair(ctx)
        for value, note in ctx.notes.items():
            self.notes[value] = _join(self.notes.get(value), note)
        self._note_internal(pairing, original)
        self._note_nodes()

    def _note_internal(self, pairing: Pairing, original: Pairing) -> None:
        om = self.optimized
        nodes = {n.name: n for n in om.nodes}
        for value, node_name in om.internal.items():
            p = original.by_onnx.get(value)
            if p is None or p.fx_name in pairing.by_fx:
                continue
            node = nodes.get(node_name)
            what = f"{node_name!r} ({_op(node)})" if node is not None else repr(node_name)
            self.internal[p.fx_name] = (
                f"internal to fused node {what}: onnxruntime ({self._where()}) computes "
                f"{value!r} inside it, so the graph has no such value to compare"
            )

    def _note_nodes(self) -> None:
        """What onnxruntime did to each node and each new constant, per value."""
        om = self.optimized
        nodes = {n.name: n for n in om.nodes}
        consumers: dict[str, list[OptimizedNode]] = {}
        for node, proto in zip(om.nodes, om.model.graph.node):
            note = self._node_note(node, nodes)
            if note:
                for o in proto.output:
                    if o:
                        self.notes[o] = _join(note, self.notes.get(o))
            for i in proto.input:
                consumers.setdefault(i, []).append(nodes.get(node.group or "", node))
        folded = {v: k for k, v in om.folded.items()}
        given = {i.name for i in om.original.graph.initializer}
        for init in om.model.graph.initializer:
            if init.name in given:
                continue
            users = ", ".join(
                dict.fromkeys(f"{n.name} ({_op(n)})" for n in consumers.get(init.name, ()))
            )
            if init.name in folded:
                note = (
                    f"folded by onnxruntime ({self._where()}): the output of "
                    f"{folded[init.name]}, computed once"
                )
            else:
                note = f"a constant onnxruntime ({self._where()}) created"
            self.notes[init.name] = note + (f" for {users}" if users else "")

    def annotate(self, rec: Record) -> None:
        """Adds to a record what the optimizers did to its values (called per record)."""
        if rec.status == STATUS_UNPAIRED_EP and rec.ep_name in self.internal:
            rec.status = STATUS_INTERNAL
            rec.comment = _join(self.internal[rec.ep_name], rec.comment)
            return
        if rec.onnx_name is not None and rec.onnx_name in self.notes:
            rec.comment = _join(rec.comment, self.notes[rec.onnx_name])

    def summary(self) -> dict[str, Any]:
        """JSON-safe: what was deployed (for the run's status and reports)."""
        om = self.optimized
        return {
            "level": om.level,
            "providers": [p if isinstance(p, str) else p[0] for p in om.providers],
            "applied": list(om.applied),
            "changed": [n.name for n in om.changed],
            "internal": len(om.internal),
            "notes": list(om.notes),
        }

    def _where(self) -> str:
        om = self.optimized
        providers = ", ".join(p if isinstance(p, str) else p[0] for p in om.providers)
        return f"level {om.level!r} on {providers}"

    def _node_note(self, node: OptimizedNode, nodes: Mapping[str, OptimizedNode]) -> str | None:
        main = nodes.get(node.group or node.name, node)
        if main is not node:  # a member of a group: an inserted layout or precision node
            if main.kind == NODE_UNCHANGED:
                return None
            return (
                f"{node.op_type} inserted by onnxruntime ({self._where()}) as part of "
                f"{main.kind} node {main.name} ({_op(main)})"
            )
        replaced = ", ".join(node.replaced)
        if node.kind == NODE_FUSED:
            return f"fused by onnxruntime ({self._where()}): {_op(node)} replaces {replaced}"
        if node.kind == NODE_REWRITTEN:
            return f"rewritten by onnxruntime ({self._where()}) from {replaced}"
        if node.kind == NODE_INSERTED:
            return f"{node.op_type} inserted by onnxruntime ({self._where()})"
        return None


def deploy(model: onnx.ModelProto, options: Any) -> Deployment | None:
    """The deployed candidate for ``options.optimize`` / ``providers``, or None."""
    level = getattr(options, "optimize", None)
    if level is None:
        return None
    return Deployment(optimize_model(model, level, options.providers))


def _op(node: OptimizedNode | None) -> str:
    if node is None:
        return "?"
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def _type_name(elem: int) -> str:
    return onnx.TensorProto.DataType.Name(elem).lower()


__all__ = ["DEPLOYED_RULES", "DeployedPairingContext", "Deployment", "ThroughRenames", "deploy"]
