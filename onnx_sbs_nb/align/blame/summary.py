"""The answer over a stream of records: which node is wrong, and what else went wrong.

:func:`summarize` is what every view (widget, magic, CLI, reports) shows first.  It is
pure Python over :class:`~onnx_sbs_nb.records.Record` objects (no pandas, no widget), and
linear in the number of records, so a view can call it again on a growing list, or feed
records one at a time to a :class:`Summarizer`.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...compare.elementwise import ELEMENT_ERROR_FLOOR, is_elementwise
from ...compare.tolerances import default_tolerance
from ...completion import STOPPED, STOPPED_BEFORE_END, Completion
from ...records import (
    FAILING_STATUSES,
    FOLDED_CONSUMER_NOTE,
    JUDGED_BY_NOTE,
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    KIND_WEIGHT,
    NONFINITE_INPUT_NOTE,
    STATUS_CHECK_ERROR,
    STATUS_DTYPE_MISMATCH,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_INTERNAL,
    STATUS_NOT_COMPUTED,
    STATUS_OK,
    STATUS_PRECISION_LOSS,
    STATUS_SHAPE_MISMATCH,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
    STATUS_UNPAIRED_OUTPUT,
    STATUS_WEIGHT_DIFFERS,
    STATUSES,
    Record,
)
from .certainty import certainty, comment_part
from .shape_origin import RULE_SHAPE_ORIGIN, ShapeOrigins

TOP_SUSPECTS = 10

# How Summary.first_own_failure was chosen (Summary.first_own_failure_rule).
RULE_RERUN = "rerun"  # the ONNX node rerun on torch inputs failed (passed2 is False)
RULE_ERROR = "error"  # the ONNX node failed to run
RULE_LEAF = "leaf"  # a graph input or weight differs: nothing upstream to blame
RULE_INPUTS_PASSED = "inputs_passed"  # failed while every compared input of its node passed
RULE_FIRST_FAILURE = "first_failure"  # no graph given: the first failure in execution order
RULE_UNPAIRED_OUTPUT = "unpaired_output"  # an output only one side computes
# no node fails its own check, but one upstream of the first failure makes an error under
# tolerance that is large for its values' size, and a later node amplifies it
RULE_AMPLIFIED = "amplified"
# how many such candidates are kept (the largest own errors relative to their values)
_QUIET_KEPT = 64
# candidates kept for the choice of the culprit (the first clean one wins)
MAX_CANDIDATES = 512

_LEAF_KINDS = frozenset({KIND_INPUT, KIND_WEIGHT})


_JUDGED_ELSEWHERE = frozenset(k for k, v in STATUSES.items() if v.judged_elsewhere)


def _failed(rec: Record) -> bool:
    """The first comparison (or running the node) failed.

    A weight whose consumers agree, a value not computed because of an upstream failure
    and a pairing the shapes disproved are not failures of their own.
    """
    if rec.status in FAILING_STATUSES:
        return True
    return rec.passed is False and rec.status not in _JUDGED_ELSEWHERE


def _groups(text: str | None) -> set[str]:
    return {g.strip() for g in text.split(",") if g.strip()} if text else set()


def _own_error(rec: Record) -> float | None:
    """Own error when the node was rerun on torch inputs, else the first error."""
    value = rec.err_abs2 if rec.err_abs2 is not None else rec.err_abs
    if value is None:
        return None
    if isinstance(value, str):  # records rebuilt from JSON by hand may keep "nan"
        value = float(value)
    return math.inf if math.isnan(value) else float(value)


def _has_nan(rec: Record) -> bool:
    for value in (rec.err_nan, rec.err_nan2):
        if value is not None and (value > 0 or math.isnan(value)):
            return True
    if rec.err_abs is not None and not math.isfinite(rec.err_abs):
        return True
    return "nan" in (rec.status or "").lower()


def node_inputs_from_model(model: Any) -> dict[str, list[str]]:
    """Map each ONNX value name produced by a node to the names of that node's inputs.

    ``model`` is an ``onnx.ModelProto`` (or a ``GraphProto``); only attribute access is
    used, so this module does not import onnx.  Give the result to :func:`summarize` to
    apply the ``inputs_passed`` rule when no rerun on torch inputs was done.
    """
    graph = getattr(model, "graph", model)
    result: dict[str, list[str]] = {}
    for node in graph.node:
        inputs = [name for name in node.input if name]
        for out in node.output:
            if out:
                result[out] = inputs
    return result


@dataclass
class Culprit:
    """The one answer of a run, in the user's words: which node makes the error, and why.

    ``onnx_nodes`` are the ONNX nodes of the lowering of the culprit's fx node (the nodes
    whose ``pkg.torch.onnx.fx_node`` metadata names it); ``onnx_node`` is the most
    suspicious of them.  ``step`` is the record's step (a view selects it with that).
    """

    rule: str
    why: str
    step: int
    kind: str | None = None
    ep_name: str | None = None
    ep_user_name: str | None = None
    ep_module: str | None = None
    ep_source: str | None = None
    onnx_name: str | None = None
    onnx_node: str | None = None
    onnx_op_type: str | None = None
    onnx_nodes: list[str] = field(default_factory=list)
    own_error: float | None = None
    # whether own_error is the node's own error (an own-error rerun measured it): else it
    # is the error it showed, inherited or not, and views say "error"
    own_measured: bool | None = None
    atol: float | None = None
    rtol: float | None = None
    # a fused ONNX node (a graph tool's, no metadata): the fx nodes it computes
    fuses: str | None = None
    # its replay bundle, when one was saved (culprit_bundle.CulpritBundle.brief)
    bundle: str | None = None
    # a run over many inputs: the input that shows the failure, and on how many it shows
    input_index: int | None = None
    input_name: str | None = None
    inputs_failing: int | None = None
    inputs_total: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["onnx_nodes"] = list(self.onnx_nodes)
        d["own_error"] = _json_float(self.own_error)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Culprit:
        names = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in d.items() if k in names}
        kw["own_error"] = _float_or_none(kw.get("own_error"))
        return cls(**kw)

    def label(self) -> str:
        """How a terminal names it: the user's node, then where it lives."""
        name = self.ep_user_name or self.ep_name or self.onnx_name or f"step {self.step}"
        where = f" in {self.ep_module}" if self.ep_module else ""
        if self.onnx_node:
            value = f", value {self.onnx_name}" if self.onnx_name else ""
            fused = f", fusing {_fused_list(self.fuses)}" if self.fuses else ""
            onnx = f" (ONNX node {self.onnx_node} [{self.onnx_op_type}]{fused}{value})"
        elif self.onnx_name and self.onnx_name != name:
            onnx = f" (ONNX {self.onnx_op_type or 'value'} {self.onnx_name})"
        else:
            onnx = f" [{self.onnx_op_type or self.kind}]" if self.onnx_op_type or self.kind else ""
        return f"{name}{where}{onnx}"


