"""How much of the two graphs a run compared: counted record by record
(:class:`CoverageCount`), read as a :class:`Coverage` (a pass over too little is said so,
and a culprit's why says how much of the model its evidence covers)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...records import (
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    KIND_WEIGHT,
    STATUS_CHECK_ERROR,
    STATUS_ERROR,
    STATUS_INTERNAL,
    STATUS_NOT_COMPUTED,
    STATUS_UNPAIRED_ONNX,
    STATUSES,
    UNPAIRED,
    Record,
)

# statuses whose values were compared (whatever the outcome)
_COMPARED = frozenset(k for k, v in STATUSES.items() if v.compared)
# a pass that compared fewer of the ONNX nodes than this (directly or through the fx node
# they lower) says so: "PASS on N of M"
LOW_COVERAGE = 0.5

LEAF_KINDS = frozenset({KIND_INPUT, KIND_WEIGHT})


@dataclass
class Coverage:
    """How much of the two graphs a run compared (counted over computed values: weights
    and inputs aside)."""

    onnx_nodes: int = 0  # ONNX nodes that made a value
    onnx_compared: int = 0  # ... one of whose values was compared with a torch value
    # ... or that lower an fx node whose value was compared at another of its ONNX nodes
    onnx_covered: int = 0
    torch_nodes: int = 0  # fx nodes (the program's operations)
    torch_compared: int = 0
    # why ONNX nodes went uncompared: reason -> count
    not_compared: dict[str, int] = field(default_factory=dict)
    # the reference is an ONNX model (onnx-sbs diff): its nodes are no torch nodes
    reference_onnx: bool = False

    @property
    def ratio(self) -> float | None:
        return self.onnx_covered / self.onnx_nodes if self.onnx_nodes else None

    @property
    def low(self) -> bool:
        return self.onnx_nodes > 0 and self.onnx_covered < LOW_COVERAGE * self.onnx_nodes

    def to_text(self) -> str:
        text = f"{self.onnx_compared} of {self.onnx_nodes} ONNX nodes compared"
        if self.onnx_covered > self.onnx_compared:
            text += f" ({self.onnx_covered} with the rest of their fx node's lowering)"
        theirs = "nodes of the reference model" if self.reference_onnx else "torch nodes"
        text += f", {self.torch_compared} of {self.torch_nodes} {theirs}"
        if self.not_compared:
            why = ", ".join(f"{n} {k}" for k, n in sorted(self.not_compared.items()))
            text += f"; not compared: {why}"
        return text

    def to_dict(self) -> dict[str, Any]:
        return {
            "onnx_nodes": self.onnx_nodes,
            "onnx_compared": self.onnx_compared,
            "onnx_covered": self.onnx_covered,
            "torch_nodes": self.torch_nodes,
            "torch_compared": self.torch_compared,
            "not_compared": dict(self.not_compared),
            "reference_onnx": self.reference_onnx,
            "low": self.low,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Coverage:
        return cls(
            onnx_nodes=int(d.get("onnx_nodes", 0)),
            onnx_compared=int(d.get("onnx_compared", 0)),
            onnx_covered=int(d.get("onnx_covered", 0)),
            torch_nodes=int(d.get("torch_nodes", 0)),
            torch_compared=int(d.get("torch_compared", 0)),
            not_compared={str(k): int(v) for k, v in dict(d.get("not_compared", {})).items()},
            reference_onnx=bool(d.get("reference_onnx", False)),
        )


class CoverageCount:
    """The coverage of a stream of records, counted one record at a time (O(1) each)."""

    def __init__(self) -> None:
        # ONNX node -> [its fx node, compared?, why not]; fx nodes seen -> compared?
        self._onnx_nodes: dict[str, list[Any]] = {}
        self._fx_nodes: dict[str, bool] = {}
        # the reference's leaves say what it is: a program's are placeholders, an ONNX
        # model's inputs and initializers (onnx-sbs diff); the coverage names it so
        self._reference_leaves: set[str] = set()
        self._fx_compared_lowerings: set[str] = set()

    def add(self, rec: Record) -> None:
        if rec.kind in LEAF_KINDS and rec.ep_target:
            self._reference_leaves.add(rec.ep_target)
        if rec.kind not in (KIND_NODE, KIND_OUTPUT):
            return
        compared = rec.status in _COMPARED
        viewed = float_view_of(rec.onnx_node_name) if rec.onnx_node_name else None
        if viewed is not None:
            # a node the tool added (pairing/float_views.py), no node of the model: a
            # compared view of a node's output or activation compares that node
            node, what = viewed
            if compared and what in _VIEWED_VALUES:
                self._onnx_nodes.setdefault(node, [rec.onnx_fx_node, False, None])[1] = True
        elif rec.onnx_node_name:
            entry = self._onnx_nodes.get(rec.onnx_node_name)
            if entry is None:
                entry = self._onnx_nodes[rec.onnx_node_name] = [rec.onnx_fx_node, False, None]
            if compared:
                entry[1] = True
            elif entry[2] is None or rec.status != STATUS_UNPAIRED_ONNX:
                entry[2] = _uncompared_reason(rec)
            if rec.onnx_fx_inferred:
                entry[0] = None  # a lowering guessed from the pairs covers nothing
            if compared and rec.onnx_fx_node and not rec.onnx_fx_inferred:
                self._fx_compared_lowerings.add(rec.onnx_fx_node)
        if rec.ep_name and rec.ep_target:
            self._fx_nodes[rec.ep_name] = self._fx_nodes.get(rec.ep_name, False) or compared
            if compared:
                self._fx_compared_lowerings.add(rec.ep_name)

    def coverage(self) -> Coverage:
        cov = Coverage()
        for fx, compared, why in self._onnx_nodes.values():
            cov.onnx_nodes += 1
            if compared:
                cov.onnx_compared += 1
                cov.onnx_covered += 1
            elif fx and fx in self._fx_compared_lowerings:
                cov.onnx_covered += 1
            else:
                reason = why or "no torch twin"
                cov.not_compared[reason] = cov.not_compared.get(reason, 0) + 1
        cov.torch_nodes = len(self._fx_nodes)
        cov.torch_compared = sum(self._fx_nodes.values())
        leaves = self._reference_leaves
        cov.reference_onnx = bool(leaves) and leaves <= {"input", "initializer"}
        if cov.reference_onnx:
            cov.not_compared = {
                k.replace("torch twin", "twin in the reference model"): n
                for k, n in cov.not_compared.items()
            }
        return cov


# the float views (``pairing/float_view_nodes.view_node``) are named
# ``<node>/<what>_float_view``, their helpers ``<node>/<op>_for_float_view``
_VIEW_SUFFIX = "_float_view"
# views of a node's own value (its integer output, the activation it quantizes), not of
# a weight or a bias it reads
_VIEWED_VALUES = frozenset({"output", "activation"})


def float_view_of(node_name: str) -> tuple[str, str] | None:
    """For a float view node or its helper, (the node it views, what it views: ``weight``,
    ``bias``, ``output``, ``activation``, or ``<op>_for``), None for a node of the model."""
    node, sep, what = node_name.rpartition("/")
    if not sep or not node or not what.endswith(_VIEW_SUFFIX):
        return None
    return node, what[: -len(_VIEW_SUFFIX)]


def _uncompared_reason(rec: Record) -> str:
    if rec.status == STATUS_UNPAIRED_ONNX:
        return "no torch twin"
    if rec.status in (STATUS_ERROR, STATUS_NOT_COMPUTED):
        return "not computed"
    if rec.paired_by == UNPAIRED:  # a graph output with no twin in the other ONNX model
        return "no torch twin"
    if rec.status == STATUS_INTERNAL:
        return "internal to a fused node"
    if rec.status == STATUS_CHECK_ERROR:
        return "your compare function failed"
    return "not compared (random, empty or not a tensor)"


__all__ = ["LEAF_KINDS", "LOW_COVERAGE", "Coverage", "CoverageCount", "float_view_of"]
