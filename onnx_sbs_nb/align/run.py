"""run_aligned: execute the plan and yield one Record per aligned pair.

The engine imports no view code (no tqdm, pandas, plotly or widget): views read
``AlignedRun.status`` and consume the records.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import onnx
import torch

from ..convert import convert, device_of, initializer_value, to_torch
from ..device import device_name
from ..diff import compare, shape_type
from ..records import (
    KIND_NODE,
    KIND_WEIGHT,
    STATUS_DTYPE_MISMATCH,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_NOT_COMPARED,
    STATUS_OK,
    STATUS_SHAPE_MISMATCH,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
    UNPAIRED,
    Record,
    RunStatus,
)
from .loading import SbsInputError, load_exported_program, load_inputs, load_onnx_model
from .names import (
    PAIRED_BY_METADATA,
    PAIRED_BY_NAME,
    PAIRED_BY_STATE_DICT,
    TRANSFORM_TRANSPOSE,
    Pair,
    fx_name_from_metadata,
    pair_values,
)
from .options import RESET_ALL, RunOptions
from .plan import FX, Plan, build_plan
from .program import PREPARED_FROM_ONNX_PROGRAM, PreparedProgram, bind_inputs, prepare_program
from .provenance import Provenance, program_provenance
from .runners import ModelContext, make_runner


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


def _target_name(node: torch.fx.Node) -> str:
    if node.op in ("placeholder", "get_attr", "output"):
        return node.op
    t = node.target
    name = getattr(t, "__name__", None) if not isinstance(t, str) else t
    if hasattr(t, "name") and callable(t.name):
        try:
            return t.name().replace("::", ".")
        except Exception:
            pass
    return str(name or t)


def _onnx_node_name(node: onnx.NodeProto, k: int) -> str:
    return node.name or f"{node.op_type}_{k}"


class AlignedRun:
    """One side-by-side run; iterate it to get the records.

    Construction validates everything that can be checked without running (paths,
    inputs against the program and the model, pairing) and raises SbsInputError early.
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
        self.options = RunOptions.from_kwargs(options, **option_kwargs)
        opts = self.options
        prepared_from_onnx = getattr(onx, "exported_program", None)
        self.ep = load_exported_program(ep)
        self.model = load_onnx_model(onx)
        self.args, self.kwargs = load_inputs(args, kwargs)
        device = opts.device
        if device is None:
            # inputs already on a GPU mean "run there"
            devices = {
                str(t.device)
                for t in torch.utils._pytree.tree_leaves((self.args, self.kwargs))
                if isinstance(t, torch.Tensor)
            }
            device = next((d for d in sorted(devices) if d.startswith("cuda")), None)
        self.device = device_name(device)
        self.atol, self.rtol = opts.atol, opts.rtol
        self.exc = opts.exc
        self.rerun = opts.own_error
        self.reset_all = opts.reset == RESET_ALL
        self.reset_names = set(opts.reset_names)
        self.replay = opts.replay
        self.replay_dir = opts.replay_dir
        self.runner = make_runner(opts.runner, self.device)
        if isinstance(prepared_from_onnx, torch.export.ExportedProgram):
            self.prepared = PreparedProgram(prepared_from_onnx, PREPARED_FROM_ONNX_PROGRAM)
        else:
            self.prepared = prepare_program(self.ep)
        self.program = self.prepared.program
        self.graph_module = self.program.graph_module
        self.bound = bind_inputs(self.program, self.args, self.kwargs)
        self.provenance = program_provenance(self.program.graph, self.ep.graph, self.bound.weights)
        self.ctx = ModelContext.from_model(self.model, self.device)
        self.pairing = pair_values(
            self.program.graph, self.model, self.bound.weights, self.bound.user_inputs
        )
        self._check_pairing()
        self._initializers = {i.name: i for i in self.model.graph.initializer}
        self._graph_inputs = {i.name for i in self.model.graph.input}
        self._onnx_notes: dict[str, str] = {}  # value -> how its node was run, if unusual
        self._init_cache: dict[str, Any] = {}
        self._fx_nodes_by_name = {n.name: n for n in self.program.graph.nodes}
        unknown = (
            self.reset_names
            - set(self.pairing.by_onnx)
            - {p.fx_name for p in self.pairing.by_onnx.values()}
        )
        if unknown:
            raise SbsInputError(
                f"reset_names {sorted(unknown)[:5]} name no paired value: use ONNX value names "
                "or fx node names that appear in the records"
            )
        self.plan: Plan = build_plan(
            self.program.graph,
            self.model,
            self.pairing,
            self.ctx.free_variables,
            needs_torch_inputs=opts.needs_torch_inputs,
        )
        self.status = status or RunStatus()
        self.status.total_onnx_nodes = len(self.model.graph.node)
        self.status.total_ep_nodes = len(self.plan.fx_nodes)
        if self.prepared.note:
            self.status.extra["program_note"] = self.prepared.note
        self.records: list[Record] = []
        self._stop = threading.Event()
        self._prepared_fns: dict[int, Any] = {}
        self._started = False

    # ------------------------------------------------------------------ setup
    def _check_pairing(self) -> None:
        strong = [
            p
            for p in self.pairing.by_onnx.values()
            if p.rule in (PAIRED_BY_NAME, PAIRED_BY_METADATA, PAIRED_BY_STATE_DICT)
        ]
        if not strong:
            raise SbsInputError(
                "the ONNX model shares no value name, node metadata or weight name with the "
                "program: it was not exported from this ExportedProgram (export it with "
                "torch.onnx.export(ep, args, dynamo=True) and pass that model)"
            )
        g = self.model.graph
        inits = {i.name for i in g.initializer}
        for inp in g.input:
            if inp.name in inits:
                continue
            pair = self.pairing.by_onnx.get(inp.name)
            if pair is None:
                raise SbsInputError(
                    f"ONNX input {inp.name!r} matches no input of the program (program inputs: "
                    f"{self.bound.user_inputs}): the model and the program take different inputs"
                )
            value = self.bound.values.get(pair.fx_name)
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

    # ------------------------------------------------------------ public API
    def __iter__(self) -> Iterator[Record]:
        if self._started:
            raise RuntimeError("an AlignedRun can be iterated once; its records are in .records")
        self._started = True
        return self._records()

    def stop(self) -> None:
        """Ends the run after the current step; everything yielded so far is kept."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    # ------------------------------------------------------------ execution
    def _initializer(self, name: str) -> Any:
        v = self._init_cache.get(name)
        if v is None:
            v = initializer_value(self._initializers[name], self.runner.value_kind, self.device)
            self._init_cache[name] = v
        return v

    def _fx_placeholder_value(self, name: str) -> Any:
        v = self.bound.values[name]
        if isinstance(v, torch.Tensor) and self.device != "cpu" and v.device.type == "cpu":
            v = v.to(self.device)
            self.bound.values[name] = v
        return v

    def _run_fx_node(self, node: torch.fx.Node, env: dict[str, Any]) -> Any:
        if node.op == "placeholder":
            return self._fx_placeholder_value(node.name)
        if node.op == "get_attr":
            obj: Any = self.graph_module
            for part in str(node.target).split("."):
                obj = getattr(obj, part)
            return obj

        def load(a: torch.fx.Node) -> Any:
            if a.name not in env:
                raise RuntimeError(f"input {a.name!r} is not available (upstream failure)")
            return env[a.name]

        args = torch.fx.node.map_arg(node.args, load)
        kwargs = torch.fx.node.map_arg(node.kwargs, load)
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_module":
            return self.graph_module.get_submodule(str(node.target))(*args, **kwargs)
        if node.op == "call_method":
            return getattr(args[0], str(node.target))(*args[1:], **kwargs)
        raise RuntimeError(f"unsupported fx node op {node.op!r}")

    def _node_fn(self, k: int, node: onnx.NodeProto) -> Any:
        fn = self._prepared_fns.get(k)
        if fn is None:
            fn = self.runner.prepare(node, self.ctx)
            self._prepared_fns[k] = fn
        return fn

    def _onnx_inputs(self, node: onnx.NodeProto, env: dict[str, Any]) -> list[Any]:
        values = []
        for name in [*node.input, *self.ctx.free_variables(node)]:
            if not name:
                values.append(None)
            elif name in env:
                values.append(env[name])
            elif name in self._initializers:
                values.append(self._initializer(name))
            else:
                raise KeyError(name)
        return values

    def _shadow_inputs(
        self, node: onnx.NodeProto, env: dict[str, Any], fx_env: dict[str, Any], shadow: dict
    ) -> list[Any] | None:
        """Inputs for the own-error rerun: torch partners, else values computed from them."""
        values = []
        kind = self.runner.value_kind
        for name in [*node.input, *self.ctx.free_variables(node)]:
            if not name:
                values.append(None)
            elif name in self._initializers:
                # a weight belongs to the model: the node is judged with its own constants
                values.append(self._initializer(name))
            elif name in self.pairing.by_onnx:
                pair = self.pairing.by_onnx[name]
                key = ("torch", name)
                if key not in shadow:
                    if pair.fx_name not in fx_env:
                        return None
                    shadow[key] = convert(
                        self._fx_as_onnx(pair, fx_env[pair.fx_name]), kind, self.device
                    )
                values.append(shadow[key])
            elif name in shadow and not isinstance(shadow[name], _Failure):
                # an intermediate value without torch partner, computed from torch inputs
                values.append(shadow[name])
            elif name in env and name in self._graph_inputs:
                values.append(env[name])
            else:
                return None
        return values

    def _graph_input_values(self) -> dict[str, Any]:
        """The ONNX graph inputs, from the torch inputs they pair with."""
        values = {}
        for name in self._graph_inputs:
            pair = self.pairing.by_onnx.get(name)
            if pair is not None and name not in self._initializers:
                value = self._fx_placeholder_value(pair.fx_name)
                values[name] = convert(value, self.runner.value_kind, self.device)
        return values

    def _fx_as_onnx(self, pair: Pair, value: Any) -> Any:
        if pair.transform == TRANSFORM_TRANSPOSE and isinstance(value, torch.Tensor):
            return value.t()
        return value

    def _records(self) -> Iterator[Record]:
        t0 = time.perf_counter()
        status = self.status
        plan = self.plan
        fx_env: dict[str, Any] = {}
        env: dict[str, Any] = {}
        shadow: dict[str, Any] = {}
        fx_times: dict[str, float] = {}
        onnx_times: dict[str, float] = {}
        fx_errors: dict[str, str] = {}
        onnx_errors: dict[str, str] = {}
        onnx_notes = self._onnx_notes
        kind = self.runner.value_kind
        use_shadow = self.rerun or self.reset_all
        by_onnx = self.pairing.by_onnx
        by_fx = self.pairing.by_fx
        env.update(self._graph_input_values())
        step_counter = 0
        peak_live = 0
        fx_weights_live = 0
        weights = self.bound.weights
        try:
            # initializers without a torch partner: listed once, up front
            for name in self._initializers:
                if name not in by_onnx:
                    rec = Record(
                        onnx_id_node=-1,
                        onnx_name=name,
                        onnx_op_type="initializer",
                        onnx_shape_type=_proto_shape_type(self._initializers[name]),
                        kind=KIND_WEIGHT,
                        paired_by=UNPAIRED,
                        status=STATUS_UNPAIRED_ONNX,
                        step=step_counter,
                    )
                    step_counter += 1
                    yield self._emit(rec)
            for s, (side, idx) in enumerate(plan.steps):
                if self._stop.is_set():
                    status.stopped = True
                    break
                if side == FX:
                    node = plan.fx_nodes[idx]
                    t = time.perf_counter()
                    try:
                        value = self._run_fx_node(node, fx_env)
                        fx_env[node.name] = value
                        if node.name in weights:
                            fx_weights_live += 1
                    except Exception as e:
                        fx_errors[node.name] = f"{type(e).__name__}: {e}"
                        status.errors += 1
                    fx_times[node.name] = time.perf_counter() - t
                    status.done_ep_nodes += 1
                    if node.name not in by_fx and node.op == "call_function":
                        value = fx_env.get(node.name)
                        if isinstance(value, torch.Tensor) or node.name in fx_errors:
                            rec = self._fx_only_record(node, idx, value, fx_times, fx_errors)
                            rec.step = step_counter
                            step_counter += 1
                            yield self._emit(rec)
                else:
                    node = plan.onnx_nodes[idx]
                    status.current = _onnx_node_name(node, idx)
                    t = time.perf_counter()
                    try:
                        inputs = self._onnx_inputs(node, env)
                    except KeyError as e:
                        msg = f"not computed: input {e.args[0]!r} is missing (upstream failure)"
                        for o in node.output:
                            onnx_errors[o] = msg
                        inputs = None
                    if inputs is not None:
                        try:
                            outputs = self._node_fn(idx, node)(inputs)
                            for o, v in zip(node.output, outputs):
                                if o:
                                    env[o] = v
                        except Exception as e:
                            msg = f"{node.op_type} failed: {type(e).__name__}: {e}"
                            status.errors += 1
                            for o in node.output:
                                onnx_errors[o] = msg
                    elapsed = time.perf_counter() - t
                    for o in node.output:
                        onnx_times[o] = elapsed
                    note = getattr(self._prepared_fns.get(idx), "fallback_reason", None)
                    if note:
                        for o in node.output:
                            onnx_notes[o] = note
                    if use_shadow:
                        self._run_shadow(idx, node, env, fx_env, shadow, inputs)
                    status.done_onnx_nodes += 1
                    for k, o in enumerate(node.output):
                        if o and o not in by_onnx:
                            rec = Record(
                                onnx_id_node=idx,
                                onnx_name=o,
                                onnx_op_type=node.op_type,
                                onnx_domain=node.domain or None,
                                onnx_id_output=k,
                                onnx_shape_type=shape_type(env[o]) if o in env else None,
                                onnx_time_run=elapsed,
                                onnx_device=device_of(env[o]) if o in env else None,
                                kind=KIND_NODE,
                                paired_by=UNPAIRED,
                                status=STATUS_ERROR if o in onnx_errors else STATUS_UNPAIRED_ONNX,
                                error=onnx_errors.get(o),
                                step=step_counter,
                            )
                            step_counter += 1
                            yield self._emit(rec)
                for onnx_name in plan.compare_at.get(s, ()):
                    rec = self._compare(
                        onnx_name, fx_env, env, shadow, fx_times, onnx_times, fx_errors, onnx_errors
                    )
                    rec.step = step_counter
                    step_counter += 1
                    pair = by_onnx[onnx_name]
                    # a weight is the model's own constant: only replaced when named
                    rec.reset = pair.fx_name in fx_env and (
                        (self.reset_all and onnx_name not in self._initializers)
                        or onnx_name in self.reset_names
                        or pair.fx_name in self.reset_names
                    )
                    if self.exc and rec.failed:
                        self._emit(rec)
                        raise SbsMismatchError(rec)
                    yield self._emit(rec)
                    if rec.reset:
                        env[onnx_name] = convert(
                            self._fx_as_onnx(pair, fx_env[pair.fx_name]), kind, self.device
                        )
                for name in plan.free_fx_at.get(s, ()):
                    if fx_env.pop(name, None) is not None and name in weights:
                        fx_weights_live -= 1
                for name in plan.free_onnx_at.get(s, ()):
                    env.pop(name, None)
                    # our copy of a weight goes too: the ModelProto still holds its bytes
                    self._init_cache.pop(name, None)
                    if use_shadow:
                        shadow.pop(name, None)
                        shadow.pop(("torch", name), None)
                # activations only: weights are references to the program's own tensors
                live = len(env) + len(fx_env) - fx_weights_live + len(shadow)
                if live > peak_live:
                    peak_live = live
                    status.extra["peak_live_values"] = live
                status.elapsed = time.perf_counter() - t0
        finally:
            status.elapsed = time.perf_counter() - t0
            status.current = None
            status.finished = True
        if self.replay is not None and not self._stop.is_set():
            self._write_selected_replays()

    def _run_shadow(
        self,
        idx: int,
        node: onnx.NodeProto,
        env: dict[str, Any],
        fx_env: dict[str, Any],
        shadow: dict[str, Any],
        main_inputs: list[Any] | None,
    ) -> None:
        inputs = self._shadow_inputs(node, env, fx_env, shadow)
        if inputs is None:
            return
        if main_inputs is not None and all(a is b for a, b in zip(inputs, main_inputs)):
            # same inputs as the first run: the own error is the first error
            for o in node.output:
                if o and o in env:
                    shadow[o] = env[o]
            return
        try:
            outputs = self._node_fn(idx, node)(inputs)
        except Exception as e:
            for o in node.output:
                if o:
                    shadow[o] = _Failure(f"{type(e).__name__}: {e}")
            return
        for o, v in zip(node.output, outputs):
            if o:
                shadow[o] = v

    # ------------------------------------------------------------ records
    def _emit(self, rec: Record) -> Record:
        self._in_user_words(rec)
        st = self.status
        self.records.append(rec)
        st.records += 1
        if rec.failed:
            st.failures += 1
        if rec.err_abs is not None and rec.err_abs > st.max_err_abs and rec.err_abs == rec.err_abs:
            st.max_err_abs = rec.err_abs
            st.max_err_name = rec.onnx_name or rec.ep_name
        return rec

    def _in_user_words(self, rec: Record) -> Record:
        """Fills the user's names of the torch side and the ONNX node's identity."""
        if rec.ep_name is not None:
            prov = self.provenance.get(rec.ep_name, _NO_PROVENANCE)
            rec.ep_user_name, rec.ep_module, rec.ep_source = (
                prov.user_name,
                prov.module,
                prov.source,
            )
        k = rec.onnx_id_node
        if k is not None and k >= 0:
            node = self.model.graph.node[k]
            rec.onnx_node_name = _onnx_node_name(node, k)
            rec.onnx_fx_node = fx_name_from_metadata(node)
        return rec

    def _fx_only_record(self, node, idx, value, fx_times, fx_errors) -> Record:
        return Record(
            ep_id_node=idx,
            ep_name=node.name,
            ep_target=_target_name(node),
            ep_shape_type=shape_type(value) if value is not None else None,
            ep_time_run=fx_times.get(node.name),
            ep_device=device_of(value) if value is not None else None,
            kind=KIND_NODE,
            paired_by=UNPAIRED,
            status=STATUS_ERROR if node.name in fx_errors else STATUS_UNPAIRED_EP,
            error=fx_errors.get(node.name),
        )

    def _compare(
        self, onnx_name, fx_env, env, shadow, fx_times, onnx_times, fx_errors, onnx_errors
    ) -> Record:
        pair = self.pairing.by_onnx[onnx_name]
        fx_node = self._fx_nodes_by_name[pair.fx_name]
        producer = self.plan.onnx_producer.get(onnx_name)
        onnx_node = self.plan.onnx_nodes[producer] if producer is not None else None
        if onnx_node is not None:
            op_type = onnx_node.op_type
            out_idx = list(onnx_node.output).index(onnx_name)
        elif onnx_name in self._initializers:
            op_type, out_idx = "initializer", None
        else:
            op_type, out_idx = "input", None
        rec = Record(
            ep_id_node=self.plan.fx_index.get(pair.fx_name),
            onnx_id_node=producer if producer is not None else -1,
            ep_name=pair.fx_name,
            onnx_name=onnx_name,
            ep_target=_target_name(fx_node),
            onnx_op_type=op_type,
            onnx_domain=(onnx_node.domain or None) if onnx_node is not None else None,
            onnx_id_output=out_idx,
            ep_time_run=fx_times.get(pair.fx_name),
            onnx_time_run=onnx_times.get(onnx_name),
            kind=pair.kind,
            paired_by=pair.rule,
        )
        if pair.transform:
            rec.comment = f"compared with the {pair.transform}d torch weight"
        rec.comment = _join(rec.comment, self._onnx_notes.get(onnx_name))
        err = fx_errors.get(pair.fx_name) or onnx_errors.get(onnx_name)
        if err:
            rec.status, rec.error = STATUS_ERROR, err
            if pair.fx_name in fx_errors:
                rec.error = f"torch side: {fx_errors[pair.fx_name]}"
            return rec
        expected = self._fx_as_onnx(pair, fx_env.get(pair.fx_name))
        got = env[onnx_name] if onnx_name in env else self._initializer(onnx_name)
        rec.ep_shape_type = shape_type(expected)
        rec.onnx_shape_type = shape_type(got)
        rec.ep_device = device_of(expected)
        rec.onnx_device = device_of(got)
        rec.err_dev = 0.0 if rec.ep_device == rec.onnx_device else 1.0
        expected, got = _comparable(expected, got)
        if expected is None:
            rec.status = STATUS_NOT_COMPARED
            rec.comment = _join(rec.comment, "not a tensor on both sides")
            return rec
        d = compare(expected, got, self.atol, self.rtol)
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
        own = shadow.get(onnx_name)
        if own is not None and onnx_node is not None:
            if isinstance(own, _Failure):
                rec.comment = _join(rec.comment, f"rerun on torch inputs failed: {own.message}")
            else:
                e2, g2 = _comparable(self._fx_as_onnx(pair, fx_env.get(pair.fx_name)), own)
                if e2 is not None:
                    d2 = compare(e2, g2, self.atol, self.rtol)
                    rec.err_abs2, rec.err_rel2, rec.err_nan2 = d2.err_abs, d2.err_rel, d2.err_nan
                    rec.err_h012, rec.err_h0012 = d2.err_h01, d2.err_h001
                    rec.err_dev2 = 0.0 if device_of(own) == rec.ep_device else 1.0
                    rec.passed2 = d2.passed
            if op_type in ("Gemm", "MatMul") and rec.ep_target.startswith(_LINEAR_TARGETS):
                note = _linear_check(onnx_node, self._onnx_inputs_or_none(onnx_node, env), got)
                if note:
                    rec.comment = _join(rec.comment, note)
        return rec

    def _onnx_inputs_or_none(self, node: onnx.NodeProto, env: dict[str, Any]) -> list | None:
        try:
            return self._onnx_inputs(node, env)
        except KeyError:
            return None

    # ------------------------------------------------------------ post-run actions
    def collect(
        self, fx_names: set[str], onnx_names: set[str], upto_onnx: int | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Recomputes and returns the requested values of both sides.

        Runs the program and the ONNX nodes up to the last one needed, keeping only the
        requested values (everything else is freed as in the run): post-run actions get
        any node's values with memory bounded like a run, at the cost of a partial rerun.
        """
        if upto_onnx is None:
            producers = [
                self.plan.onnx_producer[n] for n in onnx_names if n in self.plan.onnx_producer
            ]
            upto_onnx = max(producers, default=-1)
        plan = build_plan(
            self.program.graph,
            self.model,
            self.pairing,
            self.ctx.free_variables,
            needs_torch_inputs=False,
            keep_fx=set(fx_names),
            keep_onnx=set(onnx_names),
            stop_after_onnx=max(upto_onnx, 0) if upto_onnx >= 0 else -1,
        )
        fx_env: dict[str, Any] = {}
        env: dict[str, Any] = self._graph_input_values()
        with torch.no_grad():
            for s, (side, idx) in enumerate(plan.steps):
                if side == FX:
                    node = plan.fx_nodes[idx]
                    try:
                        fx_env[node.name] = self._run_fx_node(node, fx_env)
                    except Exception:
                        pass
                else:
                    node = plan.onnx_nodes[idx]
                    try:
                        outs = self._node_fn(idx, node)(self._onnx_inputs(node, env))
                        for o, v in zip(node.output, outs):
                            if o:
                                env[o] = v
                    except Exception:
                        pass
                for name in plan.free_fx_at.get(s, ()):
                    fx_env.pop(name, None)
                for name in plan.free_onnx_at.get(s, ()):
                    env.pop(name, None)
                    self._init_cache.pop(name, None)
        onnx_values = {}
        for n in onnx_names:
            if n in env:
                onnx_values[n] = env[n]
            elif n in self._initializers:
                onnx_values[n] = self._initializer(n)
        return {n: fx_env[n] for n in fx_names if n in fx_env}, onnx_values

    def find_node(self, name: str) -> tuple[int, onnx.NodeProto]:
        """An ONNX node by node name, output name, or the fx name paired with an output."""
        for k, node in enumerate(self.model.graph.node):
            if node.name == name or name in node.output:
                return k, node
        pairs = self.pairing.by_fx.get(name)
        if pairs:
            k = self.plan.onnx_producer.get(pairs[0].onnx_name)
            if k is not None:
                return k, self.model.graph.node[k]
        raise KeyError(
            f"no ONNX node is named {name!r} or produces a value named so "
            "(use a node name, an output name, or an fx node name from the records)"
        )

    def rerun_node(self, name: str, device: str = "cpu") -> dict[str, Any]:
        """Reruns one ONNX node in the torch evaluator on the torch values of its inputs."""
        from ..diff import compare as _cmp
        from ..evaluator.evaluator import compile_node

        device = device_name(device)
        k, node = self.find_node(name)
        fx_needed = set()
        onnx_needed = set(o for o in node.output if o)
        for i in [*node.input, *self.ctx.free_variables(node)]:
            if not i:
                continue
            p = self.pairing.by_onnx.get(i)
            if p is not None and i not in self._initializers:
                fx_needed.add(p.fx_name)
            else:
                onnx_needed.add(i)
        for o in node.output:
            p = self.pairing.by_onnx.get(o)
            if p is not None:
                fx_needed.add(p.fx_name)
        fx_vals, onnx_vals = self.collect(fx_needed, onnx_needed, upto_onnx=k)
        result: dict[str, Any] = {
            "node": _onnx_node_name(node, k),
            "op_type": node.op_type,
            "device": device,
            "outputs": [],
            "error": None,
        }
        inputs = []
        for i in [*node.input, *self.ctx.free_variables(node)]:
            if not i:
                inputs.append(None)
                continue
            p = self.pairing.by_onnx.get(i)
            if p is not None and i not in self._initializers and p.fx_name in fx_vals:
                inputs.append(to_torch(self._fx_as_onnx(p, fx_vals[p.fx_name]), device))
            elif i in onnx_vals:
                inputs.append(to_torch(onnx_vals[i], device))
            else:
                result["error"] = f"input {i!r} is not available (it failed to compute)"
                return result
        t = time.perf_counter()
        try:
            fn = compile_node(node, self.ctx.opsets, self.ctx.functions, device=device)
            outs = fn(inputs)
        except Exception as e:
            result["error"] = f"{type(e).__name__}: {e}"
            return result
        result["time"] = time.perf_counter() - t
        for o, v in zip(node.output, outs):
            if not o:
                continue
            entry: dict[str, Any] = {"onnx_name": o, "shape_type": shape_type(v)}
            p = self.pairing.by_onnx.get(o)
            if p is not None and p.fx_name in fx_vals:
                e, g = _comparable(self._fx_as_onnx(p, fx_vals[p.fx_name]), v)
                entry["ep_name"] = p.fx_name
                if e is not None:
                    d = _cmp(e, g, self.atol, self.rtol)
                    entry.update(
                        err_abs_vs_torch=d.err_abs,
                        err_rel_vs_torch=d.err_rel,
                        passed_vs_torch=d.passed,
                    )
            if o in onnx_vals:
                e, g = _comparable(to_torch(onnx_vals[o]), v)
                if e is not None:
                    d = _cmp(e, g, self.atol, self.rtol)
                    entry.update(err_abs_vs_first_run=d.err_abs, err_rel_vs_first_run=d.err_rel)
            result["outputs"].append(entry)
        return result

    def node_detail(self, name: str) -> dict[str, Any]:
        """What a detail panel shows about one ONNX node (strings, JSON-safe)."""
        k, node = self.find_node(name)
        meta = {p.key: p.value for p in node.metadata_props}
        fx_name = None
        for o in node.output:
            p = self.pairing.by_onnx.get(o)
            if p is not None:
                fx_name = p.fx_name
        if fx_name is None:
            from .names import fx_name_from_metadata

            fx_name = fx_name_from_metadata(node)
        fx_node = self._fx_nodes_by_name.get(fx_name) if fx_name else None
        stack = meta.get("pkg.torch.onnx.stack_trace")
        if stack is None and fx_node is not None:
            stack = fx_node.meta.get("stack_trace")
        return {
            "onnx_node": _onnx_node_name(node, k),
            "onnx_id_node": k,
            "op_type": node.op_type,
            "domain": node.domain,
            "attributes": {a.name: _attr_str(a) for a in node.attribute},
            "inputs": [
                {**self._pairing_of(i), "initializer": i in self._initializers} for i in node.input
            ],
            "outputs": [self._pairing_of(o) for o in node.output],
            "ep_name": fx_name,
            "ep_target": _target_name(fx_node) if fx_node is not None else None,
            "ep_node": fx_node.format_node() if fx_node is not None else None,
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

    def replay_inputs(self, name: str) -> dict[str, Any]:
        """Values needed to write a replay bundle of one node (see save_replay)."""
        from .submodel import submodel_inputs

        k, node = self.find_node(name)

        def has_partner(v: str) -> bool:
            p = self.pairing.by_onnx.get(v)
            return p is not None and v not in self._initializers

        inputs = submodel_inputs(self.model, node.name or node.output[0], has_partner)
        fx_needed = {self.pairing.by_onnx[i].fx_name for i in inputs if i in self.pairing.by_onnx}
        outs = [o for o in node.output if o]
        fx_needed |= {self.pairing.by_onnx[o].fx_name for o in outs if o in self.pairing.by_onnx}
        fx_vals, onnx_vals = self.collect(fx_needed, set(inputs), upto_onnx=k)
        torch_inputs, onnx_inputs, expected, mapping = {}, {}, {}, {}
        for i in inputs:
            p = self.pairing.by_onnx.get(i)
            if p is not None and p.fx_name in fx_vals:
                torch_inputs[i] = to_torch(self._fx_as_onnx(p, fx_vals[p.fx_name]))
                mapping[i] = p.fx_name
            if i in onnx_vals:
                onnx_inputs[i] = to_torch(onnx_vals[i])
        for o in outs:
            p = self.pairing.by_onnx.get(o)
            if p is not None and p.fx_name in fx_vals:
                expected[o] = to_torch(self._fx_as_onnx(p, fx_vals[p.fx_name]))
                mapping[o] = p.fx_name
        return {
            "node": node,
            "node_name": node.name or node.output[0],
            "torch_inputs": torch_inputs,
            "onnx_inputs": onnx_inputs,
            "expected": expected,
            "mapping": mapping,
        }

    def save_replay(self, name: str, root: str | Path) -> Path:
        """Writes the replay bundle of one ONNX node inside ``root``; returns its folder."""
        from .replay import write_replay_bundle

        data = self.replay_inputs(name)
        record = next(
            (r for r in reversed(self.records) if r.onnx_name in set(data["node"].output)), None
        )
        prefix = getattr(self.replay, "prefix_model", False)
        kwargs: dict[str, Any] = {}
        if prefix:
            kwargs["prefix_inputs"] = {
                i.name: to_torch(self._initializer(i.name))
                if i.name in self._initializers
                else to_torch(self.bound.values[self.pairing.by_onnx[i.name].fx_name])
                for i in self.model.graph.input
                if i.name in self.pairing.by_onnx
            }
        return write_replay_bundle(
            Path(root),
            model=self.model,
            node_name=data["node_name"],
            torch_inputs=data["torch_inputs"],
            onnx_inputs=data["onnx_inputs"],
            expected=data["expected"],
            mapping=data["mapping"],
            record=record,
            **kwargs,
        )

    def _write_selected_replays(self) -> None:
        nodes = self.model.graph.node
        selected: list[str] = []
        seen: set[int] = set()
        for rec in self.records:
            k = rec.onnx_id_node
            if k is None or k < 0 or k in seen:
                continue
            if self.replay.selects(rec, node_name=_onnx_node_name(nodes[k], k)):
                seen.add(k)
                selected.append(rec.onnx_name)
        written = []
        for name in selected[: self.replay.max_nodes]:
            try:
                written.append(str(self.save_replay(name, self.replay_dir)))
            except Exception as e:
                self.status.extra.setdefault("replay_errors", []).append(f"{name}: {e}")
        self.status.extra["replay_bundles"] = written


_NO_PROVENANCE = Provenance()


class _Failure:
    __slots__ = ("message",)

    def __init__(self, message: str):
        self.message = message


def _join(a: str | None, b: str | None) -> str | None:
    if not a:
        return b
    if not b:
        return a
    return f"{a}; {b}"


def _comparable(expected: Any, got: Any) -> tuple[Any, Any]:
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


def _attr_str(a: onnx.AttributeProto) -> str:
    if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
        return "<subgraph>"
    if a.type == onnx.AttributeProto.TENSOR:
        return f"<tensor {_proto_shape_type(a.t)}>"
    v = onnx.helper.get_attribute_value(a)
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    s = repr(v)
    return s if len(s) < 200 else s[:197] + "..."


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


__all__ = ["AlignedRun", "SbsInputError", "SbsMismatchError", "run_aligned"]
