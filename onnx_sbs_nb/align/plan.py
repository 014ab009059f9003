"""The plan: everything about a side-by-side run that needs no tensor.

It orders the work so each ONNX node runs as soon as the fx values it is compared with
(and, when rerunning or resetting, the fx values of its inputs) exist, places every
comparison at the step where the later of its two values appears, and knows after which
step each value (on either side) is no longer needed, so the run frees it there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx
import torch

from .names import Pairing

FX = 0
ONNX = 1


@dataclass
class Plan:
    steps: list[tuple[int, int]]  # (FX | ONNX, index of the node on that side)
    fx_nodes: list[torch.fx.Node]
    onnx_nodes: list[onnx.NodeProto]
    # comparisons to make right after a step: step -> onnx value names
    compare_at: dict[int, list[str]] = field(default_factory=dict)
    # values to free after a step
    free_fx_at: dict[int, list[str]] = field(default_factory=dict)
    free_onnx_at: dict[int, list[str]] = field(default_factory=dict)
    fx_step: dict[str, int] = field(default_factory=dict)  # fx name -> producing step
    onnx_step: dict[str, int] = field(default_factory=dict)  # onnx value -> producing step
    fx_index: dict[str, int] = field(default_factory=dict)  # fx name -> position in graph
    onnx_producer: dict[str, int] = field(default_factory=dict)  # value -> node position

    @property
    def n_steps(self) -> int:
        return len(self.steps)


def _fx_inputs(node: torch.fx.Node) -> list[str]:
    return [n.name for n in node.all_input_nodes]


def build_plan(
    graph: torch.fx.Graph,
    model: onnx.ModelProto,
    pairing: Pairing,
    free_variables,
    needs_torch_inputs: bool,
    keep_fx: set[str] | None = None,
    keep_onnx: set[str] | None = None,
    stop_after_onnx: int | None = None,
) -> Plan:
    """Builds the schedule.

    ``free_variables(node)`` lists the outer-scope names a node's subgraphs read.
    ``needs_torch_inputs``: each ONNX node also waits for the fx partners of its inputs
    (own-error reruns and resets feed them to the node).  ``keep_*``: values never freed
    (post-run actions collect them).  ``stop_after_onnx``: the plan ends after that ONNX
    node (post-run actions need no more).
    """
    fx_nodes = [n for n in graph.nodes if n.op != "output"]
    onnx_nodes = list(model.graph.node)
    if stop_after_onnx is not None:
        onnx_nodes = onnx_nodes[: stop_after_onnx + 1]
    fx_index = {n.name: i for i, n in enumerate(fx_nodes)}
    plan = Plan([], fx_nodes, onnx_nodes, fx_index=fx_index)
    steps = plan.steps
    onnx_available_at_start = {i.name for i in model.graph.initializer} | {
        i.name for i in model.graph.input
    }

    def partner_index(onnx_name: str) -> int:
        p = pairing.by_onnx.get(onnx_name)
        return fx_index.get(p.fx_name, -1) if p is not None else -1

    # fx placeholders first: weights and inputs are compared before any node runs
    fx_pos = 0
    while fx_pos < len(fx_nodes) and fx_nodes[fx_pos].op == "placeholder":
        steps.append((FX, fx_pos))
        fx_pos += 1
    last_needed_fx = -1
    for k, node in enumerate(onnx_nodes):
        need = max((partner_index(o) for o in node.output if o), default=-1)
        if needs_torch_inputs:
            need = max([need, *(partner_index(i) for i in node.input if i)])
        last_needed_fx = max(last_needed_fx, need)
        while fx_pos <= need:
            steps.append((FX, fx_pos))
            fx_pos += 1
        steps.append((ONNX, k))
    if stop_after_onnx is None:
        end_fx = len(fx_nodes)
    else:
        end_fx = last_needed_fx + 1
        if keep_fx:
            end_fx = max(end_fx, *(fx_index[n] + 1 for n in keep_fx if n in fx_index))
    while fx_pos < end_fx:
        steps.append((FX, fx_pos))
        fx_pos += 1

    for s, (side, idx) in enumerate(steps):
        if side == FX:
            plan.fx_step[fx_nodes[idx].name] = s
        else:
            for o in onnx_nodes[idx].output:
                if o:
                    plan.onnx_step[o] = s
                    plan.onnx_producer[o] = idx
    for name in onnx_available_at_start:
        plan.onnx_step.setdefault(name, -1)

    last_fx: dict[str, int] = {}
    last_onnx: dict[str, int] = {}
    # comparisons
    for onnx_name, pair in pairing.by_onnx.items():
        if onnx_name not in plan.onnx_step or pair.fx_name not in plan.fx_step:
            continue
        s = max(plan.onnx_step[onnx_name], plan.fx_step[pair.fx_name], 0)
        plan.compare_at.setdefault(s, []).append(onnx_name)
        last_fx[pair.fx_name] = max(last_fx.get(pair.fx_name, -1), s)
        last_onnx[onnx_name] = max(last_onnx.get(onnx_name, -1), s)
    # consumers
    for s, (side, idx) in enumerate(steps):
        if side == FX:
            for name in _fx_inputs(fx_nodes[idx]):
                last_fx[name] = max(last_fx.get(name, -1), s)
        else:
            node = onnx_nodes[idx]
            for name in [*node.input, *free_variables(node)]:
                if not name:
                    continue
                last_onnx[name] = max(last_onnx.get(name, -1), s)
                if needs_torch_inputs:
                    p = pairing.by_onnx.get(name)
                    if p is not None:
                        last_fx[p.fx_name] = max(last_fx.get(p.fx_name, -1), s)
    # values never used are freed right after they appear
    for name, s in plan.fx_step.items():
        last_fx.setdefault(name, s)
    for name, s in plan.onnx_step.items():
        last_onnx.setdefault(name, max(s, 0))
    keep_fx = keep_fx or set()
    keep_onnx = keep_onnx or set()
    for name, s in last_fx.items():
        if name not in keep_fx:
            plan.free_fx_at.setdefault(s, []).append(name)
    for name, s in last_onnx.items():
        if name not in keep_onnx:
            plan.free_onnx_at.setdefault(s, []).append(name)
    return plan
