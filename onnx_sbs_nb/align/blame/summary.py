"""The answer over a stream of records: which node is wrong, and what else went wrong.

:func:`summarize` is what every view (widget, magic, CLI, reports) shows first.  It is
pure Python over :class:`~onnx_sbs_nb.records.Record` objects (no pandas, no widget), and
linear in the number of records, so a view can call it again on a growing list, or feed
records one at a time to a :class:`Summarizer`.

The culprit is chosen by the culprit rules (``rules.py``, in order, over what
``context.py`` gathers); the culprit is a view of its record (``culprit.py``); its why is
worded in ``why.py``; the coverage is counted in ``coverage.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...completion import STOPPED, STOPPED_BEFORE_END, Completion
from ...files import json_safe
from ...records import (
    ILL_CONDITIONED_NOTE,
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    NEAR_TIE_NOTE,
    NONFINITE_INPUT_NOTE,
    ONNXRUNTIME_RUNS_IT,
    STATUS_CHECK_ERROR,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_NOT_COMPARED,
    STATUS_NOT_COMPUTED,
    STATUS_OK,
    STATUS_PRECISION_LOSS,
    STATUS_QUANTIZATION_NOISE,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
    STATUS_WEIGHT_DIFFERS,
    UNPAIRED,
    Record,
)
from .context import QUIET_KEPT, BlameContext, failed, keep_largest, own_error
from .coverage import Coverage, CoverageCount
from .culprit import Culprit
from .decisions import Decisions, before_failure, carried_from, decision_text
from .precision_text import only_rounding, precision_loss_text
from .quantization_text import (
    count_quantization_noise,
    lossy_outputs_text,
    quantization_noise_text,
)
from .rules import RECORD_RULES, choose_culprit
from .text import (
    count_differing_weight,
    drift_text,
    failing_text,
    float_or_none,
    fmt,
    json_float,
    label,
    on_input_text,
    outputs_text,
    printable,
    runner_failed_text,
    suspect_name,
    weights_text,
)
from .weight_reader import explained_by_weight

TOP_SUSPECTS = 10


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


def _has_nan(rec: Record) -> bool:
    for value in (rec.err_nan, rec.err_nan2):
        if value is not None and (value > 0 or math.isnan(value)):
            return True
    if rec.err_abs is not None and not math.isfinite(rec.err_abs):
        return True
    return "nan" in (rec.status or "").lower()


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
    # decisions (ArgMax, ArgMin, TopK) whose indices a tie or a near tie flipped, in run
    # order (blame/decisions.py): no culprit, the origin of what fails after them
    decision_flips: list[Record] = field(default_factory=list)

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
        if failed > 0 and only_rounding(t):
            failed = 0  # every failure carries rounding torch's own value shares
        if failed > 0 or t.get("own_failed", 0):
            return "fail"
        # values the model could not compute were compared with nothing, pairs the user's
        # compare function failed on were judged by nothing: no pass
        # (and graph outputs with no twin in the other ONNX model: onnx-sbs diff)
        unjudged = t.get("not_computed", 0) or t.get("check_errors", 0)
        return "incomplete" if unjudged or t.get("unmatched_outputs", 0) else "pass"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict (records as :meth:`Record.to_dict`, non-finite floats as str)."""

        def rec(r: Record | None) -> dict[str, Any] | None:
            return None if r is None else r.to_dict()

        totals = json_safe(self.totals)
        totals["carried"] = self._carried()  # what the views' failing counts say is inherited
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
            "max_err_abs": json_float(self.max_err_abs),
            "max_err_name": self.max_err_name,
            "max_own_err": json_float(self.max_own_err),
            "max_own_err_name": self.max_own_err_name,
            "culprit": self.culprit.to_dict() if self.culprit is not None else None,
            "coverage": self.coverage.to_dict(),
            "partial": self.partial,
            "strict": self.strict,
            "nonfinite_inputs": list(self.nonfinite_inputs),
            "precision_losses": [r.to_dict() for r in self.precision_losses],
            "check_error": self.check_error,
            "decision_flips": [r.to_dict() for r in self.decision_flips],
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
            # "carried" is said anew from the rest (to_dict's, for the views)
            totals={k: v for k, v in d.get("totals", {}).items() if k != "carried"},
            max_err_abs=float_or_none(d.get("max_err_abs")),
            max_err_name=d.get("max_err_name"),
            max_own_err=float_or_none(d.get("max_own_err")),
            max_own_err_name=d.get("max_own_err_name"),
            culprit=Culprit.from_dict(d["culprit"]) if d.get("culprit") else None,
            completion=Completion.from_dict(d["completion"]) if d.get("completion") else None,
            coverage=Coverage.from_dict(d.get("coverage") or {}),
            strict=bool(d.get("strict", False)),
            nonfinite_inputs=list(d.get("nonfinite_inputs", [])),
            precision_losses=[Record.from_dict(r) for r in d.get("precision_losses", [])],
            check_error=d.get("check_error") if isinstance(d.get("check_error"), str) else None,
            decision_flips=[Record.from_dict(r) for r in d.get("decision_flips", [])],
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

    def _carried(self) -> str:
        before = [*self.precision_losses, *self.errors]
        has_culprit, flips = self.culprit is not None, bool(self.decision_flips)
        return carried_from(self.totals, has_culprit, self.first_failure, before, flips)

    def to_text(self, max_suspects: int = 5) -> str:
        """A few lines for a terminal: verdict, culprit, top suspects, counts."""
        t = self.totals
        counts = (
            f"{t.get('records', 0)} records, {t.get('compared', 0)} compared, "
            f"{failing_text(t.get('failed', 0), t.get('inherited', 0), self._carried())}, "
            f"{len(self.errors)} errors"
        )
        if t.get("not_computed", 0):
            counts += f", {t['not_computed']} not computed"
        if t.get("unmatched_outputs", 0):
            n = t["unmatched_outputs"]
            counts += f", {n} output{'s' if n != 1 else ''} with no twin"
        if t.get("inputs"):
            counts += f", worst of {t['inputs']} inputs"
        c = self.completion
        head = f"verdict: {self.verdict.upper()}"
        if c is not None and c.finished and c.nodes:
            counts = f"{c.nodes}, {counts}"
        elif c is not None and not c.finished:
            # over many inputs, the nodes are those of the input cut short: the inputs say it
            head += f" at {c.nodes}" if c.nodes and not t.get("inputs") else ""
            # a plain stop says no more than STOPPED; "after 5 of 9 inputs" does
            if c.reason and (c.state != STOPPED or c.reason != STOPPED_BEFORE_END):
                head += f" ({printable(c.reason)})"
        if self.partial:
            on = f"{self.coverage.onnx_covered} of {self.coverage.onnx_nodes} ONNX nodes"
            head += f" (strict: it passes on only {on})" if self.strict else f" on {on}"
        lines = [f"{head}  ({counts})"]
        if t.get("check_errors"):
            lines.append(
                f"compare function broken on {t['check_errors']} pairs, which are not judged "
                f"(nothing is said of the model there): {printable(self.check_error or '')}"
            )
        if self.coverage.onnx_nodes:
            lines.append(f"coverage: {self.coverage.to_text()}")
        if t.get("runner_failed"):
            lines.append(f"runner failed: {printable(runner_failed_text(t))}")
        if self.culprit is not None:
            c = self.culprit
            lines.append(f"culprit: {printable(c.label())}")
            if c.ep_source:
                lines.append(f"  at {printable(c.ep_source)}")
            lines.append(f"  why: {printable(c.why)}")
            if c.bundle:
                lines.append(f"  replay bundle: {printable(c.bundle)}")
        elif self.decision_flips and self._carried() == "decision":
            flips, verdict = self.decision_flips, self.verdict
            lines.append(f"origin: {decision_text(flips, t, verdict)}")
        elif self.first_failure is not None:
            where = on_input_text(self.first_failure)
            where = f" ({printable(where)})" if where else ""
            lines.append(f"first failure: {_printable_label(self.first_failure)}{where}")
        if t.get("drifted", 0):
            carried = t.get("inherited", 0) - t["drifted"]
            drift = drift_text(
                t["drifted"],
                self.verdict,
                carried,
                self.coverage.reference_onnx,
                self._carried(),
                _printable_label(self.decision_flips[0]) if self.decision_flips else None,
            )
            lines.append(f"drift: {drift}")
        if self.verdict == "fail" and t.get("failed") and not t.get("failed_outputs"):
            if t["by_kind"].get(KIND_OUTPUT):
                lines.append(f"outputs: {outputs_text(t)}")
        if self.precision_losses:
            lines.append(f"precision loss: {printable(precision_loss_text(self))}")
        if t.get("quantization_noise"):
            noise = quantization_noise_text(t, self.coverage.reference_onnx)
            lines.append(f"quantization noise: {printable(noise)}")
        if t.get("quantization_lossy_outputs"):
            lines.append(f"accuracy: {printable(lossy_outputs_text(t))}")
        if t.get("weights_unexplained") or t.get("weights_compensated"):
            lines.append(f"weights: {printable(weights_text(t))}")
        if self.nonfinite_inputs:
            names = ", ".join(printable(n) for n in self.nonfinite_inputs)
            lines.append(
                f"non-finite inputs: {names} (NaN or infinities): where the values computed "
                "from them are NaN/inf, only the NaN/inf patterns were compared"
            )
        if self.first_nan is not None:
            lines.append(f"first NaN/Inf: {_printable_label(self.first_nan)}")
        if self.top_suspects:
            shown = self.top_suspects[:max_suspects]
            ops = [printable(r.onnx_op_type or r.kind or "") for r in shown]
            # as wide as the longest op shown (SkipLayerNormalization whole, never cut)
            w = max([2, *map(len, ops)])
            lines.append(f"  {'step':>5}  {'own err':>10}  {'err':>10}  {'op':<{w}} name")
            for r, op in zip(shown, ops):
                own = fmt(r.err_abs2) if r.err_abs2 is not None else "-"
                lines.append(
                    f"  {r.step:>5}  {own:>10}  {fmt(r.err_abs):>10}  "
                    f"{op:<{w}} {printable(suspect_name(r))}"
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
                f"max err_abs: {fmt(self.max_err_abs)} at {printable(self.max_err_name or '')}"
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
        self._top = top
        self._s = Summary()
        self._heap: list[tuple[float, int, int, Record]] = []  # min-heap of suspects
        self._count = 0
        # what the culprit rules read (context.py), and the coverage (coverage.py)
        self._blame = BlameContext(RECORD_RULES, node_inputs)
        self._decisions = Decisions()  # decisions a tie flipped (decisions.py)
        self._coverage = CoverageCount()
        self._totals: dict[str, Any] = {
            "records": 0,
            "compared": 0,
            "passed": 0,
            "failed": 0,
            "drifted": 0,
            "inherited": 0,
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
        s = self._s
        self._count += 1
        is_failed = failed(rec)
        # no fault of the export: precision loss, quantization noise
        lost = rec.status in (STATUS_PRECISION_LOSS, STATUS_QUANTIZATION_NOISE)
        if self._decisions.add(rec):
            self._totals["decision_flips"] = self._decisions.count
        self._count_totals(rec, is_failed, lost)
        self._coverage.add(rec)
        self._blame.add(rec, is_failed, lost)
        if s.first_nan is None and _has_nan(rec):
            s.first_nan = rec
        if (
            rec.err_abs is not None
            and rec.status != STATUS_WEIGHT_DIFFERS  # a folded weight differs by design
            and (s.max_err_abs is None or _gt(rec.err_abs, s.max_err_abs))
        ):
            s.max_err_abs, s.max_err_name = rec.err_abs, label(rec)
        if rec.err_abs2 is not None and (s.max_own_err is None or _gt(rec.err_abs2, s.max_own_err)):
            s.max_own_err, s.max_own_err_name = rec.err_abs2, label(rec)
        own = own_error(rec)
        if is_failed and own is None:
            own = math.inf  # a shape/dtype mismatch or a crash is worse than any number
        # a reader whose own error is a weight's it reads is no suspect (weight_reader.py)
        if (is_failed or rec.passed2 is False) and own is not None and not lost:
            if explained_by_weight(rec):
                return
            # ties keep the earlier record: the heap pops the smallest (own, -count)
            keep_largest(self._heap, (own, -self._count, self._count, rec), self._top)

    def _count_totals(self, rec: Record, is_failed: bool, lost: bool) -> None:
        s, t = self._s, self._totals
        t["records"] += 1
        if rec.inputs_total is not None:  # a run over many inputs: one record per pair
            t["inputs"] = max(t.get("inputs", 0), rec.inputs_total)
        t["by_status"][rec.status] = t["by_status"].get(rec.status, 0) + 1
        t["by_kind"][rec.kind] = t["by_kind"].get(rec.kind, 0) + 1
        if rec.status in (STATUS_OK, STATUS_FAIL, STATUS_PRECISION_LOSS, STATUS_QUANTIZATION_NOISE):
            t["compared"] += 1
        if rec.passed is True:
            t["passed"] += 1
        if rec.kind == KIND_OUTPUT and rec.status == STATUS_QUANTIZATION_NOISE:
            t["noisy_outputs"] = t.get("noisy_outputs", 0) + 1
        if is_failed:
            t["failed"] += 1
            if rec.kind == KIND_OUTPUT:
                t["failed_outputs"] = t.get("failed_outputs", 0) + 1
            if rec.inherits:
                t["inherited"] += 1
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
            if rec.error and rec.error.endswith(ONNXRUNTIME_RUNS_IT):  # the runner's failure
                t["runner_failed"] = t.get("runner_failed", 0) + 1
                t.setdefault("runner_failed_first", f"{label(rec)}: {rec.error}")
        if (
            rec.status == STATUS_NOT_COMPARED
            and rec.kind == KIND_OUTPUT
            and rec.paired_by == UNPAIRED
        ):
            t["unmatched_outputs"] = t.get("unmatched_outputs", 0) + 1
        if rec.status == STATUS_WEIGHT_DIFFERS:
            count_differing_weight(t, rec)
        if rec.status == STATUS_CHECK_ERROR:
            t["check_errors"] = t.get("check_errors", 0) + 1
            if s.check_error is None:
                s.check_error = rec.error
        if rec.kind == KIND_INPUT and NONFINITE_INPUT_NOTE in (rec.comment or ""):
            s.nonfinite_inputs.append(rec.ep_user_name or rec.ep_name or rec.onnx_name or "")
        if rec.status == STATUS_QUANTIZATION_NOISE:
            count_quantization_noise(t, rec)
        elif lost and NEAR_TIE_NOTE not in (rec.comment or ""):  # a flip: decisions.py
            t["precision_loss"] = t.get("precision_loss", 0) + 1
            if ILL_CONDITIONED_NOTE in (rec.comment or ""):
                t["ill_conditioned"] = t.get("ill_conditioned", 0) + 1
            if len(s.precision_losses) < QUIET_KEPT:
                s.precision_losses.append(rec)
        if rec.status == STATUS_UNPAIRED_EP:
            t["unpaired_ep"] += 1
            s.unpaired_ep.append(rec.ep_name or "")
        elif rec.status == STATUS_UNPAIRED_ONNX:
            t["unpaired_onnx"] += 1
            s.unpaired_onnx.append(rec.onnx_name or "")

    def coverage(self) -> Coverage:
        return self._coverage.coverage()

    def extend(self, records: Iterable[Record]) -> Summarizer:
        for rec in records:
            self.add(rec)
        return self

    def summary(self) -> Summary:
        """A snapshot: later :meth:`add` calls do not change the returned object."""
        s = self._s
        suspects = [item[3] for item in sorted(self._heap, key=lambda i: i[:2], reverse=True)]
        coverage = self.coverage()
        culprit = choose_culprit(self._blame, coverage)
        first, flips = self._blame.first_failure, self._decisions.records
        up = self._blame.upstream(first.onnx_name) if first is not None and flips else None
        self._totals["decision_origin"] = before_failure(flips, first, up)
        return Summary(
            first_own_failure=culprit.record if culprit is not None else None,
            first_own_failure_rule=culprit.rule if culprit is not None else None,
            first_failure=self._blame.first_failure,
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
            culprit=culprit,
            coverage=coverage,
            nonfinite_inputs=list(s.nonfinite_inputs),
            precision_losses=list(s.precision_losses),
            check_error=s.check_error,
            decision_flips=list(self._decisions.records),
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

    - ``culprit`` / ``first_own_failure``: the node that makes an error rather than
      inherits one, as the culprit rules choose it (``rules.CULPRIT_RULES``, in order;
      ``first_own_failure_rule`` and ``culprit.rule`` name the rule).  A record makes its
      own error when

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

      The first such record is the culprit, unless its wrong shape (or its failure to run
      on one) was made by a node before it without a torch twin: that node (rule
      ``"shape_origin"``, ``shape_origin.py``).  With none, a node whose error under
      tolerance the first failure amplifies (rule ``"amplified"``, ``amplified.py``).

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


def first_own_failure(records: Iterable[Record], **kwargs: Any) -> Record | None:
    """Shortcut: ``summarize(records).first_own_failure``."""
    return summarize(records, **kwargs).first_own_failure


def _printable_label(rec: Record) -> str:
    return printable(label(rec))


# the name the command line and the culprit bundle import it by
_printable = printable


def _gt(a: float, b: float) -> bool:
    """a > b with NaN larger than anything (a NaN error is the worst error)."""
    if math.isnan(b):
        return False
    return math.isnan(a) or a > b


def _copy_totals(totals: dict[str, Any]) -> dict[str, Any]:
    out = dict(totals)
    out["by_status"] = dict(totals["by_status"])
    out["by_kind"] = dict(totals["by_kind"])
    return out


__all__ = [
    "Coverage",
    "Culprit",
    "Summarizer",
    "Summary",
    "drift_text",
    "failing_text",
    "first_own_failure",
    "node_inputs_from_model",
    "on_input_text",
    "precision_loss_text",
    "summarize",
    "suspect_name",
]
