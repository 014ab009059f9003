"""The plan: everything about a side-by-side run that needs no tensor.

A run has two sides: the *reference* (what the values should be: the torch program, or an
ONNX model on a trusted runtime) and the *candidate* (the ONNX model being judged, run
node by node).  The plan orders the work so each candidate node runs as soon as the
reference values it is compared with (and, when the candidate is fed reference values,
those of its inputs) exist, places every comparison at the step where the later of its
two values appears, and knows after which step each value (on either side) is no longer
needed, so the run frees it there.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import onnx
import torch

from ..pairing.pairs import Pairing

REF = 0
CAND = 1


@dataclass
class SideGraph:
    """The structure of one side, enough to schedule it: the names each node reads and
    writes, by node index.  Tuples of strings, not objects: the cyclic collector stops
    tracking those, and a large graph has two per node."""

    inputs: list[tuple[str, ...]]
    outputs: list[tuple[str, ...]]
    available: set[str] = field(default_factory=set)  # values that exist before any node
    leading: int = 0  # nodes that run before anything else (fx placeholders)

    def __len__(self) -> int:
        return len(self.outputs)

    @classmethod
    def of_fx(cls, graph: torch.fx.Graph) -> SideGraph:
        nodes = [n for n in graph.nodes if n.op != "output"]
        leading = 0
        while leading < len(nodes) and nodes[leading].op == "placeholder":
            leading += 1
        inputs = [tuple(a.name for a in n.all_input_nodes) for n in nodes]
        return cls(inputs, [(n.name,) for n in nodes], set(), leading)

    @classmethod
    def of_onnx(
        cls,
        model: onnx.ModelProto,
        free_variables: Callable[[onnx.NodeProto], Sequence[str]] = lambda n: (),
    ) -> SideGraph:
        g = model.graph
        inputs = [(*n.input, *free_variables(n)) for n in g.node]
        outputs = [tuple(n.output) for n in g.node]
        available = {i.name for i in g.initializer} | {i.name for i in g.input}
        return cls(inputs, outputs, available, 0)


@dataclass
class Plan:
    steps: list[tuple[int, int]]  # (REF | CAND, index of the node on that side)
    # comparisons to make right after a step: step -> candidate value names
    compare_at: dict[int, Sequence[str]] = field(default_factory=dict)
    # values to free after a step
    free_ref_at: dict[int, Sequence[str]] = field(default_factory=dict)
    free_cand_at: dict[int, Sequence[str]] = field(default_factory=dict)
    ref_step: dict[str, int] = field(default_factory=dict)  # ref value -> producing step
    cand_step: dict[str, int] = field(default_factory=dict)  # candidate value -> step
    ref_producer: dict[str, int] = field(default_factory=dict)  # ref value -> node index
    cand_producer: dict[str, int] = field(default_factory=dict)  # candidate value -> node

    @property
    def n_steps(self) -> int:
        return len(self.steps)


def schedule(
    ref: SideGraph,
    cand: SideGraph,
    pairing: Pairing,
    needs_reference_inputs: bool,
    keep_ref: set[str] | None = None,
    keep_cand: set[str] | None = None,
    stop_after_cand: int | None = None,
    units: Sequence[tuple[int, int]] = (),
    hold: Mapping[str, Sequence[str]] | None = None,
) -> Plan:
    """Builds the schedule of a run.

    ``needs_reference_inputs``: each candidate node also waits for the reference partners
    of its inputs (own-error runs and resets feed them to the node).  ``keep_*``: values
    never freed (post-run actions collect them).  ``stop_after_cand``: the plan ends after
    that candidate node (post-run actions need no more).  ``units``: ranges of candidate
    nodes (first, last) that run together (``stretches.py``): the first waits for what
    any of them waits for, so no reference node runs between them.  ``hold``: candidate
    values kept until a pair is compared (the values the QDQ pairs inside its own rerun
    quantize, ``judge/saturation.py``: does one clip?).
    """
    ref_producer = {o: i for i, outs in enumerate(ref.outputs) for o in outs if o}
    plan = Plan([], ref_producer=ref_producer)
    _order_steps(plan, ref, cand, pairing, needs_reference_inputs, keep_ref, stop_after_cand, units)
    last_ref, last_cand = _last_uses(plan, ref, cand, pairing, needs_reference_inputs)
    _keep_rounded_inputs(plan, cand, pairing, last_ref)
    _compare_and_free(
        plan, pairing, last_ref, last_cand, keep_ref or set(), keep_cand or set(), hold or {}
    )
    return plan


_RECOMPUTED = 4  # nodes without a partner the precision-loss rule recomputes (at most)


def _keep_rounded_inputs(
    plan: Plan, cand: SideGraph, pairing: Pairing, last_ref: dict[str, int]
) -> None:
    """In a model computing in a coarser type than its reference (cast pairs), a value is
    judged with the reference values of its node's inputs too (``judge/precision_loss.py``:
    is its error their rounding? a rerun on them): they live until it is compared."""
    by_onnx, ref_step, cand_step = pairing.by_onnx, plan.ref_step, plan.cand_step
    if not any(p.cast_to is not None for p in by_onnx.values()):
        return  # no value computed in a coarser type: nothing for the rule to judge
    for name, pair in by_onnx.items():
        if name not in cand_step or pair.fx_name not in ref_step:
            continue
        idx = plan.cand_producer.get(name)
        if idx is None:
            continue
        s = max(cand_step[name], ref_step[pair.fx_name], 0)
        # through values without a partner too (the rule recomputes a few of them)
        todo, depth = list(cand.inputs[idx]), 0
        while todo and depth <= _RECOMPUTED:
            depth += 1
            behind = []
            for i in todo:
                p = by_onnx.get(i) if i else None
                if p is not None:
                    if p.fx_name in ref_step and last_ref.get(p.fx_name, -1) < s:
                        last_ref[p.fx_name] = s
                elif i and i in plan.cand_producer:
                    behind.extend(cand.inputs[plan.cand_producer[i]])
            todo = behind


def _order_steps(
    plan: Plan,
    ref: SideGraph,
    cand: SideGraph,
    pairing: Pairing,
    needs_reference_inputs: bool,
    keep_ref: set[str] | None,
    stop_after_cand: int | None,
    units: Sequence[tuple[int, int]],
) -> None:
    """The steps: each candidate node as soon as the reference nodes it waits for ran."""
    n_cand = len(cand) if stop_after_cand is None else min(len(cand), stop_after_cand + 1)
    ref_producer = plan.ref_producer
    steps = plan.steps
    by_onnx = pairing.by_onnx
    # candidate value -> index of the reference node making its partner (-1: none)
    partner = {}
    for name, p in by_onnx.items():
        partner[name] = ref_producer.get(p.fx_name, -1)

    # leading reference nodes first: weights and inputs are compared before any node runs
    ref_pos = 0
    while ref_pos < ref.leading:
        steps.append((REF, ref_pos))
        ref_pos += 1
    last_needed_ref = -1
    needs = []
    for k in range(n_cand):
        need = max([partner.get(o, -1) for o in cand.outputs[k] if o], default=-1)
        if needs_reference_inputs:
            need = max([need, *(partner.get(i, -1) for i in cand.inputs[k] if i)])
        needs.append(need)
    for first, last in units:
        if first < n_cand:
            needs[first] = max(needs[first : last + 1])
    for k, need in enumerate(needs):
        if need > last_needed_ref:
            last_needed_ref = need
        while ref_pos <= need:
            steps.append((REF, ref_pos))
            ref_pos += 1
        steps.append((CAND, k))
    if stop_after_cand is None:
        end_ref = len(ref)
    else:
        end_ref = last_needed_ref + 1
        if keep_ref:
            end_ref = max(end_ref, *(ref_producer[n] + 1 for n in keep_ref if n in ref_producer))
    while ref_pos < end_ref:
        steps.append((REF, ref_pos))
        ref_pos += 1


def _last_uses(
    plan: Plan, ref: SideGraph, cand: SideGraph, pairing: Pairing, needs_reference_inputs: bool
) -> tuple[dict[str, int], dict[str, int]]:
    """Where each value appears (into ``plan``) and the last step reading it, per side."""
    steps, by_onnx = plan.steps, pairing.by_onnx
    # One walk: where each value appears, and the last step reading it (steps only grow,
    # so the last assignment is the latest use).
    ref_step, cand_step, cand_producer = plan.ref_step, plan.cand_step, plan.cand_producer
    last_ref: dict[str, int] = {}
    last_cand: dict[str, int] = {}
    ref_inputs, ref_outputs = ref.inputs, ref.outputs
    cand_inputs, cand_outputs = cand.inputs, cand.outputs
    for s, (side, idx) in enumerate(steps):
        if side == REF:
            for o in ref_outputs[idx]:
                if o:
                    ref_step[o] = s
            for name in ref_inputs[idx]:
                if name:
                    last_ref[name] = s
        else:
            for o in cand_outputs[idx]:
                if o:
                    cand_step[o] = s
                    cand_producer[o] = idx
            for name in cand_inputs[idx]:
                if not name:
                    continue
                last_cand[name] = s
                if needs_reference_inputs:
                    p = by_onnx.get(name)
                    if p is not None:
                        last_ref[p.fx_name] = s
    for name in ref.available:
        ref_step.setdefault(name, -1)
    for name in cand.available:
        cand_step.setdefault(name, -1)
    return last_ref, last_cand


def _compare_and_free(
    plan: Plan,
    pairing: Pairing,
    last_ref: dict[str, int],
    last_cand: dict[str, int],
    keep_ref: set[str],
    keep_cand: set[str],
    hold: Mapping[str, Sequence[str]],
) -> None:
    """Each pair compared at the step both values exist; each value freed after its last
    use (the comparison included, and the comparisons that ``hold`` it), unless kept."""
    ref_step, cand_step, by_onnx = plan.ref_step, plan.cand_step, pairing.by_onnx
    compare_at: dict[int, list[str]] = {}
    free_ref_at: dict[int, list[str]] = {}
    free_cand_at: dict[int, list[str]] = {}
    for name, pair in by_onnx.items():
        if name not in cand_step or pair.fx_name not in ref_step:
            continue
        s = max(cand_step[name], ref_step[pair.fx_name], 0)
        compare_at.setdefault(s, []).append(name)
        if last_ref.get(pair.fx_name, -1) < s:
            last_ref[pair.fx_name] = s
        if last_cand.get(name, -1) < s:
            last_cand[name] = s
        for held in hold.get(name, ()):
            if held in cand_step and last_cand.get(held, -1) < s:
                last_cand[held] = s
    # values never used are freed right after they appear
    for name, s in ref_step.items():
        if name not in last_ref:
            last_ref[name] = max(s, 0)
    for name, s in cand_step.items():
        if name not in last_cand:
            last_cand[name] = max(s, 0)
    for name, s in last_ref.items():
        if name not in keep_ref:
            free_ref_at.setdefault(s, []).append(name)
    for name, s in last_cand.items():
        if name not in keep_cand:
            free_cand_at.setdefault(s, []).append(name)
    # read-only from here: tuples, which the cyclic collector stops tracking
    plan.compare_at = {s: tuple(names) for s, names in compare_at.items()}
    plan.free_ref_at = {s: tuple(names) for s, names in free_ref_at.items()}
    plan.free_cand_at = {s: tuple(names) for s, names in free_cand_at.items()}


def build_plan(
    graph: torch.fx.Graph,
    model: onnx.ModelProto,
    pairing: Pairing,
    free_variables: Callable[[onnx.NodeProto], Sequence[str]],
    needs_torch_inputs: bool,
    **kwargs,
) -> Plan:
    """The plan of a torch program (reference) against an ONNX model (candidate)."""
    return schedule(
        SideGraph.of_fx(graph),
        SideGraph.of_onnx(model, free_variables),
        pairing,
        needs_torch_inputs,
        **kwargs,
    )
