"""Post-run actions on a run's parts: node details, a node rerun in torch, replay bundles.

They need the plan, the program and the model, not the stream's state: each one
recomputes the few values it needs by running both sides up to the node again, keeping
only those values, so memory stays bounded like a run's, at the cost of a partial rerun.
Nodes are found by identity (their position in the graph); a name is accepted only when it
names one node unambiguously.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ...compare.diff import compare
from ...compare.value_facts import shape_type
from ...convert import to_torch
from ...errors import SbsInputError
from ...records import Record
from ..engine.plan import REF, schedule
from ..engine.runners import TorchRunner
from ..engine.sides import fx_target_name, onnx_node_name
from ..source.fx_metadata import fx_name_from_metadata


@dataclass
class NodeValues:
    """What an action needs about one ONNX node, recomputed."""

    index: int
    node: onnx.NodeProto
    torch_inputs: dict[str, Any] = field(default_factory=dict)  # ONNX name -> torch value
    onnx_inputs: dict[str, Any] = field(default_factory=dict)  # ONNX name -> first-run value
    own_inputs: dict[str, Any] = field(default_factory=dict)  # computed from torch values
    expected: dict[str, Any] = field(default_factory=dict)  # output -> torch value
    first_run: dict[str, Any] = field(default_factory=dict)  # output -> first-run value
    mapping: dict[str, str] = field(default_factory=dict)  # ONNX name -> fx name


class RunActions:
    """The actions on one run, given its parts (not the run: this module and the run kinds
    above it do not import each other).

    ``reference``, ``candidate``: the run's two sides (fx and ONNX); ``pairing``: which
    values pair; ``atol``, ``rtol``: the run's tolerances; ``options``: its RunOptions
    (the replay config); ``records``: its records so far (the list, read when used).
    """

    def __init__(
        self,
        reference: Any,
        candidate: Any,
        pairing: Any,
        *,
        atol: float | None,
        rtol: float | None,
        options: Any,
        records: Sequence[Record],
    ) -> None:
        self.ref = reference
        self.cand = candidate
        self.pairing = pairing
        self.atol, self.rtol = atol, rtol
        self.options = options
        self.records = records

    # ------------------------------------------------------------ finding nodes
    def find_node(self, node: int | str | Record) -> tuple[int, onnx.NodeProto]:
        """An ONNX node by position, by a record, or by one unambiguous name.

        A name may be a node name, an output value name, or an fx node name paired with
        an output; when it names two different nodes (a node called like another node's
        output), the error lists both and asks for the position.
        """
        nodes = self.cand.nodes
        if isinstance(node, Record):
            k = node.onnx_id_node
            if k is None or k < 0:
                raise SbsInputError(
                    f"{node.ep_name or node.onnx_name!r} is not the output of an ONNX node "
                    "(graph inputs and initializers cannot be rerun or replayed)"
                )
            return k, nodes[k]
        if isinstance(node, int) and not isinstance(node, bool):
            if not 0 <= node < len(nodes):
                raise SbsInputError(f"node position {node} is out of range (0..{len(nodes) - 1})")
            return node, nodes[node]
        if not isinstance(node, str) or not node:
            raise SbsInputError(f"expected an ONNX node (position or name), got {node!r}")
        by_name = [k for k, n in enumerate(nodes) if n.name == node]
        by_output = [self.cand.producer[node]] if node in self.cand.producer else []
        hits = sorted(set(by_name) | set(by_output))
        if not hits:
            pairs = self.pairing.by_fx.get(node) or ()
            hits = sorted(
                {
                    self.cand.producer[p.onnx_name]
                    for p in pairs
                    if p.onnx_name in self.cand.producer
                }
            )
        if len(hits) > 1:
            which = ", ".join(
                f"#{k} {onnx_node_name(nodes[k], k)} [{nodes[k].op_type}]" for k in hits
            )
            raise SbsInputError(
                f"{node!r} names several ONNX nodes ({which}): give the node's position "
                "(Record.onnx_id_node)"
            )
        if not hits:
            raise SbsInputError(
                f"no ONNX node is named {node!r} or produces a value named so "
                "(use a node name, an output name, or an fx node name from the records)"
            )
        return hits[0], nodes[hits[0]]

    # ------------------------------------------------------------ recomputing
    def recompute(
        self,
        fx_names: set[str],
        onnx_names: set[str],
        upto: int,
        own_names: set[str] = frozenset(),
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """Runs both sides up to candidate node ``upto``, keeping only the named values.

        Returns the torch values, the first-run ONNX values and, for ``own_names``, the
        values computed from torch inputs as the run's own-error pass computes them.
        """
        from ..engine.own_error import NotComputed, own_error_inputs

        ref, cand = self.ref, self.cand
        want_own = bool(own_names)
        plan = schedule(
            ref.graph,
            cand.graph,
            self.pairing,
            needs_reference_inputs=want_own,
            keep_ref=set(fx_names),
            keep_cand=set(onnx_names) | set(own_names),
            stop_after_cand=max(upto, 0) if upto >= 0 else -1,
        )
        ref_env: dict[str, Any] = {}
        cand_env: dict[str, Any] = cand.initial_env()
        own: dict[Any, Any] = {}
        import torch

        with torch.no_grad():
            for s, (side, idx) in enumerate(plan.steps):
                if side == REF:
                    try:
                        for o, v in zip(ref.graph.outputs[idx], ref.run(idx, ref_env)):
                            ref_env[o] = v
                    except Exception:
                        pass  # a value that failed in the run fails here too: left out
                else:
                    node = cand.nodes[idx]
                    try:
                        inputs = cand.inputs(idx, cand_env)
                        for o, v in zip(node.output, cand.call(idx, inputs)):
                            if o:
                                cand_env[o] = v
                    except Exception:
                        inputs = None
                    if want_own:
                        found = own_error_inputs(cand, self.pairing, idx, ref_env, cand_env, own)
                        if found is not None:
                            try:
                                outs = cand.call(idx, found[0])
                            except Exception as e:
                                outs = [NotComputed(str(e))] * len(node.output)
                            for o, v in zip(node.output, outs):
                                if o:
                                    own[o] = v
                for name in plan.free_ref_at.get(s, ()):
                    ref_env.pop(name, None)
                for name in plan.free_cand_at.get(s, ()):
                    cand_env.pop(name, None)
                    cand.forget(name)
                    own.pop(name, None)
                    own.pop(("ref", name), None)
        onnx_values = {}
        for n in onnx_names:
            if n in cand_env:
                onnx_values[n] = cand_env[n]
            elif n in cand.initializers:
                onnx_values[n] = cand.initializer(n)
        own_values = {
            n: own[n] for n in own_names if n in own and not isinstance(own[n], NotComputed)
        }
        return {n: ref_env[n] for n in fx_names if n in ref_env}, onnx_values, own_values

    def node_values(self, k: int, inputs: list[str], own: bool = False) -> NodeValues:
        """What must be recomputed for candidate node ``k`` fed with ``inputs``: the torch
        values of those inputs (and of the node's outputs), their first-run values, and,
        with ``own``, the own-error values of inputs that have no torch partner."""
        from ..judge.judging import as_candidate

        node = self.cand.nodes[k]
        outputs = [o for o in node.output if o]
        by_onnx = self.pairing.by_onnx
        inits = self.cand.initializers

        def partner(name: str) -> Any:
            p = by_onnx.get(name)
            return p if p is not None and name not in inits else None

        fx_needed = {partner(n).fx_name for n in [*inputs, *outputs] if partner(n) is not None}
        unpartnered = {n for n in inputs if partner(n) is None and n not in inits}
        fx_vals, onnx_vals, own_vals = self.recompute(
            fx_needed, set(inputs) | set(outputs), k, unpartnered if own else set()
        )
        result = NodeValues(k, node, own_inputs=own_vals)
        for name in inputs:
            p = partner(name)
            if p is not None and p.fx_name in fx_vals:
                result.torch_inputs[name] = to_torch(as_candidate(p, fx_vals[p.fx_name]))
                result.mapping[name] = p.fx_name
            if name in onnx_vals:
                result.onnx_inputs[name] = to_torch(onnx_vals[name])
        for o in outputs:
            p = partner(o)
            if p is not None and p.fx_name in fx_vals:
                result.expected[o] = to_torch(as_candidate(p, fx_vals[p.fx_name]))
                result.mapping[o] = p.fx_name
            if o in onnx_vals:
                result.first_run[o] = to_torch(onnx_vals[o])
        return result

    # ------------------------------------------------------------ the actions
    def rerun_in_torch(self, node: int | str | Record, device: str = "cpu") -> dict[str, Any]:
        """Reruns one ONNX node in the torch evaluator, fed as the own-error run feeds it.

        Inputs with a torch partner get the torch value; inputs without one get the value
        computed from torch values upstream (the own error's definition); weights are the
        model's own.  The outputs are compared with torch (``err_abs_vs_torch``: the
        node's own error in the torch evaluator) and with the run's first value.
        """
        from ...device import device_name

        device = device_name(device)
        k, node_proto = self.find_node(node)
        inputs = [n for n in self.cand.node_inputs(node_proto) if n]
        values = self.node_values(k, inputs, own=True)
        result: dict[str, Any] = {
            "node": onnx_node_name(node_proto, k),
            "onnx_id_node": k,
            "op_type": node_proto.op_type,
            "device": device,
            "outputs": [],
            "error": None,
        }
        feeds = []
        for name in self.cand.node_inputs(node_proto):
            if not name:
                feeds.append(None)
            elif name in self.cand.initializers:
                feeds.append(to_torch(self.cand.initializer(name), device))
            elif name in values.torch_inputs:
                feeds.append(values.torch_inputs[name].to(device))
            elif name in values.own_inputs:
                feeds.append(to_torch(values.own_inputs[name], device))
            elif name in self.cand.feeds:
                feeds.append(to_torch(self.cand.leaf_value(name), device))
            else:
                result["error"] = (
                    f"input {name!r} is not available: it has no torch partner and could not "
                    "be computed from torch values"
                )
                return result
        t = time.perf_counter()
        try:
            fn = TorchRunner(device).prepare(node_proto, self.cand.ctx)
            outs = fn(feeds)
        except Exception as e:
            result["error"] = f"{type(e).__name__}: {e}"
            return result
        result["time"] = time.perf_counter() - t
        atol, rtol = self.atol, self.rtol
        for o, v in zip(node_proto.output, outs):
            if not o:
                continue
            entry: dict[str, Any] = {"onnx_name": o, "shape_type": shape_type(v)}
            if o in values.expected:
                entry["ep_name"] = values.mapping[o]
                d = compare(values.expected[o].to(v.device), v, atol, rtol)
                entry.update(
                    err_abs_vs_torch=d.err_abs,
                    err_rel_vs_torch=d.err_rel,
                    passed_vs_torch=d.passed,
                )
            if o in values.first_run:
                d = compare(values.first_run[o].to(v.device), v, atol, rtol)
                entry.update(err_abs_vs_first_run=d.err_abs, err_rel_vs_first_run=d.err_rel)
            result["outputs"].append(entry)
        return result

    def node_detail(self, node: int | str | Record) -> dict[str, Any]:
        """What a detail panel shows about one ONNX node (strings, JSON-safe)."""
        k, proto = self.find_node(node)
        meta = {p.key: p.value for p in proto.metadata_props}
        fx_name = None
        for o in proto.output:
            p = self.pairing.by_onnx.get(o)
            if p is not None:
                fx_name = p.fx_name
        if fx_name is None:
            fx_name = fx_name_from_metadata(proto)
        fx_node = self.ref.by_name.get(fx_name) if fx_name else None
        described = self.ref.describe(fx_name) if fx_node is not None else {}
        stack = meta.get("pkg.torch.onnx.stack_trace")
        if stack is None and fx_node is not None:
            stack = fx_node.meta.get("stack_trace")
        inits = self.cand.initializers
        return {
            "onnx_node": onnx_node_name(proto, k),
            "onnx_id_node": k,
            "op_type": proto.op_type,
            "domain": proto.domain,
            "attributes": {a.name: _attr_str(a) for a in proto.attribute},
            "inputs": [{**self._pairing_of(i), "initializer": i in inits} for i in proto.input],
            "outputs": [self._pairing_of(o) for o in proto.output],
            "ep_name": fx_name,
            "ep_target": fx_target_name(fx_node) if fx_node is not None else None,
            "ep_node": fx_node.format_node() if fx_node is not None else None,
            "ep_user_name": described.get("ep_user_name"),
            "ep_module": described.get("ep_module"),
            "ep_source": described.get("ep_source"),
            "stack_trace": stack,
            "namespace": meta.get("namespace"),
        }

    def _pairing_of(self, name: str) -> dict[str, Any]:
        pair = self.pairing.by_onnx.get(name)
        return {
            "name": name,
            "ep_name": pair.fx_name if pair is not None else None,
            "paired_by": pair.rule if pair is not None else None,
        }

    def replay_inputs(self, node: int | str | Record) -> NodeValues:
        """Values needed to write a replay bundle of one node (see save_replay): the
        sub-model starts at the nearest values with a torch partner."""
        from .submodel import submodel_inputs

        k, proto = self.find_node(node)

        def has_partner(v: str) -> bool:
            return v in self.pairing.by_onnx and v not in self.cand.initializers

        inputs = submodel_inputs(self.cand.model, proto.name or proto.output[0], has_partner)
        return self.node_values(k, inputs)

    def save_replay(self, node: int | str | Record, root: str | Path) -> Path:
        """Writes the replay bundle of one ONNX node inside ``root``; returns its folder."""
        from .replay import write_replay_bundle

        data = self.replay_inputs(node)
        outputs = set(data.node.output)
        record = next((r for r in reversed(self.records) if r.onnx_name in outputs), None)
        kwargs: dict[str, Any] = {}
        if getattr(self.options.replay, "prefix_model", False):
            kwargs["prefix_inputs"] = {
                name: to_torch(self.cand.leaf_value(name))
                for name in (i.name for i in self.cand.model.graph.input)
                if name in self.cand.feeds or name in self.cand.initializers
            }
        return write_replay_bundle(
            Path(root),
            model=self.cand.model,
            node_name=data.node.name or data.node.output[0],
            torch_inputs=data.torch_inputs,
            onnx_inputs=data.onnx_inputs,
            expected=data.expected,
            mapping=data.mapping,
            record=record,
            base_dir=self.cand.folder,
            **kwargs,
        )

    def write_selected_replays(self) -> tuple[list[str], list[str]]:
        """Writes the bundles the run's ReplayConfig selects, after the run; returns the
        folders written and, for each bundle that failed, ``"node: error"``."""
        config, root = self.options.replay, self.options.replay_dir
        selected: list[int] = []
        for rec in self.records:
            k = rec.onnx_id_node
            if k is None or k < 0 or k in selected:
                continue
            if config.selects(rec, node_name=self.cand.node_name(k)):
                selected.append(k)
        written, errors = [], []
        for k in selected[: config.max_nodes]:
            try:
                written.append(str(self.save_replay(k, root)))
            except Exception as e:
                errors.append(f"{self.cand.node_name(k)}: {e}")
        return written, errors


def _attr_str(a: onnx.AttributeProto) -> str:
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return "<subgraph>"
    if a.type == onnx.AttributeProto.TENSOR:
        from ..judge.judging import proto_shape_type as _proto_shape_type

        return f"<tensor {_proto_shape_type(a.t)}>"
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    s = repr(v)
    return s if len(s) < 200 else s[:197] + "..."


__all__ = ["NodeValues", "RunActions"]
