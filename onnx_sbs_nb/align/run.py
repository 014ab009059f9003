"""The run: one loop over two sides, yielding one Record per aligned pair.

:class:`SideBySideRun` is the loop.  It runs a reference side and a candidate ONNX model
(``sides.py``) step by step as the plan orders them, compares each pair as soon as both
values exist, optionally runs each candidate node again on the reference values of its
inputs (its *own error*), and frees every value after its last use.
:class:`AlignedRun` is the run users make: their torch program against its ONNX export.
The post-run actions (rerun a node in torch, replay bundles, node details) live in
``actions.py``.

The engine imports no view code (no tqdm, pandas, plotly or widget): views read
``run.status`` and consume the records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import onnx
import torch

from ..convert import device_of, to_torch
from ..device import device_name
from ..diff import Diff, compare, shape_type
from ..records import (
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    KIND_WEIGHT,
    STATUS_DTYPE_MISMATCH,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_NOT_COMPARED,
    STATUS_NOT_COMPUTED,
    STATUS_OK,
    STATUS_SHAPE_MISMATCH,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
    STATUS_UNPAIRED_OUTPUT,
    STATUS_WEIGHT_DIFFERS,
    UNPAIRED,
    Record,
    RunStatus,
)
from ..records import join_comments as _join
from .deployed import deploy
from .guards import check_input_shapes
from .loading import SbsInputError, load_exported_program, load_inputs, load_onnx_model
from .names import (
    PAIRED_BY_METADATA,
    PAIRED_BY_NAME,
    PAIRED_BY_STATE_DICT,
    TRANSFORM_PERMUTE,
    TRANSFORM_TRANSPOSE,
    Pair,
    Pairing,
    pair_values,
)
from .onnx_pairing import TRANSFORM_CAST, cast_value, in_common_precision
from .options import RESET_ALL, RunOptions
from .plan import REF, Plan, schedule
from .program import PREPARED_FROM_ONNX_PROGRAM, PreparedProgram, bind_inputs, prepare_program
from .provenance import program_provenance
from .runners import make_runner
from .sides import FxSide, OnnxSide


class SbsMismatchError(AssertionError):
    """Raised with ``exc=True`` at the first pair that fails the tolerance."""

    def __init__(self, record: Record):
        self.record = record
        super().__init__(
            f"fx node {record.ep_name!r} ({record.ep_target}) and ONNX value "
            f"{record.onnx_name!r} ({record.onnx_op_type}) disagree: status={record.status}, "
            f"err_abs={record.err_abs}, atol={record.atol}, rtol={record.rtol}"
            + (f", error: {record.error}" if record.error else "")
        )


_LINEAR_TARGETS = ("aten.linear", "aten.addmm", "aten.mm", "aten.matmul", "aten.bmm")


class NotComputed:
    """An own-error value that could not be computed (the message says why)."""

    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


def as_candidate(pair: Pair, value: Any) -> Any:
    """A reference value in the candidate's layout and type (a folded transposition
    undone, a cast made)."""
    if pair.transform == TRANSFORM_TRANSPOSE and isinstance(value, torch.Tensor):
        return value.t()
    if pair.transform == TRANSFORM_PERMUTE and isinstance(value, torch.Tensor):
        return value.permute(pair.perm)
    if pair.transform == TRANSFORM_CAST:
        return cast_value(value, pair.cast_to)
    return value


def as_expected(pair: Pair, value: Any) -> Any:
    """A reference value to compare with: in the candidate's layout, its own type (a
    cast pair is compared in the coarser type of the two)."""
    return value if pair.transform == TRANSFORM_CAST else as_candidate(pair, value)


def own_error_inputs(
    cand: OnnxSide,
    pairing: Pairing,
    idx: int,
    ref_env: dict[str, Any],
    cand_env: dict[str, Any],
    own: dict[Any, Any],
    unproven: set[str] | frozenset[str] = frozenset(),
) -> tuple[list[Any], frozenset[str]] | None:
    """Inputs of candidate node ``idx`` for its own-error run, or None when one is missing.

    An input with a reference partner gets the reference value; one without gets the
    value computed from reference values upstream (``own``), so chains of nodes without
    partners are judged from the nearest reference values.  A weight is the model's own
    constant: the node is judged with it.  Pairs in ``unproven`` (the values turned out to
    differ in shape) are not partners.  Also returns the lowerings (fx nodes) other than
    the node's own that had to be recomputed that way: the own error inherits theirs.
    """
    values = []
    taint: set[str] = set()
    group = cand.lowering[idx]
    for name in cand.node_inputs(cand.nodes[idx]):
        if not name:
            values.append(None)
        elif name in cand.initializers:
            values.append(cand.initializer(name))
        elif name in pairing.by_onnx and name not in unproven:
            pair = pairing.by_onnx[name]
            key = ("ref", name)
            if key not in own:
                if pair.fx_name not in ref_env:
                    return None
                own[key] = cand.as_runner_value(as_candidate(pair, ref_env[pair.fx_name]))
            values.append(own[key])
        elif name in own and not isinstance(own[name], NotComputed):
            values.append(own[name])
            taint.update(own.get(("from", name), ()))
            producer = cand.producer.get(name)
            source = cand.lowering[producer] if producer is not None else None
            if source is not None and source != group:
                taint.add(source)
        elif name in cand_env and name in cand.feeds:
            values.append(cand_env[name])
        else:
            return None
    return values, frozenset(taint)


def fill_first_comparison(rec: Record, d: Diff) -> None:
    rec.atol, rec.rtol = d.atol, d.rtol
    rec.err_abs, rec.err_rel, rec.err_nan = d.err_abs, d.err_rel, d.err_nan
    rec.err_h01, rec.err_h001 = d.err_h01, d.err_h001
    rec.passed = d.passed
    if d.shape_mismatch:
        rec.status = STATUS_SHAPE_MISMATCH
        rec.comment = _join(rec.comment, d.note)
    elif d.dtype_mismatch:
        rec.status = STATUS_DTYPE_MISMATCH
        rec.comment = _join(rec.comment, d.note)
    else:
        rec.status = STATUS_OK if d.passed else STATUS_FAIL


def fill_own_error(rec: Record, d: Diff, own_device: str) -> None:
    rec.err_abs2, rec.err_rel2, rec.err_nan2 = d.err_abs, d.err_rel, d.err_nan
    rec.err_h012, rec.err_h0012 = d.err_h01, d.err_h001
    rec.err_dev2 = 0.0 if own_device == rec.ep_device else 1.0
    rec.passed2 = d.passed


class SideBySideRun:
    """One side-by-side run over a reference side and a candidate ONNX model.

    Iterate it (once) to get the records; ``records`` keeps them, ``status`` tells the
    progress, ``stop()`` ends the run after the current step with everything kept.
    """

    def __init__(
        self,
        reference: Any,
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
        self.reset_all = options.reset == RESET_ALL
        self.reset_names = set(options.reset_names)
        self.plan: Plan = schedule(
            reference.graph, candidate.graph, pairing, options.needs_torch_inputs
        )
        self.status = status or RunStatus()
        self.status.total_onnx_nodes = len(candidate.nodes)
        self.status.total_ep_nodes = len(reference.graph.io)
        self.records: list[Record] = []
        self.deployment: Any = None  # a deployed.Deployment when the candidate is optimized
        self._stop = threading.Event()
        self._started = False
        # pairs whose values turned out to differ in shape: not the same value after all
        self._unproven: set[str] = set()
        self._missing: set[str] = set()
        self._consumers: dict[str, list[int]] | None = None
        self._step_counter = 0
        self._pending: dict[str, Record] = {}
        self._probe_inputs: dict[int, list[Any]] = {}

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

    def stop(self) -> None:
        """Ends the run after the current step; everything yielded so far is kept."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def _after_run(self) -> None:
        """What a finished (not stopped) run does next (AlignedRun writes replays)."""

    # ------------------------------------------------------------ the loop
    def _records(self) -> Iterator[Record]:
        t0 = time.perf_counter()
        status, plan = self.status, self.plan
        ref, cand = self.reference, self.candidate
        by_onnx, by_fx = self.pairing.by_onnx, self.pairing.by_fx
        ref_env: dict[str, Any] = ref.initial_env() if isinstance(ref, OnnxSide) else {}
        cand_env: dict[str, Any] = cand.initial_env()
        own: dict[Any, Any] = {}
        times: dict[str, float] = {}  # reference value -> seconds
        cand_times: dict[str, float] = {}
        ref_errors: dict[str, str] = {}
        cand_errors: dict[str, str] = {}
        self._missing: set[str] = set()  # values not computed because an input was missing
        use_own = self.options.own_error or self.reset_all
        # differing weights wait for their first consumer's verdict (see _settle_weight)
        pending = self._pending = {}
        awaiting: dict[str, list[str]] = {}
        self._probe_inputs = {}
        self._step_counter = 0
        peak_live = 0
        ref_weights_live = 0
        try:
            # initializers without a partner (and no twin on the reference): listed up front
            for name in cand.initializers:
                if name not in by_onnx and name not in ref.graph.available:
                    rec = Record(
                        **cand.describe_candidate(name),
                        onnx_shape_type=_proto_shape_type(cand.initializers[name]),
                        kind=KIND_WEIGHT,
                        paired_by=UNPAIRED,
                        status=STATUS_UNPAIRED_ONNX,
                    )
                    yield self._emit(rec)
            for s, (side, idx) in enumerate(plan.steps):
                if self._stop.is_set():
                    status.stopped = True
                    break
                if side == REF:
                    outputs = ref.graph.io[idx].outputs
                    t = time.perf_counter()
                    try:
                        for o, v in zip(outputs, ref.run(idx, ref_env)):
                            if o:
                                ref_env[o] = v
                                if ref.is_weight(o):
                                    ref_weights_live += 1
                    except Exception as e:
                        if isinstance(e, KeyError) or "(upstream failure)" in str(e):
                            msg = f"not computed: an input is missing (upstream failure): {e}"
                            self._missing.update(outputs)
                        else:
                            msg = f"{type(e).__name__}: {e}"
                            status.errors += 1
                        for o in outputs:
                            ref_errors[o] = msg
                    elapsed = time.perf_counter() - t
                    status.done_ep_nodes += 1
                    for o in outputs:
                        times[o] = elapsed
                        if o and o not in by_fx:
                            value = ref_env.get(o)
                            if ref.reports_unpaired(idx, value, o in ref_errors):
                                yield self._emit(
                                    self._reference_only_record(o, value, elapsed, ref_errors)
                                )
                else:
                    node = cand.nodes[idx]
                    status.current = cand.node_name(idx)
                    t = time.perf_counter()
                    try:
                        inputs = cand.inputs(idx, cand_env)
                    except KeyError as e:
                        msg = f"not computed: input {e.args[0]!r} is missing (upstream failure)"
                        for o in node.output:
                            cand_errors[o] = msg
                            self._missing.add(o)
                        inputs = None
                    if inputs is not None:
                        try:
                            for o, v in zip(node.output, cand.call(idx, inputs)):
                                if o:
                                    cand_env[o] = v
                        except Exception as e:
                            msg = f"{node.op_type} failed: {type(e).__name__}: {e}"
                            status.errors += 1
                            for o in node.output:
                                cand_errors[o] = msg
                            self._continue_from_reference(node, ref_env, cand_env)
                    elapsed = time.perf_counter() - t
                    for o in node.output:
                        cand_times[o] = elapsed
                    if use_own:
                        self._run_own_error(idx, cand_env, ref_env, own, inputs)
                    status.done_onnx_nodes += 1
                    for o in node.output:
                        if o and o not in by_onnx:
                            yield self._emit(
                                self._candidate_only_record(o, cand_env, elapsed, cand_errors)
                            )
                for name in plan.compare_at.get(s, ()):
                    rec = self._compare(
                        name, ref_env, cand_env, own, times, cand_times, ref_errors, cand_errors
                    )
                    pair = by_onnx[name]
                    # a weight is the model's own constant: only replaced when named
                    rec.reset = pair.fx_name in ref_env and (
                        (self.reset_all and name not in cand.initializers)
                        or name in self.reset_names
                        or pair.fx_name in self.reset_names
                    )
                    if rec.kind == KIND_WEIGHT and rec.failed and name in cand.initializers:
                        outs = self._consumer_outputs(name)
                        if outs:
                            pending[name] = rec
                            for o in outs:
                                awaiting.setdefault(o, []).append(name)
                            continue
                    after = []
                    for w in awaiting.pop(name, ()):
                        wrec = pending.pop(w, None)
                        if wrec is not None:
                            if self._settle_weight(wrec, rec, ref_env):
                                yield self._checked(wrec)
                            else:
                                after.append(wrec)
                    yield self._checked(rec)
                    for wrec in after:
                        yield self._checked(wrec)
                    if rec.reset:
                        cand_env[name] = cand.as_runner_value(
                            as_candidate(pair, ref_env[pair.fx_name])
                        )
                for name in plan.free_ref_at.get(s, ()):
                    if ref_env.pop(name, None) is not None and ref.is_weight(name):
                        ref_weights_live -= 1
                    if isinstance(ref, OnnxSide):
                        ref.forget(name)
                for name in plan.free_cand_at.get(s, ()):
                    cand_env.pop(name, None)
                    cand.forget(name)
                    if use_own:
                        own.pop(name, None)
                        own.pop(("ref", name), None)
                        own.pop(("from", name), None)
                # activations only: weights are references to the program's own tensors
                live = len(cand_env) + len(ref_env) - ref_weights_live + len(own)
                if live > peak_live:
                    peak_live = live
                    status.extra["peak_live_values"] = live
                status.elapsed = time.perf_counter() - t0
            # weights whose consumers were never compared keep their own verdict
            for wrec in pending.values():
                wrec.comment = _join(wrec.comment, "no node consuming it could be compared")
                yield self._checked(wrec)
        finally:
            status.elapsed = time.perf_counter() - t0
            status.current = None
            status.finished = True
        if not self._stop.is_set():
            self._after_run()

    def _checked(self, rec: Record) -> Record:
        """Emits a comparison record (raising at the first failure with ``exc=True``)."""
        if self.options.exc and rec.failed:
            self._emit(rec)
            raise SbsMismatchError(rec)
        return self._emit(rec)

    def _continue_from_reference(
        self, node: onnx.NodeProto, ref_env: dict[str, Any], cand_env: dict[str, Any]
    ) -> None:
        """After a node failed, its outputs take their torch values, so the nodes after it
        still run and are judged (a second, independent bug is not hidden)."""
        cand = self.candidate
        for o in node.output:
            pair = self.pairing.by_onnx.get(o)
            if o and pair is not None and pair.fx_name in ref_env and o not in self._unproven:
                cand_env[o] = cand.as_runner_value(as_candidate(pair, ref_env[pair.fx_name]))
                cand.notes[o] = "the nodes after it continue from the torch value"

    def _consumer_outputs(self, name: str, depth: int = 8) -> list[str]:
        """The first paired values computed from initializer ``name`` (through values
        without a partner, a Cast or a Transpose say)."""
        cand, by_onnx = self.candidate, self.pairing.by_onnx
        consumers = self._consumers
        if consumers is None:
            consumers = {}
            for k, n in enumerate(cand.nodes):
                for i in cand.node_inputs(n):
                    consumers.setdefault(i, []).append(k)
            self._consumers = consumers
        found: list[str] = []
        frontier, seen = [name], {name}
        for _ in range(depth):
            nxt = []
            for value in frontier:
                for k in consumers.get(value, ()):
                    for o in cand.nodes[k].output:
                        if not o or o in seen:
                            continue
                        seen.add(o)
                        (found if o in by_onnx else nxt).append(o)
            if found or not nxt:
                break
            frontier = nxt
        return found

    def _settle_weight(self, wrec: Record, consumer: Record, ref_env: dict[str, Any]) -> bool:
        """A weight that differs from its torch parameter is the model's error only when
        the node consuming it disagrees with torch because of it.  Returns whether the
        weight's record comes before its consumer's (it is then the answer)."""
        node = consumer.onnx_node_name or consumer.onnx_name
        agrees = consumer.passed2 is True or (consumer.passed2 is None and consumer.passed is True)
        if agrees:
            wrec.status = STATUS_WEIGHT_DIFFERS
            wrec.comment = _join(
                wrec.comment,
                f"differs from the torch parameter, but its consumer {node} agrees with torch: "
                "the exporter changed it (a BatchNorm folded into a Conv, say)",
            )
            return True
        if consumer.status in (STATUS_SHAPE_MISMATCH, STATUS_DTYPE_MISMATCH):
            wrec.comment = _join(
                wrec.comment, f"its consumer {node} computes another shape or type: not this"
            )
            return False
        if consumer.passed2 is None and not consumer.failed:
            wrec.comment = _join(wrec.comment, f"its consumer {node} could not be compared")
            return True
        with_torch = self._consumer_with_torch_weight(wrec, consumer, ref_env)
        if with_torch is False:
            wrec.comment = _join(
                wrec.comment,
                f"its consumer {node} disagrees with torch even with the torch parameter: "
                "the error is the consumer's own",
            )
            return False
        wrec.comment = _join(
            wrec.comment,
            f"its consumer {node} disagrees with torch"
            + (" and agrees once given the torch parameter" if with_torch else " too"),
        )
        return True

    def _consumer_with_torch_weight(
        self, wrec: Record, consumer: Record, ref_env: dict[str, Any]
    ) -> bool | None:
        """Whether the consumer agrees with torch when fed the torch parameter instead of
        the differing weight (None when that cannot be tried)."""
        cand = self.candidate
        k = consumer.onnx_id_node
        inputs = self._probe_inputs.get(k) if k is not None else None
        pair = self.pairing.by_onnx.get(wrec.onnx_name)
        out = self.pairing.by_onnx.get(consumer.onnx_name)
        if inputs is None or pair is None or out is None or out.fx_name not in ref_env:
            return None
        names = cand.node_inputs(cand.nodes[k])
        if wrec.onnx_name not in names:
            return None
        torch_value = cand.as_runner_value(
            as_candidate(pair, self.reference.leaf_value(pair.fx_name))
        )
        fed = [torch_value if n == wrec.onnx_name else v for n, v in zip(names, inputs)]
        try:
            outputs = cand.call(k, fed)
        except Exception:
            return None
        got = outputs[list(cand.nodes[k].output).index(consumer.onnx_name)]
        e, g = comparable(as_candidate(out, ref_env[out.fx_name]), got)
        if e is None:
            return None
        return bool(compare(e, g, self.atol, self.rtol).passed)

    def _run_own_error(
        self,
        idx: int,
        cand_env: dict[str, Any],
        ref_env: dict[str, Any],
        own: dict[Any, Any],
        main_inputs: list[Any] | None,
    ) -> None:
        cand = self.candidate
        node = cand.nodes[idx]
        found = own_error_inputs(cand, self.pairing, idx, ref_env, cand_env, own, self._unproven)
        if found is None:
            return
        inputs, taint = found
        for o in node.output:
            if o and taint:
                own[("from", o)] = taint
        if any(n in self._pending for n in cand.node_inputs(node)):
            self._probe_inputs[idx] = inputs  # to try it with the torch parameter
        if main_inputs is not None and all(a is b for a, b in zip(inputs, main_inputs)):
            # same inputs as the first run: the own error is the first error
            for o in node.output:
                if o and o in cand_env:
                    own[o] = cand_env[o]
            return
        try:
            outputs = cand.call(idx, inputs)
        except Exception as e:
            for o in node.output:
                if o:
                    own[o] = NotComputed(f"{type(e).__name__}: {e}")
            return
        for o, v in zip(node.output, outputs):
            if o:
                own[o] = v

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
        if rec.err_abs is not None and rec.err_abs > st.max_err_abs and rec.err_abs == rec.err_abs:
            st.max_err_abs = rec.err_abs
            st.max_err_name = rec.onnx_name or rec.ep_name
        return rec

    def _reference_only_record(
        self, name: str, value: Any, elapsed: float, ref_errors: dict[str, str]
    ) -> Record:
        ref = self.reference
        kind = ref.kind_of(name)
        if name in ref_errors:
            status = STATUS_NOT_COMPUTED if name in self._missing else STATUS_ERROR
        elif kind == KIND_OUTPUT:
            status = STATUS_UNPAIRED_OUTPUT
        else:
            status = STATUS_UNPAIRED_EP
        rec = Record(
            **ref.describe(name),
            ep_shape_type=shape_type(value) if value is not None else None,
            ep_time_run=elapsed,
            ep_device=device_of(value) if value is not None else None,
            kind=kind,
            paired_by=UNPAIRED,
            status=status,
            error=ref_errors.get(name),
        )
        if status == STATUS_UNPAIRED_OUTPUT:
            rec.comment = "no output of the ONNX model computes this output of the program"
        elif kind == KIND_WEIGHT:
            rec.comment = "no initializer holds it (unused, or folded into another by the exporter or an optimizer)"
        return rec

    def _candidate_only_record(
        self, name: str, cand_env: dict[str, Any], elapsed: float, cand_errors: dict[str, str]
    ) -> Record:
        cand = self.candidate
        if name in cand_errors:
            status = STATUS_NOT_COMPUTED if name in self._missing else STATUS_ERROR
        elif name in cand.graph_outputs:
            status = STATUS_UNPAIRED_OUTPUT
        else:
            status = STATUS_UNPAIRED_ONNX
        rec = Record(
            **cand.describe_candidate(name),
            onnx_shape_type=shape_type(cand_env[name]) if name in cand_env else None,
            onnx_time_run=elapsed,
            onnx_device=device_of(cand_env[name]) if name in cand_env else None,
            kind=KIND_OUTPUT if name in cand.graph_outputs else KIND_NODE,
            paired_by=UNPAIRED,
            status=status,
            error=cand_errors.get(name),
        )
        if status == STATUS_UNPAIRED_OUTPUT:
            rec.comment = "this output of the ONNX model matches no output of the program"
        return rec

    def _compare(
        self, name, ref_env, cand_env, own, times, cand_times, ref_errors, cand_errors
    ) -> Record:
        cand = self.candidate
        pair = self.pairing.by_onnx[name]
        rec = Record(
            **self.reference.describe(pair.fx_name),
            **cand.describe_candidate(name),
            ep_time_run=times.get(pair.fx_name),
            onnx_time_run=cand_times.get(name),
            kind=pair.kind,
            paired_by=pair.rule,
        )
        if pair.transform == TRANSFORM_PERMUTE:
            rec.comment = f"compared with the torch value permuted by {pair.perm}"
        elif pair.transform and pair.transform != TRANSFORM_CAST:
            rec.comment = f"compared with the {pair.transform}d torch weight"
        rec.comment = _join(rec.comment, cand.notes.get(name))
        if pair.fx_name in ref_errors:
            missing = pair.fx_name in self._missing
            rec.status = STATUS_NOT_COMPUTED if missing else STATUS_ERROR
            rec.error = f"reference side: {ref_errors[pair.fx_name]}"
            return rec
        if name in cand_errors:
            rec.error = cand_errors[name]
            if name in self._missing:
                # inherited from upstream: the node itself is still judged on torch inputs
                rec.status = STATUS_NOT_COMPUTED
                self._own_comparison(rec, pair, name, ref_env.get(pair.fx_name), own)
            else:
                rec.status = STATUS_ERROR
            return rec
        want = ref_env.get(pair.fx_name)
        if want is None and pair.fx_name in self.reference.graph.available:
            want = self.reference.leaf_value(pair.fx_name)  # a weight of an ONNX reference
        expected = as_expected(pair, want)
        got = cand_env[name] if name in cand_env else cand.initializer(name)
        rec.ep_shape_type = shape_type(expected)
        rec.onnx_shape_type = shape_type(got)
        rec.ep_device = device_of(expected)
        rec.onnx_device = device_of(got)
        rec.err_dev = 0.0 if rec.ep_device == rec.onnx_device else 1.0
        expected, got = comparable(expected, got)
        if expected is None:
            rec.status = STATUS_NOT_COMPARED
            rec.comment = _join(rec.comment, "not a tensor on both sides")
            return rec
        if pair.transform == TRANSFORM_CAST:
            expected, got, note = in_common_precision(expected, got)
            rec.comment = _join(rec.comment, note)
        d = compare(expected, got, self.atol, self.rtol)
        if d.shape_mismatch and pair.rule not in (PAIRED_BY_NAME, PAIRED_BY_STATE_DICT):
            # A pair made from metadata or position is a guess that the shapes disprove:
            # not the same value, so neither a mismatch of the export nor a torch input.
            self._unproven.add(name)
            rec.status = STATUS_NOT_COMPARED
            rec.paired_by = UNPAIRED
            rec.comment = _join(
                rec.comment,
                f"paired by {pair.rule}, but the shapes differ ({d.note}): not the same value",
            )
            return rec
        fill_first_comparison(rec, d)
        self._own_comparison(rec, pair, name, want, own)
        node_idx = cand.producer.get(name)
        if (
            node_idx is not None
            and name in own
            and rec.onnx_op_type in ("Gemm", "MatMul")
            and (rec.ep_target or "").startswith(_LINEAR_TARGETS)
        ):
            try:
                inputs = cand.inputs(node_idx, cand_env)
            except KeyError:
                inputs = None
            note = _linear_check(cand.nodes[node_idx], inputs, got)
            if note:
                rec.comment = _join(rec.comment, note)
        return rec

    def _own_comparison(self, rec: Record, pair: Pair, name: str, want: Any, own: dict) -> None:
        """The own error: the node run on torch inputs, against the torch value."""
        own_value = own.get(name)
        if own_value is None or name not in self.candidate.producer:
            return
        taint = own.get(("from", name))
        if taint:
            rec.own_inputs_from = ", ".join(sorted(taint))
        if isinstance(own_value, NotComputed):
            rec.comment = _join(rec.comment, f"rerun on torch inputs failed: {own_value.message}")
            return
        e2, g2 = comparable(as_expected(pair, want), own_value)
        if e2 is not None and pair.transform == TRANSFORM_CAST:
            e2, g2, _ = in_common_precision(e2, g2)
        if e2 is not None:
            fill_own_error(rec, compare(e2, g2, self.atol, self.rtol), device_of(own_value))


