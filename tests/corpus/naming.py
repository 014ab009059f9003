"""What a summary names, and whether that is the node a fault was injected into."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx

from onnx_sbs_nb.align.source.fx_metadata import ORIGINAL_NAME_KEY, fx_name_from_metadata


@dataclass
class Named:
    """The summary's one answer, reduced to names that can be checked against the model."""

    source: str  # "culprit" or "first_own_failure"
    onnx_nodes: list[str] = field(default_factory=list)  # ONNX node names it names
    onnx_value: str | None = None  # the value of its record (a weight's initializer name)
    ep_name: str | None = None  # the fx node it names
    fx_nodes: list[str] = field(default_factory=list)  # fx metadata of its ONNX nodes
    rule: str | None = None
    op_type: str | None = None

    def label(self) -> str:
        node = self.onnx_nodes[0] if self.onnx_nodes else "-"
        meta = ",".join(self.fx_nodes) or "-"
        return (
            f"{node} / value {self.onnx_value or '-'} / ep {self.ep_name or '-'} "
            f"/ fx-meta {meta} ({self.rule})"
        )


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _node_by_name(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {n.name: n for n in model.graph.node if n.name}


def what_summary_names(summary: Any, model: onnx.ModelProto) -> Named | None:
    """The summary's culprit (``summary.culprit`` when the engine has it, else
    ``summary.first_own_failure``), or None when it names nothing."""
    nodes = _node_by_name(model)
    culprit = getattr(summary, "culprit", None)
    if culprit:
        onnx_nodes = [n for n in [_get(culprit, "onnx_node"), *(_get(culprit, "onnx_nodes") or [])]
                      if n]  # fmt: skip
        fx = [fx_name_from_metadata(nodes[n]) for n in onnx_nodes if n in nodes]
        return Named(
            "culprit",
            onnx_nodes=list(dict.fromkeys(onnx_nodes)),
            onnx_value=_get(culprit, "onnx_name"),
            ep_name=_get(culprit, "ep_name"),
            fx_nodes=list(dict.fromkeys(f for f in fx if f)),
            rule=_get(culprit, "rule"),
            op_type=_get(culprit, "onnx_op_type"),
        )
    rec = getattr(summary, "first_own_failure", None)
    if rec is None:
        return None
    onnx_nodes, fx = [], []
    graph_nodes = model.graph.node
    if rec.onnx_id_node is not None and 0 <= rec.onnx_id_node < len(graph_nodes):
        node = graph_nodes[rec.onnx_id_node]
        onnx_nodes.append(node.name)
        f = fx_name_from_metadata(node)
        if f:
            fx.append(f)
    return Named(
        "first_own_failure",
        onnx_nodes=onnx_nodes,
        onnx_value=rec.onnx_name,
        ep_name=rec.ep_name,
        fx_nodes=fx,
        rule=getattr(summary, "first_own_failure_rule", None),
        op_type=rec.onnx_op_type,
    )


def _placeholder_names(init: onnx.TensorProto) -> set[str]:
    """fx placeholder names torch.export gives the weight an initializer stands for
    (``p_``/``b_``/``c_`` + the state-dict name, dots as underscores, lower case)."""
    originals = {init.name}
    originals |= {p.value for p in init.metadata_props if p.key == ORIGINAL_NAME_KEY}
    out = set()
    for name in originals:
        flat = re.sub(r"[^0-9a-zA-Z_]", "_", name).lower()
        out |= {f"{prefix}_{flat}" for prefix in ("p", "b", "c")}
    return out


def injected_targets(model: onnx.ModelProto, injected: str) -> tuple[set[str], set[str]]:
    """(ONNX names that count as the injected node, fx nodes whose lowering contains it).

    ``injected`` is an ONNX node name, or an initializer name for a weight fault: then the
    nodes consuming the initializer count too (the weight or any of its consumers), and so
    do the fx placeholders of that weight."""
    nodes = _node_by_name(model)
    names = {injected}
    fx: set[str] = set()
    if injected in nodes:
        owners = [nodes[injected]]
    else:
        owners = [n for n in model.graph.node if injected in n.input]
        names |= {n.name for n in owners}
        for init in model.graph.initializer:
            if init.name == injected:
                fx |= _placeholder_names(init)
    fx |= {f for f in (fx_name_from_metadata(n) for n in owners) if f}
    return names, fx


def named_correctly(summary: Any, model: onnx.ModelProto, injected_node: str) -> bool:
    """True when the summary names the injected node or the fx node whose lowering holds it.

    Accepted: the culprit's ONNX node is the injected node (or, for a weight, the
    initializer itself or one of its consumers); or the culprit's fx node (its
    ``pkg.torch.onnx.fx_node`` metadata, or the culprit's ``ep_name``) is the fx node of
    the injected node.
    """
    named = what_summary_names(summary, model)
    if named is None:
        return False
    names, fx = injected_targets(model, injected_node)
    if names & set(named.onnx_nodes) or named.onnx_value in names:
        return True
    return bool(fx & {*named.fx_nodes, named.ep_name})