def _fused_list(fuses: str, most: int = 8) -> str:
    """A fused node's fx nodes, the first ``most`` of them."""
    names = [n.strip() for n in fuses.split(",") if n.strip()]
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return ", ".join(names[:most]) + more


# an ONNX op type (the reference of `onnx-sbs diff` is a model): a torch target has dots
_ONNX_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _why(rec: Record, rule: str, own: float | None, ref: str = "torch") -> str:
    """Why ``rec`` is the culprit; ``ref``: what the reference side is ("torch", or "the
    reference model's" when two ONNX models are compared); a node computing fx nodes
    whose weights the exporter folded says so (``judge/weights.py``)."""
    text = _why_alone(rec, rule, own, ref)
    folded = comment_part(rec, FOLDED_CONSUMER_NOTE)
    if folded and rule != RULE_LEAF:
        text += f" (it {folded})"
    return text


def _why_alone(rec: Record, rule: str, own: float | None, ref: str = "torch") -> str:
    tol = f"atol {_fmt(rec.atol)}, rtol {_fmt(rec.rtol)}" if rec.atol is not None else "tolerance"
    # a verdict policy failed it: the reason in the policy's words ("ulp<=1 (ulp 3)")
    policy = re.search(r"beyond the verdict ([^;]*)", rec.comment or "")
    beyond = f"beyond {tol}"
    judged = comment_part(rec, JUDGED_BY_NOTE)
    if policy:  # the reason in the policy's words, with the measure that failed it
        beyond = f"failing the verdict {policy.group(1)}"
    elif judged:  # the user's verdict or compare function failed it, not atol/rtol
        beyond = "failing " + judged[judged.index(JUDGED_BY_NOTE) + len(JUDGED_BY_NOTE) :]
    if rule == RULE_ERROR:
        return f"the node failed to run: {rec.error or 'unknown error'}"
    if rule == RULE_RERUN:
        if own is None and rec.status in (STATUS_SHAPE_MISMATCH, STATUS_DTYPE_MISMATCH):
            what = "shape" if rec.status == STATUS_SHAPE_MISMATCH else "type"
            text = (
                f"run on the {ref} values of its inputs, it still makes the wrong {what}: "
                f"{rec.onnx_shape_type} where the program has {rec.ep_shape_type}"
            )
            return f"{text} ({rec.comment})" if rec.comment else text
        text = f"run on the {ref} values of its inputs, it still differs by {_fmt(own)} ({beyond})"
        if rec.own_inputs_from:
            # the rerun did not isolate it: it proves no more than where the error starts
            return text + (
                f"; some of its inputs have no torch twin and were recomputed through the "
                f"lowering of {_fused_list(rec.own_inputs_from)}, so the error may also be "
                "there: it is made there or here, not upstream"
            )
        return text + ": it makes the error, it does not inherit it"
    if rule == RULE_LEAF:
        if rec.kind == KIND_WEIGHT:
            consumers = f" ({rec.comment})" if rec.comment else ""
            return (
                f"the weight differs from the torch parameter {rec.ep_name} by {_fmt(own)}"
                f"{consumers}"
            )
        if rec.onnx_op_type == "initializer":  # a constant the program computes
            consumers = f" ({rec.comment})" if rec.comment else ""
            return f"the constant differs from the {ref} value by {_fmt(own)}{consumers}"
        return f"the graph input differs from the {ref} input by {_fmt(own)}"
    if rule == RULE_UNPAIRED_OUTPUT:
        return (
            rec.comment
            or "an output only one side computes: the model does not compute the program"
        )
    if rec.status in (STATUS_SHAPE_MISMATCH, STATUS_DTYPE_MISMATCH):
        what = "shapes" if rec.status == STATUS_SHAPE_MISMATCH else "types"
        text = (
            f"the {what} differ: {rec.ep_shape_type} in the program, {rec.onnx_shape_type} "
            f"in the model"
        )
        return f"{text} ({rec.comment})" if rec.comment else text
    if rule == RULE_INPUTS_PASSED:
        return f"it differs by {_fmt(own)} ({beyond}) while every compared input agrees"
    return f"it is the first value that differs ({_fmt(own)}, {beyond})"


# statuses whose values were compared (whatever the outcome)
_COMPARED = frozenset(k for k, v in STATUSES.items() if v.compared)
# a pass that compared fewer of the ONNX nodes than this (directly or through the fx node
# they lower) says so: "PASS on N of M"
LOW_COVERAGE = 0.5


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