class AlignedRun(SideBySideRun):
    """A torch program against the ONNX model exported from it; iterate it for records.

    Construction validates everything that can be checked without running (paths,
    options, inputs against the program and the model, pairing) and raises SbsInputError
    early.  ``actions`` holds the post-run actions (``actions.py``).
    """

    def __init__(
        self,
        ep: Any,
        onx: Any,
        args: Any = None,
        kwargs: dict[str, Any] | None = None,
        options: RunOptions | None = None,
        *,
        status: RunStatus | None = None,
        **option_kwargs: Any,
    ):
        options = RunOptions.from_kwargs(options, **option_kwargs)
        prepared_from_onnx = getattr(onx, "exported_program", None)
        self.ep = load_exported_program(ep)
        model = exported = load_onnx_model(onx)
        deployment = deploy(model, options)  # optimize=: the graph onnxruntime runs
        if deployment is not None:
            model = deployment.model
        self.args, self.kwargs = load_inputs(args, kwargs)
        device = options.device
        if device is None:
            # inputs already on a GPU mean "run there"
            devices = {
                str(t.device)
                for t in torch.utils._pytree.tree_leaves((self.args, self.kwargs))
                if isinstance(t, torch.Tensor)
            }
            device = next((d for d in sorted(devices) if d.startswith("cuda")), None)
        device = device_name(device)
        runner = make_runner(options.runner, device)
        if isinstance(prepared_from_onnx, torch.export.ExportedProgram):
            self.prepared = PreparedProgram(prepared_from_onnx, PREPARED_FROM_ONNX_PROGRAM)
        else:
            # the exported model's node metadata vouches for the fast reproduction
            self.prepared = prepare_program(self.ep, exported)
        program = self.prepared.program
        self.program = program
        bound = bind_inputs(program, self.args, self.kwargs)
        check_input_shapes(program, bound.values, bound.user_inputs)
        provenance = program_provenance(program.graph, self.ep.graph, bound.weights)
        reference = FxSide(program, bound, provenance, device)
        candidate = OnnxSide(model, runner, device)
        pairing = pair_values(program.graph, model, bound.weights, bound.user_inputs)
        if deployment is not None:
            original = pair_values(
                program.graph, deployment.original, bound.weights, bound.user_inputs
            )
            deployment.link(pairing, original)
        _check_pairing(pairing, model, bound)
        unknown = (
            set(options.reset_names)
            - set(pairing.by_onnx)
            - {p.fx_name for p in pairing.by_onnx.values()}
        )
        if unknown:
            raise SbsInputError(
                f"reset_names {sorted(unknown)[:5]} name no paired value: use ONNX value names "
                "or fx node names that appear in the records"
            )
        # the ONNX graph inputs are the torch inputs they pair with
        for name in candidate.graph_inputs:
            pair = pairing.by_onnx.get(name)
            if pair is not None:
                candidate.feeds[name] = reference.leaf_value(pair.fx_name)
        super().__init__(reference, candidate, pairing, options, status)
        self.deployment = deployment
        if deployment is not None:
            self.status.extra["deployed"] = deployment.summary()
        self.bound = bound
        if self.prepared.note:
            self.status.extra["program_note"] = self.prepared.note
        self.status.extra["program_source"] = self.prepared.source
        if self.prepared.detail:
            self.status.extra["program_detail"] = self.prepared.detail
        from .actions import RunActions

        self.actions = RunActions(self)

    def _after_run(self) -> None:
        if self.options.replay is not None:
            self.actions.write_selected_replays()


