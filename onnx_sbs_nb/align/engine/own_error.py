"""A candidate node's own error: its inputs taken from the reference, so the error it adds
is told apart from the error it inherits.

The engine computes these inputs (the values of reference partners, converted to the
candidate's layout, and values computed from them where a node has no partner) and
reruns the node on them (:class:`OwnErrors`, one node or a stretch at a time); the
verdict on the result is the judge's (``judge/verdict.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...records import Record
from ...records import join_comments as _join
from ..judge.context import RuleContext
from ..judge.judging import as_candidate
from ..judge.shapes import may_prove_permuted
from ..judge.verdict import judge_own
from ..pairing.pairs import Pair, Pairing
from .sides import OnnxSide, onnx_node_name
from .stretches import OwnBatch
from .weight_blame import WeightBlame


class NotComputed:
    """An own-error value that could not be computed (the message says why)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


class Pending:
    """An own-error input that a batch computes before the node reads it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def own_error_inputs(
    cand: OnnxSide,
    pairing: Pairing,
    idx: int,
    ref_env: dict[str, Any],
    cand_env: dict[str, Any],
    own: dict[Any, Any],
    unproven: set[str] | frozenset[str] = frozenset(),
    pending: set[str] | frozenset[str] = frozenset(),
    folded: Callable[[str], bool] | None = None,
) -> tuple[list[Any], frozenset[str]] | None:
    """Inputs of candidate node ``idx`` for its own-error run, or None when one is missing.

    An input with a reference partner gets the reference value; one without gets the
    value computed from reference values upstream (``own``), so chains of nodes without
    partners are judged from the nearest reference values.  A weight is the model's own
    constant: the node is judged with it.  Pairs in ``unproven`` (the values turned out to
    differ in shape) are not partners.  Also returns the lowerings (fx nodes) other than
    the node's own that had to be recomputed that way: the own error inherits theirs.
    ``pending``: values whose own-error value a batch of nodes computes with this one
    (``stretches.py``): they come as :class:`Pending` markers.  ``folded``: whether a
    quantized weight pairs with a torch parameter the exporter folded (a BatchNorm into
    its Conv): the model's own constant too, as the torch one is no input of this node.
    """
    values = []
    taint: set[str] = set()
    group = cand.lowering[idx]
    for name in cand.graph.inputs[idx]:  # node_inputs(), listed once per model
        if not name:
            values.append(None)
        elif name in cand.initializers:
            values.append(cand.initializer(name))
        elif folded is not None and name in cand_env and name in pairing.by_onnx and folded(name):
            values.append(cand_env[name])
        elif name in pairing.by_onnx and name not in unproven:
            pair = pairing.by_onnx[name]
            key = ("ref", name)
            if key not in own:
                if pair.fx_name not in ref_env:
                    return None
                own[key] = cand.as_runner_value(as_candidate(pair, ref_env[pair.fx_name]))
            values.append(own[key])
        elif (name in own and not isinstance(own[name], NotComputed)) or name in pending:
            values.append(own[name] if name in own else Pending(name))
            taint.update(own.get(("from", name), ()))
            producer = cand.producer.get(name)
            source = cand.lowering[producer] if producer is not None else None
            if producer is not None and cand.tables.lowering_inferred:
                # a lowering inferred from the pairs is no fx node's: every node the
                # value was recomputed through may hold the error
                taint.add(onnx_node_name(cand.nodes[producer], producer))
            elif source is not None and source != group:
                taint.add(source)
            elif (
                source is None
                and group is not None
                and producer is not None
                and _computed(cand, producer)
            ):
                # a node no fx node lowers (a graph input's QuantizeLinear/DequantizeLinear
                # left unpaired) that computes on values: the error may be made there
                taint.add(onnx_node_name(cand.nodes[producer], producer))
        elif name in cand_env and name in cand.feeds:
            values.append(cand_env[name])
        else:
            return None
    return values, frozenset(taint)


def _computed(cand: Any, idx: int) -> bool:
    """Whether node ``idx`` reads a computed value (not only initializers: a weight's
    DequantizeLinear makes no error its reader could be blamed for)."""
    return any(i and i not in cand.initializers for i in cand.graph.inputs[idx])


class OwnErrors:
    """The own-error runs of one run: each candidate node rerun on the reference values
    of its inputs (values in ``own``, keyed by name; ``("ref", name)``: the reference
    input, ``("from", name)``: the lowerings it was recomputed through)."""

    def __init__(
        self,
        candidate: OnnxSide,
        pairing: Pairing,
        unproven: set[str],
        blame: WeightBlame,
        computed_in: dict[str, str],
    ) -> None:
        self.candidate, self.pairing = candidate, pairing
        self.unproven = unproven  # pairs disproved: not partners (shared with the rules)
        self.blame = blame
        self.computed_in = computed_in  # the looser dtype a value is computed from
        self.tie_axes = candidate.tables.tie_axes
        # a TopK's input, by its indices output, until those are compared (ties.py)
        self.tie_x: dict[str, tuple[int, Any]] = {}

    def rerun(
        self,
        idx: int,
        cand_env: dict[str, Any],
        ref_env: dict[str, Any],
        own: dict[Any, Any],
        main_inputs: list[Any] | None,
    ) -> None:
        """Node ``idx`` rerun alone (``main_inputs``: its inputs in the first run)."""
        cand = self.candidate
        node = cand.nodes[idx]
        found = own_error_inputs(
            cand,
            self.pairing,
            idx,
            ref_env,
            cand_env,
            own,
            self.unproven,
            folded=self.blame.folded_weight,
        )
        if found is None:
            return
        inputs, taint = found
        for o in node.output:
            if o and taint:
                own[("from", o)] = taint
        if idx in self.tie_axes:
            self.tie_x[node.output[1]] = (self.tie_axes[idx], inputs[0])
        if self.blame.reads_pending(idx):
            self.blame.probe_inputs[idx] = inputs  # to try it with the torch parameter
        if main_inputs is not None and all(a is b for a, b in zip(inputs, main_inputs)):
            # same inputs as the first run: the own error is the first error
            for o in node.output:
                if o and o in cand_env:
                    own[o] = cand_env[o]
            return
        try:
            outputs = cand.call(idx, inputs)
        except Exception as e:
            for o in node.output:
                if o:
                    own[o] = NotComputed(f"{type(e).__name__}: {e}")
            return
        for o, v in zip(node.output, outputs):
            if o:
                own[o] = v

    def rerun_stretch(
        self, stretch: Any, cand_env: dict[str, Any], ref_env: dict[str, Any], own: dict
    ) -> bool:
        """The own-error runs of a stretch's nodes as one session (``stretches.OwnBatch``);
        False where that cannot be: each node then reruns alone at its step."""
        cand, pairing = self.candidate, self.pairing
        batch = OwnBatch(stretch)
        pending: set[str] = set()
        for k in range(stretch.first, stretch.last + 1):
            if self.blame.reads_pending(k):
                return False  # a differing weight's consumer: probed alone (weight_blame.py)
            found = own_error_inputs(
                cand,
                pairing,
                k,
                ref_env,
                cand_env,
                own,
                self.unproven,
                pending,
                self.blame.folded_weight,
            )
            if found is None:
                return False
            inputs, taint = found
            outputs = cand.graph.outputs[k]
            for o in outputs:
                if o and taint:
                    own[("from", o)] = taint
            main = cand.inputs(k, cand_env)
            if all(a is b for a, b in zip(inputs, main)):
                for o in outputs:  # the first run's inputs: its values are the own values
                    if o:
                        own[o] = cand_env[o]
                continue
            for name, value in zip(cand.graph.inputs[k], inputs):
                p = pairing.by_onnx.get(name)
                if (
                    p is not None
                    and type(value) is not Pending
                    and name in cand_env
                    and (
                        getattr(value, "shape", None) != getattr(cand_env[name], "shape", None)
                        or (
                            stretch.first <= cand.producer.get(name, -1) < k
                            and may_prove_permuted(p, cand_env[name])
                        )
                    )
                ):
                    return False  # a pair the comparison may disprove: one node at a time
            if not batch.add(k, inputs, Pending):
                return False
            pending.update(o for o in outputs if o)
        try:
            values = batch.run(cand) if batch.nodes else []
        except Exception:
            return False
        for k, outs in zip(batch.nodes, values):
            for o, value in zip(cand.graph.outputs[k], outs):
                if o:
                    own[o] = value
        return True

    def judge(
        self, rec: Record, pair: Pair, name: str, want: Any, own: dict, ctx: RuleContext
    ) -> None:
        """The own error on the record of pair ``name``: its rerun against the torch value
        ``want`` (``judge/verdict.judge_own``)."""
        own_value = own.get(name)
        if own_value is None or name not in self.candidate.producer:
            return
        taint = own.get(("from", name))
        if taint:
            rec.own_inputs_from = ", ".join(sorted(taint))
        if isinstance(own_value, NotComputed):
            rec.comment = _join(rec.comment, f"rerun on torch inputs failed: {own_value.message}")
            return
        ctx.own_inherited = self.computed_in.get(name)
        ctx.own_tie = self.tie_x.pop(name, None) if self.tie_x else None
        judge_own(rec, pair, want, own_value, ctx)


__all__ = ["NotComputed", "OwnErrors", "Pending", "own_error_inputs"]
