"""What the culprit rules read, and what a culprit rule is.

A culprit rule (``rules.py`` holds them all, in order) is a small object with a ``name``
and a ``stage``:

- stage ``record``: tried on each record as the run streams, in order, to tell whether the
  record makes its own error: ``qualifies(rec, failed, ctx)`` answers True (it does: a
  candidate, named by this rule), False (it does not: no later rule is asked) or None (not
  this rule's case).  ``why(rec, own, ref)`` is its sentence when its candidate is chosen.
- stage ``run``: tried once per summary, in order, over the whole :class:`BlameContext`:
  ``culprit(ctx)`` returns the :class:`~.culprit.Culprit` or None; the first that answers
  names it, and the culprit's ``rule`` says which (or, for the first own failure, which
  record rule proved it).

:class:`BlameContext` is fed record by record (O(1) each) by the summary and holds what
the rules read: the candidates in run order, the lowerings (fx node -> its ONNX nodes),
the lowerings that fail on torch inputs alone, the values that agreed, the shapes
(``shape_origin.py``), the errors under tolerance a later node may amplify.
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from ...records import (
    FAILING_STATUSES,
    KIND_NODE,
    STATUSES,
    Record,
)
from .culprit import Culprit
from .shape_origin import ShapeOrigins

STAGE_RECORD = "record"  # on each record as it arrives: does it make its own error?
STAGE_RUN = "run"  # once over the run: which node is the culprit?
STAGES = (STAGE_RECORD, STAGE_RUN)

# candidates kept for the choice of the culprit (the first clean one wins)
MAX_CANDIDATES = 512
# how many errors under tolerance are kept (the largest relative to their values)
QUIET_KEPT = 64

_JUDGED_ELSEWHERE = frozenset(k for k, v in STATUSES.items() if v.judged_elsewhere)
# an ONNX op type (the reference of `onnx-sbs diff` is a model): a torch target has dots
_ONNX_OP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class RecordRule(Protocol):
    """A culprit rule of stage ``record`` (see the module's doc)."""

    name: str
    stage: str
    # whether its why says so when the node computes fx nodes whose weights were folded
    folded_note: bool
    # whether it proves the error on torch inputs alone (a rerun): the record's lowering
    # then makes an error itself, and candidates fed through it inherit that error
    on_torch_inputs: bool

    def qualifies(self, rec: Record, failed: bool, ctx: BlameContext) -> bool | None: ...

    def why(self, rec: Record, own: float | None, ref: str) -> str: ...


class RunRule(Protocol):
    """A culprit rule of stage ``run`` (see the module's doc)."""

    name: str
    stage: str

    def culprit(self, ctx: BlameContext) -> Culprit | None: ...


CulpritRule = RecordRule | RunRule


@dataclass(frozen=True)
class Candidate:
    """A record that makes its own error, and the record rule that says so."""

    record: Record
    rule: RecordRule


def failed(rec: Record) -> bool:
    """The first comparison (or running the node) failed.

    A weight whose consumers agree, a value not computed because of an upstream failure
    and a pairing the shapes disproved are not failures of their own.
    """
    if rec.status in FAILING_STATUSES:
        return True
    return rec.passed is False and rec.status not in _JUDGED_ELSEWHERE


def own_error(rec: Record) -> float | None:
    """Own error when the node was rerun on torch inputs, else the first error."""
    value = rec.err_abs2 if rec.err_abs2 is not None else rec.err_abs
    if value is None:
        return None
    if isinstance(value, str):  # records rebuilt from JSON by hand may keep "nan"
        value = float(value)
    return math.inf if math.isnan(value) else float(value)


def keep_largest(heap: list[tuple], item: tuple, size: int = QUIET_KEPT) -> None:
    """Keeps the ``size`` largest items of a heap by their first two fields (ties: the
    earlier record, whose second field, minus its count, is larger)."""
    if len(heap) < size:
        heapq.heappush(heap, item)
    elif item[:2] > heap[0][:2]:
        heapq.heapreplace(heap, item)


def _groups(text: str | None) -> set[str]:
    return {g.strip() for g in text.split(",") if g.strip()} if text else set()


class BlameContext:
    """What the culprit rules read, fed one record at a time in run order."""

    def __init__(
        self,
        record_rules: Sequence[RecordRule],
        node_inputs: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.record_rules = tuple(record_rules)
        # {ONNX value: the input values of its node}, None when the graph is not known
        self.node_inputs = node_inputs
        # verdict of each ONNX value compared so far (True: correct)
        self.onnx_ok: dict[str, bool] = {}
        self.first_failure: Record | None = None
        self.candidates: list[Candidate] = []
        # fx nodes whose lowering makes an error on torch inputs alone
        self.failing_lowerings: set[str] = set()
        # ONNX node names of each fx node's lowering, as the records show them
        self.lowering: dict[str, list[str]] = {}
        # the op types of each lowering
        self.lowering_ops: dict[str, set[str]] = {}
        # records whose own error passed but is large for their values: (ratio, -n, rec)
        self.quiet: list[tuple[float, int, Record]] = []
        # the same by an elementwise op's worst element (err_elem2): an element far off
        # relative to itself is an error only where every node of the lowering is
        # elementwise
        self.quiet_elements: list[tuple[float, int, Record]] = []
        # nodes whose own rerun is exact but for the sign of some zeros, in run order
        self.zero_signs: list[Record] = []
        # shapes seen, to find where a wrong shape starts (shape_origin.py)
        self.shapes = ShapeOrigins()
        self.onnx_reference: bool | None = None  # None: no node record seen yet
        self.failures = 0  # records that failed
        self.drifted = 0  # ... of which drifted (they fail no verdict alone)
        self._count = 0

    @property
    def reference(self) -> str:
        """What the reference side is, in a why: "torch", or "reference model's" when two
        ONNX models are compared."""
        return "reference model's" if self.onnx_reference else "torch"

    def own_rule(self, rec: Record, failed: bool) -> RecordRule | None:
        """The record rule that says ``rec`` makes its own error (None: none does)."""
        for rule in self.record_rules:
            answer = rule.qualifies(rec, failed, self)
            if answer is not None:
                return rule if answer else None
        return None

    def add(self, rec: Record, failed: bool, lost: bool) -> None:
        """Takes in the next record: ``failed`` (its comparison failed, see
        :func:`failed`), ``lost`` (its error is its dtype's rounding, amplified)."""
        self._count += 1
        if rec.kind == KIND_NODE and rec.ep_target and self.onnx_reference is not False:
            self.onnx_reference = bool(_ONNX_OP.match(rec.ep_target))
        self.shapes.add(rec, failed)
        if rec.onnx_fx_node and rec.onnx_node_name:
            nodes = self.lowering.setdefault(rec.onnx_fx_node, [])
            if not nodes or nodes[-1] != rec.onnx_node_name:
                nodes.append(rec.onnx_node_name)
        rule = self.own_rule(rec, failed)
        if rule is not None:
            if len(self.candidates) < MAX_CANDIDATES:
                self.candidates.append(Candidate(rec, rule))
            if rule.on_torch_inputs and rec.onnx_fx_node and not rec.own_inputs_from:
                # this lowering makes an error on torch inputs alone
                self.failing_lowerings.add(rec.onnx_fx_node)
        if failed:
            self.failures += 1
            self.drifted += rec.drifted
            if self.first_failure is None:
                self.first_failure = rec
        if rec.onnx_name:
            # a precision loss passes its error on: the nodes after it do not make it
            self.onnx_ok[rec.onnx_name] = not (failed or lost)
        if rec.onnx_fx_node and rec.onnx_op_type:
            self.lowering_ops.setdefault(rec.onnx_fx_node, set()).add(rec.onnx_op_type)
        if rec.passed2 is True and self.first_failure is None:
            if rec.err_scale2 is not None:
                keep_largest(self.quiet, (rec.err_scale2, -self._count, rec))
            if rec.err_elem2 is not None:
                keep_largest(self.quiet_elements, (rec.err_elem2, -self._count, rec))
            if rec.err_zero2 and len(self.zero_signs) < QUIET_KEPT:
                self.zero_signs.append(rec)

    def first_candidate(self) -> Candidate | None:
        """The first candidate whose own error does not inherit an upstream lowering's
        (else the first candidate).

        An own-error run fed with values recomputed from torch inputs through another
        lowering (values without a torch twin) inherits that lowering's error: when that
        lowering fails on torch inputs alone, the candidate is not the culprit.
        """
        for cand in self.candidates:
            if not (_groups(cand.record.own_inputs_from) & self.failing_lowerings):
                return cand
        return self.candidates[0] if self.candidates else None

    def upstream(self, name: str | None) -> set[str] | None:
        """The values ``name`` is computed from (None: the graph is not known)."""
        if self.node_inputs is None or name is None:
            return None
        seen: set[str] = set()
        todo = [name]
        while todo:
            for i in self.node_inputs.get(todo.pop(), ()):
                if i and i not in seen:
                    seen.add(i)
                    todo.append(i)
        return seen

    def culprit(
        self,
        rec: Record,
        rule: str,
        why: str,
        own: float | None,
        explains: Record | None = None,
    ) -> Culprit:
        """The culprit ``rule`` chose: ``rec``, with the ONNX nodes of its lowering."""
        nodes = list(self.lowering.get(rec.onnx_fx_node, ())) if rec.onnx_fx_node else []
        if rec.onnx_node_name and rec.onnx_node_name not in nodes:
            nodes.append(rec.onnx_node_name)
        return Culprit(
            record=rec,
            rule=rule,
            why=why,
            onnx_nodes=nodes,
            own_error=own,
            own_measured=rec.err_abs2 is not None,
            explains=explains,
        )


__all__ = [
    "MAX_CANDIDATES",
    "QUIET_KEPT",
    "STAGES",
    "STAGE_RECORD",
    "STAGE_RUN",
    "BlameContext",
    "Candidate",
    "CulpritRule",
    "RecordRule",
    "RunRule",
    "failed",
    "keep_largest",
    "own_error",
]