def _check_pairing(pairing: Pairing, model: onnx.ModelProto, bound: Any) -> None:
    # graph inputs share names with any model taking the same inputs: they prove nothing
    strong = [
        p
        for p in pairing.by_onnx.values()
        if p.rule in (PAIRED_BY_NAME, PAIRED_BY_METADATA, PAIRED_BY_STATE_DICT)
        and p.kind != KIND_INPUT
    ]
    if not strong:
        raise SbsInputError(
            "the ONNX model shares no computed value, node metadata or weight name with the "
            "program (only its inputs, if anything): it was not exported from this "
            "ExportedProgram (export it with torch.onnx.export(ep, args, dynamo=True) and "
            "pass that model)"
        )
    g = model.graph
    inits = {i.name for i in g.initializer}
    for inp in g.input:
        if inp.name in inits:
            continue
        pair = pairing.by_onnx.get(inp.name)
        if pair is None:
            raise SbsInputError(
                f"ONNX input {inp.name!r} matches no input of the program (program inputs: "
                f"{bound.user_inputs}): the model and the program take different inputs"
            )
        value = bound.values.get(pair.fx_name)
        tt = inp.type.tensor_type
        if isinstance(value, torch.Tensor) and tt.elem_type:
            from ..dtypes import ONNX_TO_TORCH

            expected = ONNX_TO_TORCH.get(tt.elem_type)
            if expected is not None and expected != value.dtype:
                raise SbsInputError(
                    f"input {pair.fx_name!r} has dtype {value.dtype} but the ONNX input "
                    f"{inp.name!r} expects {expected}: convert the input"
                )
            if tt.HasField("shape") and len(tt.shape.dim) != value.dim():
                raise SbsInputError(
                    f"input {pair.fx_name!r} has rank {value.dim()} but the ONNX input "
                    f"{inp.name!r} has rank {len(tt.shape.dim)}"
                )