@dataclass
class Summary:
    """What a run found; see :func:`summarize` for how each part is chosen.

    One type wherever a summary is handed out (``summarize()``, ``w.summary``,
    ``session.summary``): it prints as :meth:`to_text`, and reads as the dict
    :meth:`to_dict` gives (``summary["verdict"]``, ``summary["culprit"]["ep_module"]``).
    """

    first_own_failure: Record | None = None
    first_own_failure_rule: str | None = None
    first_failure: Record | None = None
    top_suspects: list[Record] = field(default_factory=list)
    first_nan: Record | None = None
    unpaired_ep: list[str] = field(default_factory=list)
    unpaired_onnx: list[str] = field(default_factory=list)
    errors: list[Record] = field(default_factory=list)
    totals: dict[str, Any] = field(default_factory=dict)
    max_err_abs: float | None = None
    max_err_name: str | None = None
    max_own_err: float | None = None
    max_own_err_name: str | None = None
    culprit: Culprit | None = None
    # how far the run got (None: not said, e.g. summarize() over a list the caller holds)
    completion: Completion | None = None
    coverage: Coverage = field(default_factory=Coverage)
    # strict: a pass that compared too little (Coverage.low) is a fail
    strict: bool = False

    @property
    def partial(self) -> bool:
        """A pass over too little of the model to mean much ("PASS on N of M")."""
        return self.coverage.low and self._plain_verdict() == "pass"

    # graph inputs holding NaN or infinities (their records say so)
    nonfinite_inputs: list[str] = field(default_factory=list)
    # nodes whose error is their inputs' rounding, amplified (status precision_loss): no
    # culprit, listed apart, in run order
    precision_losses: list[Record] = field(default_factory=list)
    # the first failure of the user's compare function (status check_error), if any
    check_error: str | None = None

    @property
    def verdict(self) -> str:
        """ "stopped" or "incomplete" when the run did not compare the whole model (a culprit
        found before that is still reported), else "fail" when any comparison or own-error
        comparison failed, else "pass". A drifted value (:attr:`Record.drifted`: beyond
        tolerance while its node agrees on torch's inputs) fails no verdict alone: the
        error it carries fails one where it is made, or at the outputs."""
        verdict = self._plain_verdict()
        if verdict == "pass" and self.strict and self.coverage.low:
            return "fail"
        return verdict

    def _plain_verdict(self) -> str:
        if self.completion is not None and not self.completion.finished:
            return self.completion.state
        t = self.totals
        failed = t.get("failed", 0) - t.get("drifted", 0)
        if failed > 0 or t.get("own_failed", 0):
            return "fail"
        # values the model could not compute were compared with nothing, pairs the user's
        # compare function failed on were judged by nothing: no pass
        return "incomplete" if t.get("not_computed", 0) or t.get("check_errors", 0) else "pass"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (records as :meth:`Record.to_dict`, non-finite floats as str)."""

        def rec(r: Record | None) -> dict[str, Any] | None:
            return None if r is None else r.to_dict()

        totals = _json_safe(self.totals)
        if self.completion is not None:
            totals["nodes_done"] = self.completion.nodes_done
            totals["nodes_total"] = self.completion.nodes_total
        return {
            "verdict": self.verdict,
            "completion": self.completion.to_dict() if self.completion is not None else None,
            "first_own_failure": rec(self.first_own_failure),
            "first_own_failure_rule": self.first_own_failure_rule,
            "first_failure": rec(self.first_failure),
            "top_suspects": [r.to_dict() for r in self.top_suspects],
            "first_nan": rec(self.first_nan),
            "unpaired_ep": list(self.unpaired_ep),
            "unpaired_onnx": list(self.unpaired_onnx),
            "n_unpaired_ep": len(self.unpaired_ep),
            "n_unpaired_onnx": len(self.unpaired_onnx),
            "errors": [r.to_dict() for r in self.errors],
            "totals": totals,
            "max_err_abs": _json_float(self.max_err_abs),
            "max_err_name": self.max_err_name,
            "max_own_err": _json_float(self.max_own_err),
            "max_own_err_name": self.max_own_err_name,
            "culprit": self.culprit.to_dict() if self.culprit is not None else None,
            "coverage": self.coverage.to_dict(),
            "partial": self.partial,
            "strict": self.strict,
            "nonfinite_inputs": list(self.nonfinite_inputs),
            "precision_losses": [r.to_dict() for r in self.precision_losses],
            "check_error": self.check_error,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Summary:
        def rec(v: Any) -> Record | None:
            return None if v is None else Record.from_dict(v)

        return cls(
            first_own_failure=rec(d.get("first_own_failure")),
            first_own_failure_rule=d.get("first_own_failure_rule"),
            first_failure=rec(d.get("first_failure")),
            top_suspects=[Record.from_dict(r) for r in d.get("top_suspects", [])],
            first_nan=rec(d.get("first_nan")),
            unpaired_ep=list(d.get("unpaired_ep", [])),
            unpaired_onnx=list(d.get("unpaired_onnx", [])),
            errors=[Record.from_dict(r) for r in d.get("errors", [])],
            totals=dict(d.get("totals", {})),
            max_err_abs=_float_or_none(d.get("max_err_abs")),
            max_err_name=d.get("max_err_name"),
            max_own_err=_float_or_none(d.get("max_own_err")),
            max_own_err_name=d.get("max_own_err_name"),
            culprit=Culprit.from_dict(d["culprit"]) if d.get("culprit") else None,
            completion=Completion.from_dict(d["completion"]) if d.get("completion") else None,
            coverage=Coverage.from_dict(d.get("coverage") or {}),
            strict=bool(d.get("strict", False)),
            nonfinite_inputs=list(d.get("nonfinite_inputs", [])),
            precision_losses=[Record.from_dict(r) for r in d.get("precision_losses", [])],
            check_error=d.get("check_error") if isinstance(d.get("check_error"), str) else None,
        )

    # -- read like the dict it is saved as: ``w.summary["culprit"]["ep_module"]`` (what
    # notebooks wrote when the widget's summary was that dict) and a readable print --
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)

    def keys(self) -> Any:
        return self.to_dict().keys()

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # IPython's display
        p.text(self.to_text())

    def to_text(self, max_suspects: int = 5) -> str:
        """A few lines for a terminal: verdict, culprit, top suspects, counts."""
        t = self.totals
        counts = (
            f"{t.get('records', 0)} records, {t.get('compared', 0)} compared, "
            f"{failing_text(t.get('failed', 0), t.get('drifted', 0))}, {len(self.errors)} errors"
        )
        if t.get("not_computed", 0):
            counts += f", {t['not_computed']} not computed"
        if t.get("inputs"):
            counts += f", worst of {t['inputs']} inputs"
        c = self.completion
        head = f"verdict: {self.verdict.upper()}"
        if c is not None and c.finished and c.nodes:
            counts = f"{c.nodes}, {counts}"
        elif c is not None and not c.finished:
            head += f" at {c.nodes}" if c.nodes else ""
            # a plain stop says no more than STOPPED; "after 5 of 9 inputs" does
            if c.reason and (c.state != STOPPED or c.reason != STOPPED_BEFORE_END):
                head += f" ({_printable(c.reason)})"
        if self.partial:
            on = f"{self.coverage.onnx_covered} of {self.coverage.onnx_nodes} ONNX nodes"
            head += f" (strict: it passes on only {on})" if self.strict else f" on {on}"
        lines = [f"{head}  ({counts})"]
        if t.get("check_errors"):
            lines.append(
                f"compare function broken on {t['check_errors']} pairs, which are not judged "
                f"(nothing is said of the model there): {_printable(self.check_error or '')}"
            )
        if self.coverage.onnx_nodes:
            lines.append(f"coverage: {self.coverage.to_text()}")
        if self.culprit is not None:
            c = self.culprit
            lines.append(f"culprit: {_printable(c.label())}")
            if c.ep_source:
                lines.append(f"  at {_printable(c.ep_source)}")
            lines.append(f"  why: {_printable(c.why)}")
            if c.bundle:
                lines.append(f"  replay bundle: {_printable(c.bundle)}")
        elif self.first_failure is not None:
            where = on_input_text(self.first_failure)
            where = f" ({_printable(where)})" if where else ""
            lines.append(f"first failure: {_printable_label(self.first_failure)}{where}")
        if t.get("drifted", 0):
            lines.append(f"drift: {drift_text(t['drifted'], self.verdict)}")
        if self.precision_losses:
            lines.append(f"precision loss: {_printable(precision_loss_text(self))}")
        if self.nonfinite_inputs:
            names = ", ".join(_printable(n) for n in self.nonfinite_inputs)
            lines.append(
                f"non-finite inputs: {names} (NaN or infinities): where the values computed "
                "from them are NaN/inf, only the NaN/inf patterns were compared"
            )
        if self.first_nan is not None:
            lines.append(f"first NaN/Inf: {_printable_label(self.first_nan)}")
        if self.top_suspects:
            shown = self.top_suspects[:max_suspects]
            ops = [_printable(r.onnx_op_type or r.kind or "") for r in shown]
            # as wide as the longest op shown (SkipLayerNormalization whole, never cut)
            w = max([2, *map(len, ops)])
            lines.append(f"  {'step':>5}  {'own err':>10}  {'err':>10}  {'op':<{w}} name")
            for r, op in zip(shown, ops):
                own = _fmt(r.err_abs2) if r.err_abs2 is not None else "-"
                lines.append(
                    f"  {r.step:>5}  {own:>10}  {_fmt(r.err_abs):>10}  "
                    f"{op:<{w}} {_printable(suspect_name(r))}"
                )
        if self.unpaired_ep or self.unpaired_onnx:
            # two ONNX models (onnx-sbs diff): the reference is no torch program
            ref, cand = (
                ("reference-only", "candidate-only")
                if self.coverage.reference_onnx
                else (
                    "torch-only",
                    "onnx-only",
                )
            )
            lines.append(
                f"unpaired: {len(self.unpaired_ep)} {ref}, {len(self.unpaired_onnx)} {cand}"
            )
        if self.max_err_abs is not None:
            lines.append(
                f"max err_abs: {_fmt(self.max_err_abs)} at {_printable(self.max_err_name or '')}"
            )
        return "\n".join(lines)


class Summarizer:
    """Builds a :class:`Summary` one record at a time (O(1) per record).

    Records must arrive in execution order (increasing ``step``), as the engine yields
    them; :func:`summarize` sorts them first when they do not.
    """

    def __init__(
        self,
        node_inputs: Mapping[str, Sequence[str]] | None = None,
        top: int = TOP_SUSPECTS,
    ) -> None:
        self._node_inputs = node_inputs
        self._top = top
        self._s = Summary()
        # verdict of each ONNX value compared so far (True: correct), for the inputs rule
        self._onnx_ok: dict[str, bool] = {}
        self._heap: list[tuple[float, int, int, Record]] = []  # min-heap of suspects
        # ONNX node names of each fx node's lowering, as the records show them
        self._lowering: dict[str, list[str]] = {}
        self._candidates: list[tuple[Record, str]] = []
        self._failing_lowerings: set[str] = set()
        self._count = 0
        # coverage: ONNX node -> (its fx node, compared?); fx nodes seen and compared
        self._onnx_nodes: dict[str, list[Any]] = {}
        self._fx_nodes: dict[str, bool] = {}
        # the reference's leaves say what it is: a program's are placeholders, an ONNX
        # model's inputs and initializers (onnx-sbs diff); the coverage names it so
        self._reference_leaves: set[str] = set()
        self._fx_compared_lowerings: set[str] = set()
        # records whose own error passed but is large for their values: (ratio, n, rec)
        self._quiet: list[tuple[float, int, Record]] = []
        # the same by an elementwise op's worst element (err_elem2), and the op types of
        # each lowering: an element far off relative to itself is an error only where
        # every node of the lowering is elementwise
        self._quiet_elements: list[tuple[float, int, Record]] = []
        self._lowering_ops: dict[str, set[str]] = {}
        # nodes whose own rerun is exact but for the sign of some zeros, in run order
        self._zero_signs: list[Record] = []
        self._onnx_reference: bool | None = None  # None: no node record seen yet
        # shapes seen, to find where a wrong shape starts (shape_origin.py)
        self._shapes = ShapeOrigins()
        self._totals: dict[str, Any] = {
            "records": 0,
            "compared": 0,
            "passed": 0,
            "failed": 0,
            "drifted": 0,
            "reran": 0,
            "own_failed": 0,
            "errors": 0,
            "unpaired_ep": 0,
            "unpaired_onnx": 0,
            "not_computed": 0,
            "by_status": {},
            "by_kind": {},
        }

    def add(self, rec: Record) -> None:
        s, t = self._s, self._totals
        self._count += 1
        if rec.kind == KIND_NODE and rec.ep_target and self._onnx_reference is not False:
            self._onnx_reference = bool(_ONNX_OP.match(rec.ep_target))
        t["records"] += 1
        if rec.inputs_total is not None:  # a run over many inputs: one record per pair
            t["inputs"] = max(t.get("inputs", 0), rec.inputs_total)
        t["by_status"][rec.status] = t["by_status"].get(rec.status, 0) + 1
        t["by_kind"][rec.kind] = t["by_kind"].get(rec.kind, 0) + 1
        if rec.status in (STATUS_OK, STATUS_FAIL, STATUS_PRECISION_LOSS):
            t["compared"] += 1
        if rec.passed is True:
            t["passed"] += 1
        failed = _failed(rec)
        lost = rec.status == STATUS_PRECISION_LOSS
        if failed:
            t["failed"] += 1
            if rec.drifted:
                t["drifted"] += 1
            elif rec.kind == KIND_NODE:
                t["failed_nodes"] = t.get("failed_nodes", 0) + 1
        if rec.passed2 is not None:
            t["reran"] += 1
        if rec.passed2 is False and not lost:
            t["own_failed"] += 1
        if rec.status == STATUS_ERROR:
            t["errors"] += 1
            s.errors.append(rec)
        if rec.status == STATUS_NOT_COMPUTED:
            t["not_computed"] += 1
        if rec.status == STATUS_CHECK_ERROR:
            t["check_errors"] = t.get("check_errors", 0) + 1
            if s.check_error is None:
                s.check_error = rec.error
        if rec.kind == KIND_INPUT and NONFINITE_INPUT_NOTE in (rec.comment or ""):
            s.nonfinite_inputs.append(rec.ep_user_name or rec.ep_name or rec.onnx_name or "")
        if lost:
            t["precision_loss"] = t.get("precision_loss", 0) + 1
            if len(s.precision_losses) < _QUIET_KEPT:
                s.precision_losses.append(rec)
        if rec.status == STATUS_UNPAIRED_EP:
            t["unpaired_ep"] += 1
            s.unpaired_ep.append(rec.ep_name or "")
        elif rec.status == STATUS_UNPAIRED_ONNX:
            t["unpaired_onnx"] += 1
            s.unpaired_onnx.append(rec.onnx_name or "")

        self._count_coverage(rec)
        self._shapes.add(rec, failed)
        if rec.onnx_fx_node and rec.onnx_node_name:
            nodes = self._lowering.setdefault(rec.onnx_fx_node, [])
            if not nodes or nodes[-1] != rec.onnx_node_name:
                nodes.append(rec.onnx_node_name)
        rule = self._own_failure_rule(rec, failed)
        if rule is not None:
            if len(self._candidates) < MAX_CANDIDATES:
                self._candidates.append((rec, rule))
            if rule == RULE_RERUN and rec.onnx_fx_node and not rec.own_inputs_from:
                # this lowering makes an error on torch inputs alone
                self._failing_lowerings.add(rec.onnx_fx_node)
        if failed and s.first_failure is None:
            s.first_failure = rec
        if s.first_nan is None and _has_nan(rec):
            s.first_nan = rec
        if rec.onnx_name:
            # a precision loss passes its error on: the nodes after it do not make it
            self._onnx_ok[rec.onnx_name] = not (failed or lost)

        if (
            rec.err_abs is not None
            and rec.status != STATUS_WEIGHT_DIFFERS  # a folded weight differs by design
            and (s.max_err_abs is None or _gt(rec.err_abs, s.max_err_abs))
        ):
            s.max_err_abs, s.max_err_name = rec.err_abs, _label(rec)
        if rec.err_abs2 is not None and (s.max_own_err is None or _gt(rec.err_abs2, s.max_own_err)):
            s.max_own_err, s.max_own_err_name = rec.err_abs2, _label(rec)

        if rec.onnx_fx_node and rec.onnx_op_type:
            self._lowering_ops.setdefault(rec.onnx_fx_node, set()).add(rec.onnx_op_type)
        if rec.passed2 is True and s.first_failure is None:
            if rec.err_scale2 is not None:
                _keep_largest(self._quiet, (rec.err_scale2, -self._count, rec))
            if rec.err_elem2 is not None:
                _keep_largest(self._quiet_elements, (rec.err_elem2, -self._count, rec))
            if rec.err_zero2 and len(self._zero_signs) < _QUIET_KEPT:
                self._zero_signs.append(rec)
        own = _own_error(rec)
        if failed and own is None:
            own = math.inf  # a shape/dtype mismatch or a crash is worse than any number
        if (failed or rec.passed2 is False) and own is not None and not lost:
            # ties keep the earlier record: the heap pops the smallest (own, -count)
            _keep_largest(self._heap, (own, -self._count, self._count, rec), self._top)

    def _count_coverage(self, rec: Record) -> None:
        if rec.kind in _LEAF_KINDS and rec.ep_target:
            self._reference_leaves.add(rec.ep_target)
        if rec.kind not in (KIND_NODE, KIND_OUTPUT):
            return
        compared = rec.status in _COMPARED
        if rec.onnx_node_name:
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

    def _own_failure_rule(self, rec: Record, failed: bool) -> str | None:
        if rec.status == STATUS_PRECISION_LOSS:
            return None  # its dtype's rounding, which the op amplifies: no fault
        if rec.status == STATUS_ERROR:
            return RULE_ERROR
        if rec.status == STATUS_UNPAIRED_OUTPUT:
            return RULE_UNPAIRED_OUTPUT
        if rec.passed2 is not None:
            return RULE_RERUN if rec.passed2 is False else None
        if not failed:
            return None
        if rec.kind in _LEAF_KINDS:
            return RULE_LEAF
        if rec.kind == KIND_NODE and rec.onnx_op_type == "initializer":
            return RULE_LEAF  # a constant (an initializer): nothing upstream to blame
        if self._node_inputs is not None and rec.onnx_name in self._node_inputs:
            inputs = self._node_inputs[rec.onnx_name]
            # an input nobody compared (no torch partner) cannot be blamed: the error is
            # then located between the compared values and this node
            if all(self._onnx_ok.get(name, True) for name in inputs):
                return RULE_INPUTS_PASSED
            return None
        # Without the graph: in execution order, every value computed before the first
        # failure passed, so its inputs did.
        return RULE_FIRST_FAILURE if self._s.first_failure is None else None

    def _choose(self) -> tuple[Record | None, str | None]:
        """The first candidate whose own error does not inherit an upstream lowering's.

        An own-error run fed with values recomputed from torch inputs through another
        lowering (values without a torch twin) inherits that lowering's error: when that
        lowering fails on torch inputs alone, the candidate is not the culprit.
        """
        for rec, rule in self._candidates:
            if not (_groups(rec.own_inputs_from) & self._failing_lowerings):
                return self._shape_origin(rec, rule)
        if self._candidates:
            return self._shape_origin(*self._candidates[0])
        amplified = self._amplified()
        return (amplified, RULE_AMPLIFIED) if amplified is not None else (None, None)

    def _shape_origin(self, rec: Record, rule: str) -> tuple[Record, str]:
        """``rec``, or the node before it where its wrong shape starts (shape_origin.py)."""
        if self._node_inputs is None:
            return rec, rule
        found = self._shapes.origin(rec, self._node_inputs, self._upstream_of)
        return (found[0], RULE_SHAPE_ORIGIN) if found is not None else (rec, rule)

    def _upstream_of(self, name: str) -> set[str]:
        return self._upstream(name) or set()

    def _amplified(self) -> Record | None:
        """When values fail but no node fails its own check: the node upstream of the first
        failure whose own error is the largest for the size of its values, if that is
        large for its dtype (a tenth of the dtype's relative tolerance: many thousands of
        float32 ulps).  Its error passes where it is made and a later node (a division, a
        subtraction of close values) makes it visible."""
        first = self._s.first_failure
        if first is None or not (self._quiet or self._quiet_elements or self._zero_signs):
            return None
        if self._totals["failed"] <= self._totals["drifted"]:
            return None  # only drift, which fails no verdict: nothing to explain
        upstream = self._upstream(first.onnx_name)
        for ratio, _, rec in sorted(self._quiet, key=lambda i: i[:2], reverse=True):
            if upstream is not None and rec.onnx_name not in upstream:
                continue
            if ratio > default_tolerance(_dtype(rec))[1] / 10:
                return rec
            break  # the largest is small for its values: rounding, or one element off
        # an element off relative to itself, in a lowering of elementwise ops only
        for ratio, _, rec in sorted(self._quiet_elements, key=lambda i: i[:2], reverse=True):
            if upstream is not None and rec.onnx_name not in upstream:
                continue
            ops = self._lowering_ops.get(rec.onnx_fx_node or "", {rec.onnx_op_type})
            if not all(is_elementwise(op) for op in ops):
                continue
            if ratio > ELEMENT_ERROR_FLOOR:
                return rec
            break
        # no value differs upstream, but zeros of the other sign do (a Where or a Mul
        # that gives +0.0 for torch's -0.0), and the failure is what 1/x makes of that
        # (an infinity of the other sign): the nearest one before the failure
        infinite = first.err_abs is not None and math.isinf(first.err_abs)
        if infinite or (first.err_nan or 0) > 0:
            for rec in reversed(self._zero_signs):
                if upstream is None or rec.onnx_name in upstream:
                    return rec
        return None

    def _upstream(self, name: str | None) -> set[str] | None:
        """The values ``name`` is computed from (None: the graph is not known)."""
        if self._node_inputs is None or name is None:
            return None
        seen: set[str] = set()
        todo = [name]
        while todo:
            for i in self._node_inputs.get(todo.pop(), ()):
                if i and i not in seen:
                    seen.add(i)
                    todo.append(i)
        return seen

    def extend(self, records: Iterable[Record]) -> Summarizer:
        for rec in records:
            self.add(rec)
        return self

    def summary(self) -> Summary:
        """A snapshot: later :meth:`add` calls do not change the returned object."""
        s = self._s
        suspects = [item[3] for item in sorted(self._heap, key=lambda i: i[:2], reverse=True)]
        chosen, rule = self._choose()
        coverage = self.coverage()
        return Summary(
            first_own_failure=chosen,
            first_own_failure_rule=rule,
            first_failure=s.first_failure,
            top_suspects=suspects,
            first_nan=s.first_nan,
            unpaired_ep=list(s.unpaired_ep),
            unpaired_onnx=list(s.unpaired_onnx),
            errors=list(s.errors),
            totals=_copy_totals(self._totals),
            max_err_abs=s.max_err_abs,
            max_err_name=s.max_err_name,
            max_own_err=s.max_own_err,
            max_own_err_name=s.max_own_err_name,
            culprit=self._culprit(coverage),
            coverage=coverage,
            nonfinite_inputs=list(s.nonfinite_inputs),
            precision_losses=list(s.precision_losses),
            check_error=s.check_error,
        )

    def _culprit(self, coverage: Coverage | None = None) -> Culprit | None:
        rec, rule = self._choose()
        if rec is None or rule is None:
            return None
        own = _own_error(rec)
        fx = rec.onnx_fx_node or rec.ep_name
        nodes = list(self._lowering.get(rec.onnx_fx_node, ())) if rec.onnx_fx_node else []
        if rec.onnx_node_name and rec.onnx_node_name not in nodes:
            nodes.append(rec.onnx_node_name)
        why = _why(rec, rule, own, "reference model's" if self._onnx_reference else "torch")
        if rule == RULE_SHAPE_ORIGIN:
            why = self._shapes.why_of(rec)
        where = on_input_text(rec)
        if rule == RULE_AMPLIFIED:
            own = rec.err_abs2
            first = self._s.first_failure
            by = _label(first) if first is not None else "a later node"
            op = f" ({first.onnx_op_type})" if first is not None and first.onnx_op_type else ""
            scale = rec.err_scale2 or 0.0
            if rec.err_zero2 and not rec.err_abs2:
                made = (
                    f"its value holds {rec.err_zero2} zero(s) with the other sign than "
                    "torch's (-0.0 against +0.0: equal numbers, no error to measure), which"
                )
            elif rec.err_elem2 is not None and scale <= default_tolerance(_dtype(rec))[1] / 10:
                made = (
                    f"one of its elements is {_percent(rec.err_elem2)} off (relative to "
                    f"itself; its own error, at most {_fmt(rec.err_abs2)}, is below atol "
                    f"{_fmt(rec.atol)} beside its other values)"
                )
            else:
                made = (
                    f"its own error, {_percent(rec.err_scale2)} of its values' size "
                    f"({_fmt(rec.err_abs2)}), is below atol {_fmt(rec.atol)}"
                )
            if rec.err_zero2 and not rec.err_abs2:
                why = (
                    f"no node fails its own check, but {made} {by}{op}, the first value "
                    "that fails, turns into an infinity of the other sign"
                )
            else:
                why = (
                    f"no node fails its own check, but {made} and is amplified by "
                    f"{by}{op}, the first value that fails"
                )
            where = on_input_text(first) if first is not None else where
            # one count: the fields say what the text says, the failure it explains
            shown = first if first is not None else rec
        else:
            shown = rec
        if coverage is not None:
            why += certainty(rec, coverage.onnx_covered, coverage.onnx_nodes, coverage.low)
        if where:
            # every view shows ``why``: the input that shows the failure reaches them all
            why = f"{where}: {why}"
        return Culprit(
            rule=rule,
            why=why,
            step=rec.step,
            kind=rec.kind,
            ep_name=fx,
            ep_user_name=rec.ep_user_name,
            ep_module=rec.ep_module,
            ep_source=rec.ep_source,
            onnx_name=rec.onnx_name,
            onnx_node=rec.onnx_node_name,
            onnx_op_type=rec.onnx_op_type,
            onnx_nodes=nodes,
            own_error=own,
            own_measured=rec.err_abs2 is not None,
            atol=rec.atol,
            rtol=rec.rtol,
            fuses=rec.onnx_fuses,
            input_index=shown.input_index,
            input_name=shown.input_name,
            inputs_failing=shown.inputs_failing,
            inputs_total=shown.inputs_total,
        )


def summarize(
    records: Iterable[Record],
    *,
    node_inputs: Mapping[str, Sequence[str]] | Any | None = None,
    top: int = TOP_SUSPECTS,
    completion: Completion | None = None,
    strict: bool = False,
) -> Summary:
    """Summarise records of a side-by-side run.

    Records are taken in execution order (sorted by ``step`` when they are not).
    ``completion`` says how far the run got: a stopped or incomplete run's verdict is
    ``"stopped"`` / ``"incomplete"``, never ``"pass"`` (None: the caller vouches that the
    records are the whole run).

    - ``first_own_failure``: the first record whose *own* error fails the tolerance,
      i.e. the node that makes an error rather than inherits one.  A record qualifies when

      1. its node failed to run (status ``error``; rule ``"error"``), or
      2. it was rerun on torch inputs and that comparison failed (``passed2 is False``;
         rule ``"rerun"``; a record with ``passed2 is True`` never qualifies), or, for
         records without a rerun whose first comparison failed:
      3. it is a graph input or weight (rule ``"leaf"``: nothing upstream to blame), or
      4. ``node_inputs`` is given (``{onnx value: [input values of its node]}`` or an
         ``onnx.ModelProto``) and every input already compared passed (rule
         ``"inputs_passed"``; inputs with no torch partner count as passing, so the
         culprit is between the last compared values and this node), or
      5. without ``node_inputs``: it is the first failure overall (rule
         ``"first_failure"``): in execution order all values before it passed, so did its
         inputs.

      A candidate that shows a wrong shape (or fails to run on one) made by a node before
      it without a torch twin gives way to that node (rule ``"shape_origin"``,
      ``shape_origin.py``).

    - ``first_failure``: the first record whose first comparison failed (or errored).
    - ``top_suspects``: failing records ranked by own error (``err_abs2``, else
      ``err_abs``; NaN, mismatched shapes or dtypes and crashes rank highest), at most
      ``top``.
    - ``first_nan``: the first record with NaN/Inf differences (``err_nan > 0``,
      ``err_nan2 > 0`` or a non-finite ``err_abs``).
    - ``unpaired_ep`` / ``unpaired_onnx``: names of values only one side has.
    - ``errors``: records of nodes that failed to run.
    - ``totals``: records, compared, passed, failed, reran, own_failed, errors,
      by_status, by_kind.
    """
    if node_inputs is not None and not isinstance(node_inputs, Mapping):
        node_inputs = node_inputs_from_model(node_inputs)
    recs = records if isinstance(records, list) else list(records)
    if any(recs[i].step > recs[i + 1].step for i in range(len(recs) - 1)):
        recs = sorted(recs, key=lambda r: r.step)
    summary = Summarizer(node_inputs=node_inputs, top=top).extend(recs).summary()
    summary.completion = completion
    summary.strict = strict
    return summary


def _dtype(rec: Record) -> str:
    return (rec.onnx_shape_type or "").split("[", 1)[0]


def _keep_largest(heap: list[tuple], item: tuple, size: int = _QUIET_KEPT) -> None:
    """Keeps the ``size`` largest items of a heap by their first two fields (ties: the
    earlier record, whose second field, minus its count, is larger)."""
    if len(heap) < size:
        heapq.heappush(heap, item)
    elif item[:2] > heap[0][:2]:
        heapq.heapreplace(heap, item)


def _percent(ratio: float | None) -> str:
    if ratio is None:
        return "?"
    return f"{ratio * 100:.2g}%" if ratio >= 1e-3 else f"{ratio:.2g}"


def _uncompared_reason(rec: Record) -> str:
    if rec.status == STATUS_UNPAIRED_ONNX:
        return "no torch twin"
    if rec.status in (STATUS_ERROR, STATUS_NOT_COMPUTED):
        return "not computed"
    if rec.status == STATUS_INTERNAL:
        return "internal to a fused node"
    if rec.status == STATUS_CHECK_ERROR:
        return "your compare function failed"
    return "not compared (random, empty or not a tensor)"


def failing_text(failed: int, drifted: int) -> str:
    """How many values fail, and how many of them only inherit their error (drifted): the
    one wording of the terminal, the widget and the reports, so a red count never reads as
    that many culprits."""
    if not drifted:
        return f"{failed} failing"
    return f"{failed} failing, of which {drifted} only inherit their error"


def drift_text(drifted: int, verdict: str) -> str:
    """What drifted values mean for the verdict, in a sentence."""
    values = "1 value is" if drifted == 1 else f"{drifted} values are"
    why = (
        f"{values} beyond tolerance while each node, rerun on the torch values of its "
        "inputs, agrees with torch: the difference is carried from upstream"
    )
    if verdict == "pass":
        return f"{why} (rounding the graph amplifies), and the outputs agree"
    return why


def precision_loss_text(summary: Summary, most: int = 4) -> str:
    """The precision losses of a run in a sentence: which nodes, by how much, and what
    that means for the values after them."""
    losses = summary.precision_losses
    count = summary.totals.get("precision_loss", len(losses))
    named = ", ".join(
        f"{_label(r)} [{r.onnx_op_type or r.kind}] ({_fmt(_own_error(r))})" for r in losses[:most]
    )
    more = f" and {count - most} more" if count > most else ""
    nodes = "1 node loses" if count == 1 else f"{count} nodes lose"
    t = summary.totals
    own = t.get("reran", 0) > t.get("precision_loss", 0)  # reruns besides the rule's
    dtype = _dtype(losses[0]) if losses else "its dtype"
    text = (
        f"{nodes} precision in {dtype}: {named}{more}; their inputs' rounding, which the op "
        "amplifies, is the whole error (computed exactly they agree): no fault of the "
        "export; keep them in float32 (onnx-sbs precision) to avoid it"
    )
    if summary.culprit is None and t.get("failed_nodes", 0):
        text += (
            f"; {t['failed_nodes']} value(s) after them fail that no rerun on torch's "
            "inputs told apart from the loss they carry"
        )
        if not own:
            text += " (own_error=True, --own-error, reruns every node)"
    elif summary.culprit is None and summary.verdict == "fail":
        text += (
            "; the loss reaches the outputs beyond tolerance: in this precision the model "
            "does not compute the program within it"
        )
    return text


def first_own_failure(records: Iterable[Record], **kwargs: Any) -> Record | None:
    """Shortcut: ``summarize(records).first_own_failure``."""
    return summarize(records, **kwargs).first_own_failure


def on_input_text(rec: Record) -> str:
    """Where a record of a run over many inputs comes from ("on input 7 (b.pt), 1 of
    32 inputs failing here"); "" for a run over one input."""
    if rec.input_index is None:
        return ""
    name = f" ({rec.input_name})" if rec.input_name else ""
    text = f"on input {rec.input_index}{name}"
    if rec.inputs_total is not None and rec.inputs_failing is not None:
        text += f", {rec.inputs_failing} of {rec.inputs_total} inputs failing here"
    return text


def _label(rec: Record) -> str:
    return rec.onnx_name or rec.ep_name or f"step {rec.step}"


def suspect_name(rec: Record) -> str:
    """A suspect as the widget names it: the user's fx node name (not the prepared
    program's ``getitem_9``), the module it lives in, and its ONNX value when named
    otherwise."""
    name = rec.ep_user_name or rec.ep_name or rec.onnx_name or f"step {rec.step}"
    where = f" in {rec.ep_module}" if rec.ep_module else ""
    value = f" (value {rec.onnx_name})" if rec.onnx_name and rec.onnx_name != name else ""
    return f"{name}{where}{value}"


def _printable_label(rec: Record) -> str:
    return _printable(_label(rec))


def _printable(text: str) -> str:
    """Model-supplied names with control characters escaped, safe to print in a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _gt(a: float, b: float) -> bool:
    """a > b with NaN larger than anything (a NaN error is the worst error)."""
    if math.isnan(b):
        return False
    return math.isnan(a) or a > b


def _fmt(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}"


def _json_float(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return str(value)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return _json_float(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _copy_totals(totals: dict[str, Any]) -> dict[str, Any]:
    out = dict(totals)
    out["by_status"] = dict(totals["by_status"])
    out["by_kind"] = dict(totals["by_kind"])
    return out


__all__ = [
    "Culprit",
    "Summarizer",
    "Summary",
    "first_own_failure",
    "node_inputs_from_model",
    "precision_loss_text",
    "summarize",
]
