"""The culprit: a view of the record of the node that makes the error, plus what blame
adds to it (the rule that chose it, the why, the lowering's ONNX nodes, the own error that
proves it).

The record's fields are not copied: every :class:`~onnx_sbs_nb.records.Record` field reads
through the culprit (``culprit.ep_module``, ``culprit.err_abs``), so a field added to
``Record`` needs no change here.  :data:`RECORD_KEYS` says which of them the culprit's
dict (``Summary.to_dict()["culprit"]``, what the widget, the reports and saved files read)
holds, and under which key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...records import RECORD_FIELDS, Record
from .text import float_or_none, fused_list, json_float

#: The culprit dict's keys read from its record: key -> Record field (the front end's
#: ``onnx_node`` and ``fuses`` are the record's ``onnx_node_name`` and ``onnx_fuses``).
RECORD_KEYS: dict[str, str] = {
    "step": "step",
    "kind": "kind",
    "ep_user_name": "ep_user_name",
    "ep_module": "ep_module",
    "ep_source": "ep_source",
    "onnx_name": "onnx_name",
    "onnx_node": "onnx_node_name",
    "onnx_op_type": "onnx_op_type",
    "atol": "atol",
    "rtol": "rtol",
    "fuses": "onnx_fuses",
}
#: ... read from the failure it explains (its own record's, unless it explains another's:
#: the input of a run over many inputs that shows that failure, and on how many it shows)
FAILURE_KEYS: tuple[str, ...] = ("input_index", "input_name", "inputs_failing", "inputs_total")

# every key of the culprit's dict, in the order it has always been written
_KEYS: tuple[str, ...] = (
    "rule",
    "why",
    "step",
    "kind",
    "ep_name",
    "ep_user_name",
    "ep_module",
    "ep_source",
    "onnx_name",
    "onnx_node",
    "onnx_op_type",
    "onnx_nodes",
    "own_error",
    "own_measured",
    "atol",
    "rtol",
    "fuses",
    "bundle",
    *FAILURE_KEYS,
)


@dataclass
class Culprit:
    """The one answer of a run, in the user's words: which node makes the error, and why.

    ``record`` is the record of that node; its fields read through the culprit.  ``rule``
    names the culprit rule that chose it (``rules.CULPRIT_RULES``).  ``onnx_nodes`` are the
    ONNX nodes of the lowering of the culprit's fx node (the nodes whose
    ``pkg.torch.onnx.fx_node`` metadata names it); ``onnx_node`` is the most suspicious of
    them.  ``step`` is the record's step (a view selects it with that).
    """

    record: Record
    rule: str
    why: str
    onnx_nodes: list[str] = field(default_factory=list)
    own_error: float | None = None
    # whether own_error is the node's own error (an own-error rerun measured it): else it
    # is the error it showed, inherited or not, and views say "error"
    own_measured: bool | None = None
    # its replay bundle, when one was saved (culprit_bundle.CulpritBundle.brief)
    bundle: str | None = None
    # the failure it explains when that is another record's (a node whose small error a
    # later one amplifies): the many-input fields are that failure's
    explains: Record | None = None

    def __getattr__(self, name: str) -> Any:
        # only reached for names the culprit does not define: a Record field reads through
        if name in _RECORD_FIELDS and "record" in self.__dict__:
            return getattr(self.__dict__["record"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def ep_name(self) -> str | None:
        """The fx node whose lowering makes the error (the record's own fx node when it
        has no lowering)."""
        return self.record.onnx_fx_node or self.record.ep_name

    @property
    def onnx_node(self) -> str | None:
        return self.record.onnx_node_name

    @property
    def fuses(self) -> str | None:
        """A fused ONNX node (a graph tool's, no metadata): the fx nodes it computes."""
        return self.record.onnx_fuses

    @property
    def input_index(self) -> int | None:
        return (self.explains or self.record).input_index

    @property
    def input_name(self) -> str | None:
        return (self.explains or self.record).input_name

    @property
    def inputs_failing(self) -> int | None:
        return (self.explains or self.record).inputs_failing

    @property
    def inputs_total(self) -> int | None:
        return (self.explains or self.record).inputs_total

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in _KEYS}
        d["onnx_nodes"] = list(self.onnx_nodes)
        d["own_error"] = json_float(self.own_error)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Culprit:
        """The culprit of a saved dict: its record holds the fields the dict has."""
        fields = {RECORD_KEYS.get(k, k): v for k, v in d.items() if k not in _OWN_KEYS}
        return cls(
            record=Record.from_dict({k: v for k, v in fields.items() if k in _RECORD_FIELDS}),
            rule=d.get("rule") or "",
            why=d.get("why") or "",
            onnx_nodes=list(d.get("onnx_nodes") or []),
            own_error=float_or_none(d.get("own_error")),
            own_measured=d.get("own_measured"),
            bundle=d.get("bundle"),
        )

    def label(self) -> str:
        """How a terminal names it: the user's node, then where it lives."""
        name = self.ep_user_name or self.ep_name or self.onnx_name or f"step {self.step}"
        where = f" in {self.ep_module}" if self.ep_module else ""
        if self.onnx_node and len(self.onnx_nodes) > 1:
            # the rerun proves the lowering as a whole makes the error, not which of its
            # nodes: naming the last one (it writes the value) would claim more than that
            value = f"value {self.onnx_name} [{self.onnx_op_type}]"
            onnx = f" (ONNX {value}, made by its lowering: {_node_list(self.onnx_nodes)})"
        elif self.onnx_node:
            value = f", value {self.onnx_name}" if self.onnx_name else ""
            fused = f", fusing {fused_list(self.fuses)}" if self.fuses else ""
            onnx = f" (ONNX node {self.onnx_node} [{self.onnx_op_type}]{fused}{value})"
        elif self.onnx_name and self.onnx_name != name:
            onnx = f" (ONNX {self.onnx_op_type or 'value'} {self.onnx_name})"
        else:
            onnx = f" [{self.onnx_op_type or self.kind}]" if self.onnx_op_type or self.kind else ""
        return f"{name}{where}{onnx}"


def _node_list(nodes: list[str], shown: int = 4) -> str:
    """``n ONNX nodes a, b, …, z``: the first few and the last, which writes the value."""
    if len(nodes) <= shown:
        return f"{len(nodes)} ONNX nodes {', '.join(nodes)}"
    return f"{len(nodes)} ONNX nodes {', '.join(nodes[: shown - 1])}, …, {nodes[-1]}"


_RECORD_FIELDS = frozenset(RECORD_FIELDS)
# the dict's keys that are blame's, not the record's
_OWN_KEYS = frozenset({"rule", "why", "onnx_nodes", "own_error", "own_measured", "bundle"})

# the view is declared over Record's schema: a renamed Record field fails at import
assert set(RECORD_KEYS.values()) | set(FAILURE_KEYS) <= _RECORD_FIELDS
assert not {"record", "rule", "why", "bundle", "explains"} & _RECORD_FIELDS

__all__ = ["FAILURE_KEYS", "RECORD_KEYS", "Culprit"]