def comparable(expected: Any, got: Any) -> tuple[Any, Any]:
    """Both sides as array-likes, or (None, None) when they are not comparable tensors."""
    import numpy as np

    if isinstance(expected, bool | int | float | torch.SymInt | torch.SymFloat | torch.SymBool):
        try:
            expected = np.asarray(
                expected if isinstance(expected, bool | int | float) else expected.node.hint
            )
        except Exception:
            return None, None
        if hasattr(got, "reshape") and getattr(got, "size", None) is not None:
            n = got.numel() if isinstance(got, torch.Tensor) else got.size
            if n == 1:
                got = got.reshape(())
    if not isinstance(expected, torch.Tensor | np.ndarray | np.generic):
        return None, None
    if not isinstance(got, torch.Tensor | np.ndarray | np.generic):
        return None, None
    return expected, got


def _linear_check(node: onnx.NodeProto, inputs: list | None, got: Any) -> str | None:
    """Compares a Gemm/MatMul output with torch on the same (ONNX-side) inputs."""
    if not inputs or any(x is None for x in inputs[:2]):
        return None
    try:
        a, b = to_torch(inputs[0]), to_torch(inputs[1])
        if node.op_type == "MatMul":
            ref = torch.matmul(a, b)
        else:
            attrs = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
            if attrs.get("transA", 0):
                a = a.t()
            if attrs.get("transB", 0):
                b = b.t()
            ref = attrs.get("alpha", 1.0) * (a @ b)
            if len(inputs) > 2 and inputs[2] is not None:
                ref = ref + attrs.get("beta", 1.0) * to_torch(inputs[2])
        d = compare(ref, got)
        return f"vs torch.nn.functional.linear on the ONNX inputs: err_abs={d.err_abs:.3g}"
    except Exception:
        return None


def _proto_shape_type(t: onnx.TensorProto) -> str:
    from ..dtypes import dtype_name

    try:
        name = dtype_name(t.data_type)
    except TypeError:
        name = onnx.TensorProto.DataType.Name(t.data_type).lower()
    return f"{name}[{'x'.join(str(d) for d in t.dims)}]"


def run_aligned(
    ep: Any, onx: Any, args: Any = None, kwargs: dict[str, Any] | None = None, **options: Any
) -> Iterator[Record]:
    """Runs both graphs side by side and yields one Record per aligned pair.

    Validation happens now (bad input raises SbsInputError at this call), execution as
    the records are consumed. Options: see :class:`~onnx_sbs_nb.align.options.RunOptions`.
    """
    return iter(AlignedRun(ep, onx, args, kwargs, **options))


__all__ = ["AlignedRun", "SbsInputError", "SbsMismatchError", "SideBySideRun", "run_aligned"]
