"""The one loop of the engine: a reference side and a candidate ONNX model, step by step.

:class:`SideBySideRun` runs the two sides (``sides.py``) in the order the plan gives
(``plan.py``), compares each pair as soon as both values exist, optionally runs each
candidate node again on the reference values of its inputs (its *own error*), and frees
every value after its last use.  The same loop compares a torch program with its export
(``run.py``), one model on two runtimes (``devices.py``) and two models (``two_models.py``).

The engine imports no view code (no tqdm, pandas, plotly or widget): views read
``run.status`` and consume the records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx

from ...records import STATUS_WEIGHT_DIFFERS, Record, RunStatus
from ...records import join_comments as _join
from ..judge.judging import SbsMismatchError
from ..judge.saturation import held_sources
from ..judge.undefined import undefined_values
from ..judge.unordered import order_free_groups
from ..pairing.pairs import Pairing
from .options import RunOptions
from .own_error import OwnErrors
from .pair_judge import PairJudge
from .plan import REF, Plan, schedule
from .randomness import random_values
from .resets import Resets
from .run_ahead import RunAhead
from .second_opinion import second_opinion
from .side import ReferenceSide
from .sides import FxSide, OnnxSide
from .unpaired import candidate_only_record, reference_only_record, unpaired_initializers
from .weight_blame import WeightBlame


@dataclass
class RunValues:
    """What a run holds between steps; the plan says when each value goes."""

    ref: dict[str, Any]  # reference values by name
    cand: dict[str, Any]  # candidate values by name
    # own-error values, their reference inputs ("ref", name) and the lowerings they were
    # recomputed through ("from", name)
    own: dict[Any, Any] = field(default_factory=dict)
    ref_times: dict[str, float] = field(default_factory=dict)
    cand_times: dict[str, float] = field(default_factory=dict)
    ref_errors: dict[str, str] = field(default_factory=dict)
    cand_errors: dict[str, str] = field(default_factory=dict)
    missing: set[str] = field(default_factory=set)  # not computed: an input was missing
    ref_weights_live: int = 0
    peak_live: int = 0


def _plan(reference: Any, candidate: OnnxSide, pairing: Pairing, needs_inputs: bool) -> Plan:
    """The run's plan; kept with the candidate's tables when those and the pairing are
    kept for a second run of the same program and model (``setup_cache.py``)."""

    def make() -> Plan:
        # the values QDQ pairs inside a rerun quantize, kept for the saturation rule: a
        # walk of the graph, done only when a plan is made, not on each warm run
        hold = held_sources(candidate.model.graph, pairing.by_onnx) if needs_inputs else None
        return schedule(reference.graph, candidate.graph, pairing, needs_inputs, hold=hold)

    if pairing.cache_key is None:
        return make()
    key = (pairing.cache_key, needs_inputs)
    plans = candidate.tables.plans
    plan = plans.get(key)
    if plan is None or plan[0] is not reference.graph:
        plan = plans[key] = (reference.graph, make())
    return plan[1]


# sides' forget methods that do nothing: a torch program keeps no copy of its values
_KEEPS_NOTHING = (FxSide.forget, ReferenceSide.forget)


def _order_free(reference: Any, candidate: OnnxSide, pairing: Pairing) -> dict[str, Any]:
    """:func:`.unordered.order_free_groups` of the run (a walk of every node), kept beside
    the plan (same key: the pairing's, the same reference graph); each run gets its own
    dict of the (frozen) groups."""

    def make() -> dict[str, Any]:
        partner = {o: p.fx_name for o, p in pairing.by_onnx.items()}
        return order_free_groups(candidate.nodes, reference, partner)

    if pairing.cache_key is None:
        return make()
    key = ("order_free", pairing.cache_key)
    plans = candidate.tables.plans
    kept = plans.get(key)
    if kept is None or kept[0] is not reference.graph:
        kept = plans[key] = (reference.graph, make())
    return dict(kept[1])


class SideBySideRun:
    """One side-by-side run over a reference side and a candidate ONNX model.

    Iterate it (once) to get the records; ``records`` keeps them, ``status`` tells the
    progress, ``stop()`` ends the run after the current step with everything kept.
    """

    def __init__(
        self,
        reference: ReferenceSide,
        candidate: OnnxSide,
        pairing: Pairing,
        options: RunOptions,
        status: RunStatus | None = None,
    ) -> None:
        self.reference = reference
        self.candidate = candidate
        self.pairing = pairing
        self.options = options
        self.device = candidate.device
        self.atol, self.rtol = options.atol, options.rtol
        self.plan: Plan = _plan(reference, candidate, pairing, options.needs_torch_inputs)
        # values drawn at random: not compared, the candidate continues from the reference
        self._random = random_values(
            candidate.graph, candidate.tables.random_nodes, pairing.by_onnx
        )
        # values of uninitialised memory (torch.empty...): shape and type only
        self._undefined = undefined_values(reference.undefined, pairing.by_onnx)
        # pairs whose values turned out to differ in shape: not the same value after all;
        # and values of no defined content: their torch value is never fed to the model
        self._unproven: set[str] = set(self._undefined)
        # values whose order the program leaves free (topk sorted=False): compared as
        # sets; those found the same go on from their torch values (judge/unordered.py)
        self._order_free = _order_free(reference, candidate, pairing)
        self._reordered: set[str] = set()
        # where the candidate continues from the torch value (resets.py)
        self.resets = Resets(
            options, candidate, pairing, self._undefined, self._random, self._unproven
        )
        self.resets.order_free(self._order_free, self._reordered)
        self.status = status or RunStatus()
        self.status.total_onnx_nodes = len(candidate.nodes)
        self.status.total_ep_nodes = len(reference.graph)
        self.records: list[Record] = []
        self.deployment: Any = None  # a deployed.Deployment when the candidate is optimized
        self._stop = threading.Event()
        self._started = False
        # prepared values whose decomposition fixed a size on the example inputs
        # (``specialized.py``): set by a run that knows the user's program
        self.specialized: dict[str, Any] = {}
        # decomposed user nodes whose value is checked against the user's op as the
        # reference side runs (``decomposed_values.py``), None: none
        self.decomposed: Any = None
        # what watches the reference values as they are computed (``observe(outputs,
        # env)``): the checks above, the user program's outputs (``user_outputs.py``)
        self.ref_observers: tuple[Any, ...] = ()
        self._step_counter = 0
        # differing weights wait for their consumers' verdict (weight_blame.py)
        self._blame = WeightBlame(
            reference, candidate, pairing, self.atol, self.rtol, options.judge, options.own_error
        )
        # own-error runs: each candidate node rerun on torch inputs; a model converted to
        # a lower float precision than the program's: the looser dtype each of its values
        # is computed from (its tolerance applies)
        computed_in = candidate.low_precision_lineage(pairing)
        self._own = OwnErrors(candidate, pairing, self._unproven, self._blame, computed_in)
        # each pair's record and verdict (pair_judge.py, the rules of judge/)
        self._pairs = PairJudge(
            reference,
            candidate,
            pairing,
            options,
            self._undefined,
            self._random,
            self._unproven,
            self._own,
        )
        self._pairs.order_free(self._order_free, self._reordered)
        # a quantized weight whose torch twin the exporter folded waits for its consumer
        # (quantization_step.py leaves it to weight_blame.py)
        self._pairs.defer_folded(self._blame.folded_weight)
        self._tie_axes = candidate.tables.tie_axes  # TopK nodes: their inputs are kept
        # stretches of candidate nodes run as one session, torch nodes as one function
        self.run_ahead = RunAhead(reference, candidate, pairing, options)
        # the reference's forget, None where it keeps no copy of any value (a torch
        # program's side: the loop's values are its only ones), not called per freed value
        forget = getattr(type(reference), "forget", None)
        self._ref_forget = None if forget in _KEEPS_NOTHING else reference.forget

    @property
    def model(self) -> onnx.ModelProto:
        """The candidate ONNX model."""
        return self.candidate.model

    # ------------------------------------------------------------ public API
    def __iter__(self) -> Iterator[Record]:
        if self._started:
            raise RuntimeError("a run can be iterated once; its records are in .records")
        self._started = True
        return self._records()

    @property
    def started(self) -> bool:
        """Whether the run was iterated (or is being): a run can be iterated once."""
        return self._started

    def stop(self) -> None:
        """Ends the run after the current step; everything yielded so far is kept."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _after_run(self) -> None:
        """What a finished (not stopped) run does next (AlignedRun writes replays)."""

    def _closing_records(self) -> tuple[Record, ...]:
        """Records a finished run adds once every pair was judged (AlignedRun: its
        outputs against the user's program, ``user_outputs.py``)."""
        return ()

    # ------------------------------------------------------------ the loop
    def _records(self) -> Iterator[Record]:
        t0 = time.perf_counter()
        status = self.status
        ref = self.reference
        v = self._v = RunValues(
            ref=ref.initial_env(),
            cand=self.candidate.initial_env(),
        )
        self._pairs.start(v.cand, v.missing, self.specialized)
        self._step_counter = 0
        self._start_run_ahead(v.cand)
        compare_at = self.plan.compare_at
        stop, run_ahead = self._stop, self.run_ahead
        fx_runs = run_ahead.fx_runs
        try:
            for rec in unpaired_initializers(self.reference, self.candidate, self.pairing):
                yield self._emit(rec)
            for s, (side, idx) in enumerate(self.plan.steps):
                if stop.is_set():
                    status.stopped = True
                    break
                # a step returns its records: a generator per step costs more than the step
                if side == REF:
                    if s in fx_runs:
                        run_ahead.run_fx(s, v.ref)
                    yield from self._reference_step(idx, s <= run_ahead.fx_until)
                else:
                    yield from self._candidate_step(idx)
                if s in compare_at:
                    yield from self._comparisons(s)
                self._free(s)
                status.elapsed = time.perf_counter() - t0
            # weights whose consumers were never compared keep their own verdict
            for wrec in self._blame.pending.values():
                wrec.comment = _join(wrec.comment, "no node consuming it could be compared")
                yield self._checked(wrec)
            if not stop.is_set():
                for rec in self._closing_records():
                    yield self._checked(rec)
                run_ahead.finish()  # every node was seen: the next run may use its memo
        finally:
            status.elapsed = time.perf_counter() - t0
            status.current = None
            status.finished = True
        if not self._stop.is_set():
            self._after_run()

    def _reference_step(self, idx: int, ahead: bool = False) -> tuple[Record, ...]:
        """``ahead``: a compiled run (fx_runs.py) already computed it; it is not timed."""
        ref, v, status = self.reference, self._v, self.status
        outputs = ref.graph.outputs[idx]
        if ahead:
            status.done_ep_nodes += 1
            for watch in self.ref_observers:
                watch.observe(outputs, v.ref)
            return self._reference_only_records(idx, outputs, None)
        t = time.perf_counter()
        try:
            for o, value in zip(outputs, ref.run(idx, v.ref)):
                if o:
                    v.ref[o] = value
                    if ref.is_weight(o):
                        v.ref_weights_live += 1
        except Exception as e:
            if isinstance(e, KeyError) or "(upstream failure)" in str(e):
                msg = f"not computed: an input is missing (upstream failure): {e}"
                v.missing.update(outputs)
            else:
                msg = f"{type(e).__name__}: {e}"
                status.errors += 1
            for o in outputs:
                v.ref_errors[o] = msg
        elapsed = time.perf_counter() - t
        status.done_ep_nodes += 1
        for o in outputs:
            v.ref_times[o] = elapsed
        for watch in self.ref_observers:
            watch.observe(outputs, v.ref)
        return self._reference_only_records(idx, outputs, elapsed)

    def _reference_only_records(
        self, idx: int, outputs: tuple[str, ...], elapsed: float | None
    ) -> tuple[Record, ...]:
        ref, v = self.reference, self._v
        by_fx = self.pairing.by_fx
        records: tuple[Record, ...] = ()
        for o in outputs:
            if o and o not in by_fx:
                value = v.ref.get(o)
                if ref.reports_unpaired(idx, value, o in v.ref_errors):
                    rec = reference_only_record(ref, o, value, elapsed, v.ref_errors, v.missing)
                    records += (self._emit(rec),)
        return records

    def _candidate_step(self, idx: int) -> tuple[Record, ...]:
        cand, v, status = self.candidate, self._v, self.status
        outputs = cand.graph.outputs[idx]  # the node's outputs, read once per model
        status.current = cand.node_name(idx)
        run_ahead = self.run_ahead
        if run_ahead.layout is not None:
            stretch = run_ahead.stretch_at(idx, v.cand)
            if stretch is not None and self.options.own_error:
                self._rerun_stretch(stretch)
            if run_ahead.ahead[idx]:
                return self._candidate_step_ahead(idx, outputs)
        t = time.perf_counter()
        try:
            inputs = cand.inputs(idx, v.cand)
        except KeyError as e:
            msg = f"not computed: input {e.args[0]!r} is missing (upstream failure)"
            for o in outputs:
                v.cand_errors[o] = msg
                v.missing.add(o)
            inputs = None
        if inputs is not None:
            try:
                values = cand.call(idx, inputs)
                for o, value in zip(outputs, values):
                    if o:
                        v.cand[o] = value
                if idx in self._tie_axes:
                    self._pairs.tie_x[outputs[1]] = (self._tie_axes[idx], inputs[0])
                if run_ahead.memo is not None:
                    run_ahead.observe(idx, inputs, outputs, values)
            except Exception as e:
                node = cand.nodes[idx]
                msg = f"{node.op_type} failed: {type(e).__name__}: {e}"
                msg += second_opinion(cand, idx, inputs)  # the runner's failure, or the model's
                status.errors += 1
                for o in outputs:
                    v.cand_errors[o] = msg
                self.resets.after_failure(node, v.ref, v.cand)
        elapsed = time.perf_counter() - t
        for o in outputs:
            v.cand_times[o] = elapsed
        if self.options.own_error or self.resets.all:
            self._run_own_error(idx, v.cand, v.ref, v.own, inputs)
        status.done_onnx_nodes += 1
        return self._candidate_only_records(outputs, elapsed)

    def _candidate_step_ahead(self, idx: int, outputs: tuple[str, ...]) -> tuple[Record, ...]:
        """A candidate node whose values its stretch made: nothing runs, nothing is timed."""
        cand, v = self.candidate, self._v
        if self.options.own_error and not self.run_ahead.own_done[idx]:
            self._run_own_error(idx, v.cand, v.ref, v.own, cand.inputs(idx, v.cand))
        self.status.done_onnx_nodes += 1
        return self._candidate_only_records(outputs, None)

    def _candidate_only_records(
        self, outputs: tuple[str, ...], elapsed: float | None
    ) -> tuple[Record, ...]:
        v, by_onnx = self._v, self.pairing.by_onnx
        records: tuple[Record, ...] = ()
        for o in outputs:
            if o and o not in by_onnx:
                rec = candidate_only_record(
                    self.candidate, o, v.cand, elapsed, v.cand_errors, v.missing
                )
                records += (self._emit(rec),)
        return records

    def _start_run_ahead(self, env: dict[str, Any]) -> None:
        """Runs the stretches recorded by an earlier run of this model on inputs of these
        shapes, or records this run for the next (``run_ahead.py``)."""
        options = self.options
        allowed = not (options.time_nodes or self.resets.all or self.deployment is not None)
        plan = self.run_ahead.start(env, self.resets.fed_names, allowed)
        if plan is not None:
            self.plan = plan
            self.status.extra["stretches"] = len(self.run_ahead.layout)

    # the budget benchmark (benchmarks/bench_budget.py) times own-error reruns by these two
    def _rerun_stretch(self, stretch: Any) -> None:
        v = self._v
        if self._own.rerun_stretch(stretch, v.cand, v.ref, v.own):
            done = self.run_ahead.own_done
            for k in range(stretch.first, stretch.last + 1):
                done[k] = 1

    def _run_own_error(
        self, idx: int, cand_env: dict, ref_env: dict, own: dict, main_inputs: list | None
    ) -> None:
        self._own.rerun(idx, cand_env, ref_env, own, main_inputs)

    def _comparisons(self, s: int) -> Iterator[Record]:
        """The pairs whose two values exist after step ``s``."""
        cand, v, resets, blame = self.candidate, self._v, self.resets, self._blame
        record, by_onnx, checked = self._pairs.record, self.pairing.by_onnx, self._checked
        awaiting = blame.awaiting  # consumer -> the differing weights its verdict settles
        ref_env = v.ref
        for name in self.plan.compare_at.get(s, ()):
            rec = record(
                name, ref_env, v.cand, v.own, v.ref_times, v.cand_times, v.ref_errors, v.cand_errors
            )
            pair = by_onnx[name]
            rec.reset = resets.after(name, pair, rec, ref_env)
            if blame.holds(name, rec, ref_env):
                continue  # a differing weight waits for its first consumer's verdict
            if name in awaiting:
                before, after = blame.settled_by(name, rec, ref_env)
                for wrec in before:
                    yield checked(wrec)
                yield checked(rec)
                for wrec in after:
                    yield checked(wrec)
            else:
                yield checked(rec)
            if rec.reset:
                resets.feed(name, pair, v.cand, ref_env)
            elif name in cand.initializers:
                # Weights are compared up front; the copy made to compare one goes now
                # (its consumer converts it again), so a model's weights are never all
                # copied at once (kept, they made a run's peak memory 7x larger).
                cand.forget(name)

    def _free(self, s: int) -> None:
        """Frees what no later step needs, and keeps the peak count of live values."""
        # once per step (600 steps in a 4-layer Llama): locals, no call per value kept
        v, plan = self._v, self.plan
        ref_env, cand_env, own = v.ref, v.cand, v.own
        names = plan.free_ref_at.get(s)
        if names:
            is_weight, forget = self.reference.is_weight, self._ref_forget
            for name in names:
                if ref_env.pop(name, None) is not None and is_weight(name):
                    v.ref_weights_live -= 1
                if forget is not None:
                    forget(name)
        names = plan.free_cand_at.get(s)
        if names:
            forget = self.candidate.forget
            ties, ties_own = self._pairs.tie_x, self._own.tie_x
            for name in names:
                cand_env.pop(name, None)
                forget(name)
                if ties or ties_own:
                    ties.pop(name, None)
                    ties_own.pop(name, None)
                if own:
                    own.pop(name, None)
                    own.pop(("ref", name), None)
                    own.pop(("from", name), None)
        # activations only: weights are references to the program's own tensors
        live = len(cand_env) + len(ref_env) - v.ref_weights_live + len(own)
        if live > v.peak_live:
            v.peak_live = live
            self.status.extra["peak_live_values"] = live

    def _checked(self, rec: Record) -> Record:
        """Emits a comparison record (raising at the first failure with ``exc=True``; a
        drifted value is not one: its node makes no error)."""
        if self.options.exc and rec.failed and not rec.drifted:
            self._emit(rec)
            raise SbsMismatchError(rec)
        return self._emit(rec)

    # ------------------------------------------------------------ records
    def _emit(self, rec: Record) -> Record:
        if self.deployment is not None:
            self.deployment.annotate(rec)
        st = self.status
        rec.step = self._step_counter
        self._step_counter += 1
        self.records.append(rec)
        st.records += 1
        if rec.failed:
            st.failures += 1
        if (
            rec.err_abs is not None
            and rec.err_abs > st.max_err_abs
            and rec.err_abs == rec.err_abs
            and rec.status != STATUS_WEIGHT_DIFFERS  # differs by design (folded): no error
        ):
            st.max_err_abs = rec.err_abs
            st.max_err_name = rec.onnx_name or rec.ep_name
        return rec
