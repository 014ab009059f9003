"""A screening pass for the inputs after the first of a run over many inputs.

The per-node engine costs some 40 ms per input on a 4-layer Llama, most of it in the
Python loop over ~400 records, while the bare work (one eager run of the program, one
whole-model onnxruntime run) costs 6 ms.  On an input where every pair passes, each
record differs from the first input's only by its first comparison's numbers.  The
screen gets those numbers in three passes: one run of the program keeping every paired
fx value (its graph module returning them: one generated forward), one onnxruntime run
of the whole model with every paired ONNX value as an output (one session, built once,
its optimizations off so that its kernels are those of the engine's per-node runs), and
one comparison per pair at the tolerance the first input's run used (the C module asked
directly where ``compare`` would ask it, ``compare`` itself elsewhere).  Each record is
then the first input's record with that comparison filled in, as the engine's verdict
fills it (``fill_first_comparison``); it is made only where the input is the pair's
worst so far.  The screen binds each input itself (``_Binding``): no AlignedRun is made
for an input it passes.

An input is screened only when it cannot change anything the full run would say
differently: every compared pair passes (a failing pair needs the engine: its own-error
rerun, its verdict rules, resets).  A run is screened only where the screen reproduces
the engine: the first input is screened too, and its records must equal the engine's
field by field (all but the timings); anything else (a failing or special record on
the first input, own-error reruns, resets, user verdicts, deployed or optimized graphs,
external data, other devices, the decomposition value checks) leaves the run to the
engine for every input.  The screened records carry no timings (``ep_time_run``,
``onnx_time_run`` are None): no node was timed.

A warm run (the same program and model run again on an input of the same shapes,
``warm_screen.py``) is made by the same screen, built from an earlier run's records:
there every record is kept, so each pair is compared once, with the measures
(:meth:`Screen.every_record`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import onnx
import torch

from ..compare.diff import _native_atol
from ..compare.value_facts import _NATIVE_DIRECT, _NO_NUMPY, _RELAYOUT, _RELAYOUT_NATIVE, _c_order
from ..native import NATIVE
from ..records import (
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    KIND_WEIGHT,
    STATUS_OK,
    Record,
    copy_record,
)
from .input_items import split_input
from .judge.judging import (
    as_candidate,
    as_expected,
    comparable,
    fill_first_comparison,
    in_layout_of,
)

# a module-level switch: tests run the same inputs with and without the screen
ENABLED = True

# statuses whose records do not depend on the input's values (nothing compared) or are
# compared and pass
_UNPAIRED = frozenset({"unpaired_ep", "unpaired_onnx"})
_COMPARED_KINDS = frozenset({KIND_NODE, KIND_OUTPUT, KIND_INPUT})
# fields that differ between two runs of the same input
_NOT_COMPARED = ("step", "input_index", "input_name", "ep_time_run", "onnx_time_run")


def _options_allow(options: Any) -> bool:
    """The options whose runs the screen reproduces: the defaults that matter."""
    return (
        options is not None
        and options.runner == "onnxruntime"
        and not options.exc
        and not options.own_error
        and not options.reset_names
        and options.reset is None
        and options.replay is None
        and options.device in (None, "cpu")
        and options.optimize is None
        and options.providers is None
        and not options.time_nodes
        and options.verdict is None
        and options.compare is None
        and options.measures
        and getattr(options, "judge", None) is None
    )


def _run_allows(run: Any) -> bool:
    """The run's parts the screen reproduces: a plain program against its own export."""
    ep = getattr(run, "ep", None)
    candidate = getattr(run, "candidate", None)
    if ep is None or candidate is None or getattr(run, "program", None) is None:
        return False
    if ep.graph_signature.buffers_to_mutate:
        return False
    if getattr(run, "deployment", None) is not None:
        return False
    if getattr(run, "decomposed", None) is not None or getattr(run, "user_outputs", None):
        return False
    if getattr(run, "specialized", None):
        return False
    if getattr(candidate, "device", "cpu") != "cpu":
        return False
    model = candidate.model
    return not any(onnx.external_data_helper.uses_external_data(t) for t in model.graph.initializer)


def _template_allows(records: list[Record]) -> bool:
    """The first input's records: every pair passed or was not compared."""
    for rec in records:
        if rec.reset or rec.passed2 is not None or rec.err_abs2 is not None:
            return False
        if rec.status in _UNPAIRED:
            continue
        if rec.status != STATUS_OK or rec.passed is not True:
            return False
        if rec.kind in _COMPARED_KINDS and rec.decided_by != "tolerance":
            return False  # a value judged by another rule (shape only, as a set...)
        if rec.extra:
            return False
    return True


def _with_outputs(gm: torch.fx.GraphModule, wanted: list[str]) -> torch.fx.GraphModule:
    """The program's graph module returning the values of the ``wanted`` nodes: one
    generated forward, no interpreter's dispatch per node."""
    graph = torch.fx.Graph()
    val_map: dict[torch.fx.Node, torch.fx.Node] = {}
    graph.graph_copy(gm.graph, val_map)
    by_name = {n.name: val_map[n] for n in gm.graph.nodes if n in val_map}
    graph.output(tuple(by_name[n] for n in wanted))
    return torch.fx.GraphModule(gm, graph)


class _NoMeasures:
    """A judge asking ``compare`` for no measures: the screen needs the error and the
    verdict of every pair, the measures only of a record it keeps."""

    measures = False

    def apply(self, result: Any, expected: Any, got: Any) -> None:
        """Leaves the atol/rtol verdict as it is."""


_NO_MEASURES = _NoMeasures()


@dataclasses.dataclass
class Screened:
    """One input's screen: each compared pair's error (by the first input's record
    position) and what makes its record when one is needed."""

    errors: dict[int, float | None]
    values: dict[int, tuple[Any, Any]]


class Screen:
    """What screens the inputs of one run (built once, from the first input's run)."""

    def __init__(self, run: Any, records: list[Record]) -> None:
        import onnxruntime as ort

        self.templates = list(records)
        self.pairing = run.pairing
        self.program = run.program
        self.compared = [
            i for i, r in enumerate(records) if r.status == STATUS_OK and r.kind in _COMPARED_KINDS
        ]
        self.fx_wanted = sorted(
            {self.pairing.by_onnx[records[i].onnx_name].fx_name for i in self.compared}
        )
        self.module = _with_outputs(self.program.graph_module, self.fx_wanted)
        self.placeholders = [n.name for n in self.program.graph.nodes if n.op == "placeholder"]
        graph_inputs = set(run.candidate.graph_inputs)
        self.onnx_wanted = sorted({records[i].onnx_name for i in self.compared} - graph_inputs)
        model = onnx.ModelProto()
        model.CopyFrom(run.candidate.model)
        model.graph.ClearField("output")
        model.graph.output.extend(onnx.ValueInfoProto(name=n) for n in self.onnx_wanted)
        so = ort.SessionOptions()
        # the engine runs each node alone: no fusion may change a value here
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # nor may a weight be prepacked: the engine feeds the weights as inputs, and a
        # MatMul on a prepacked weight sums in another order (a 256-wide Llama's differ)
        so.add_session_config_entry("session.disable_prepacking", "1")
        so.intra_op_num_threads = 1
        so.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            model.SerializeToString(), so, providers=["CPUExecutionProvider"]
        )
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.shapes = _input_shapes(run)
        # per compared pair: its position, its ONNX and fx names, pair, whether its values
        # are compared as they are (no transform, no cast: the C module's direct
        # comparison may take them), its tolerance
        self._plan = []
        for i in self.compared:
            t = records[i]
            pair = self.pairing.by_onnx[t.onnx_name]
            plain = pair.transform is None and pair.cast_to is None and t.kind != KIND_WEIGHT
            self._plan.append((i, t.onnx_name, pair.fx_name, pair, plain, t.atol, t.rtol))
        # per pair, the (shape, dtype) its values had where the first input's comparison
        # went to the C module directly (None: through ``compare``): later inputs ask the
        # C module without finding that again (``_direct_error``)
        self._routes: list[tuple[Any, Any] | None] | None = None
        # binds a later input without making its AlignedRun (None: it makes one)
        self.binding = _Binding.of(run, self)
        # the aggregate of each record's pair, set by the run that folds with it
        self.aggregates: list[Any] | None = None

    @classmethod
    def of_first(cls, run: Any, records: list[Record]) -> Screen | None:
        """The screen of a run, when it may screen; checked on the first input itself:
        its screened records must be the engine's, else None (the engine runs all)."""
        if not (
            _options_allow(getattr(run, "options", None))
            and _run_allows(run)
            and _template_allows(records)
        ):
            return None
        try:
            screen = cls(run, records)
            found = screen.measure(run)
            if found is None:
                return None
            for i, theirs in enumerate(records):
                mine = screen.record(i, found) if i in found.errors else theirs
                if _fields(mine) != _fields(theirs):
                    return None
                # the error folded for a screened input is measured without the
                # measures (the C module's direct pass where it may): the engine's too
                if i in found.errors and _fields_of(found.errors[i]) != _fields_of(theirs.err_abs):
                    return None
        except Exception:  # anything the screen cannot run: the engine runs every input
            return None
        return screen

    def screened(self, run: Any) -> Screened | None:
        """:meth:`measure`, None where the screen cannot run this input (the engine
        runs it and says why)."""
        try:
            return self.measure(run)
        except Exception:
            return None

    def screened_item(self, item: Any) -> Screened | None:
        """:meth:`screened` of one input as the run over many inputs reads it (an item
        of its inputs), bound by :attr:`binding`: no AlignedRun made.  None where the
        screen cannot run it, or where it differs from the first input in anything but
        its values: the engine then makes its run (and refuses it where it is wrong)."""
        if self.binding is None:
            return None
        try:
            bound = self.binding.bind(item)
            return None if bound is None else self._measure(*bound)
        except Exception:
            return None

    def measure(self, run: Any) -> Screened | None:
        """Each compared pair's error on ``run``'s input (an AlignedRun made, not
        iterated), or None when some pair does not pass or the input differs in shape
        from the first: the engine then runs that input."""
        if _input_shapes(run) != self.shapes or getattr(run, "_nonfinite", None):
            return None  # another shape; an input holding NaN: its record has a note
        feeds = {n: _numpy(run.candidate.feeds[n]) for n in self.input_names}
        return self._measure(run.bound.values, feeds)

    def _measure(self, values: dict[str, Any], feeds: dict[str, Any]) -> Screened | None:
        """:meth:`measure` on the program's placeholder values and the session's feeds."""
        fx, outs = self._values(values, feeds)
        from ..compare.diff import compare

        learn = self._routes is None
        routes: list[tuple[Any, Any] | None] = [None] * len(self._plan) if learn else self._routes
        errors: dict[int, float | None] = {}
        pairs: dict[int, tuple[Any, Any]] = {}
        for k, (i, onnx_name, fx_name, pair, plain, atol, rtol) in enumerate(self._plan):
            got = outs[onnx_name] if onnx_name in outs else feeds[onnx_name]
            want = fx[fx_name]
            route = routes[k]
            if route is not None or (learn and plain):
                err = (
                    _direct_error(want, got, atol, rtol, route)
                    if route is not None
                    else _native_error(want, got, atol, rtol)
                )
                if err is not None:
                    if err is False:
                        return None
                    if learn:
                        routes[k] = (tuple(got.shape), got.dtype)
                    errors[i], pairs[i] = err, (want, got)
                    continue
            expected, got = comparable(as_expected(pair, want), got)
            if expected is None:
                return None
            expected = in_layout_of(pair, expected, got)
            d = compare(expected, got, atol, rtol, judge=_NO_MEASURES)
            if d.passed is not True or d.shape_mismatch or d.dtype_mismatch:
                return None
            errors[i], pairs[i] = d.err_abs, (expected, got)
        if learn:
            self._routes = routes
        return Screened(errors, pairs)

    def _values(
        self, values: dict[str, Any], feeds: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Every paired fx value (one program run) and ONNX value (one session run)."""
        with torch.no_grad():
            kept = self.module(*[values[n] for n in self.placeholders])
        fx = dict(zip(self.fx_wanted, kept, strict=True))
        outs = dict(zip(self.onnx_wanted, self.session.run(self.onnx_wanted, feeds), strict=True))
        return fx, outs

    def every_record(self, run: Any) -> list[Record] | None:
        """All of ``run``'s records (an AlignedRun made, not iterated, on an input of the
        template's shapes), each pair's values compared once, as the engine compares
        them (with the measures); None where a pair does not pass or the input differs
        from the template's in shape: the engine then runs it.  A warm run's records
        (``warm_screen.py``, which checks them on the template's own input first)."""
        if _input_shapes(run) != self.shapes or getattr(run, "_nonfinite", None):
            return None
        feeds = {n: _numpy(run.candidate.feeds[n]) for n in self.input_names}
        fx, outs = self._values(run.bound.values, feeds)
        from ..compare.diff import compare

        records = [_untimed(t) for t in self.templates]
        for i, onnx_name, fx_name, pair, _plain, atol, rtol in self._plan:
            got = outs[onnx_name] if onnx_name in outs else feeds[onnx_name]
            expected, got = comparable(as_expected(pair, fx[fx_name]), got)
            if expected is None:
                return None
            d = compare(in_layout_of(pair, expected, got), got, atol, rtol)
            if d.passed is not True or d.shape_mismatch or d.dtype_mismatch:
                return None
            fill_first_comparison(records[i], d)
        return records

    def record(self, i: int, found: Screened) -> Record:
        """The record of the pair at position ``i`` on the screened input, as the
        engine makes it (its first comparison with the measures); no timings."""
        from ..compare.diff import compare

        t = self.templates[i]
        rec = _untimed(t)
        expected, got = found.values[i]
        fill_first_comparison(rec, compare(expected, got, t.atol, t.rtol))
        return rec


def _untimed(template: Record) -> Record:
    """A screened record: the template's copy, with no timings (no node was timed) and
    its own ``extra`` (empty in every template: not shared between runs)."""
    rec = copy_record(template)
    rec.ep_time_run = rec.onnx_time_run = None
    rec.extra = {}
    return rec


class _Binding:
    """Binds a later input as its AlignedRun would (``run.AlignedRun``: ``load_inputs``,
    ``bind_inputs``, the ONNX feeds), without making the run: some 1 ms per input on a
    4-layer Llama, a fifth of the bare work.  It binds only an input of the first
    input's structure whose leaves have the first's shapes, dtypes and devices (and equal
    non-tensor leaves): every check the run makes of an input (count, dtype, rank,
    shapes, the program's guards) reads those alone, and the first input passed them.
    Anything else is left to the run (:meth:`bind` returns None)."""

    def __init__(self, run: Any, screen: Screen) -> None:
        leaves, self.spec = torch.utils._pytree.tree_flatten((run.args, run.kwargs))
        self.key = _leaf_key(leaves)
        self.trust_pickles = bool(run.options.trust_pickles)
        self.user_inputs = list(run.bound.user_inputs)
        user = set(self.user_inputs)
        # the weights, constants and tokens: the same values for every input
        self.fixed = {k: v for k, v in run.bound.values.items() if k not in user}
        self.feeds = [(n, screen.pairing.by_onnx[n]) for n in screen.input_names]

    @classmethod
    def of(cls, run: Any, screen: Screen) -> _Binding | None:
        """The binding of the run's inputs, when it binds the first input as the run
        did (each placeholder's value and each feed): else None."""
        try:
            binding = cls(run, screen)
            bound = binding.bind((run.args, run.kwargs))
        except Exception:
            return None
        if bound is None or len(binding.user_inputs) != len(binding.key):
            return None
        # the inputs are told apart below by their storage: one tensor given twice
        # would not say which placeholder takes which leaf
        views = [
            (t.data_ptr(), tuple(t.shape), t.stride())
            for t in torch.utils._pytree.tree_leaves((run.args, run.kwargs))
            if isinstance(t, torch.Tensor)
        ]
        if len(set(views)) != len(views):
            return None
        values, feeds = bound
        theirs = run.bound.values
        if values.keys() != theirs.keys() or not all(
            _same_tensor(values[k], theirs[k]) for k in values
        ):
            return None
        for n in screen.input_names:
            mine, run_feed = feeds[n], _numpy(run.candidate.feeds[n])
            if type(mine) is not type(run_feed) or not np.array_equal(mine, run_feed):
                return None
            if isinstance(mine, np.ndarray) and mine.dtype != run_feed.dtype:
                return None
        return binding

    def bind(self, item: Any) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """(placeholder values, session feeds) of one input (an item of the inputs),
        or None where the input differs from the first in anything but its values or
        holds NaN/inf (the run notes that on its input's record)."""
        from .source.loading import load_inputs, nonfinite_inputs

        args, kwargs = split_input(item, 0)
        args, kwargs = load_inputs(args, kwargs, trust_pickles=self.trust_pickles)
        leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        if spec != self.spec or _leaf_key(leaves) != self.key:
            return None
        values = dict(self.fixed)
        for name, leaf in zip(self.user_inputs, leaves, strict=True):
            values[name] = leaf.detach() if isinstance(leaf, torch.Tensor) else leaf
        fed = {n: as_candidate(pair, values[pair.fx_name]) for n, pair in self.feeds}
        if nonfinite_inputs(fed):
            return None
        return values, {n: _numpy(v) for n, v in fed.items()}


def _leaf_key(leaves: list[Any]) -> tuple[Any, ...]:
    """What the checks of an input read of its leaves: a tensor's shape, dtype, device
    and layout; any other leaf itself (a constant baked into the program)."""
    return tuple(
        (tuple(t.shape), t.dtype, t.device, t.layout)
        if isinstance(t, torch.Tensor)
        else (type(t), t)
        for t in leaves
    )


def _same_tensor(a: Any, b: Any) -> bool:
    """Whether two placeholder values are the same value (one storage, one view)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (
            isinstance(a, torch.Tensor)
            and isinstance(b, torch.Tensor)
            and a.data_ptr() == b.data_ptr()
            and a.shape == b.shape
            and a.stride() == b.stride()
            and a.dtype == b.dtype
            and a.device == b.device
        )
    return type(a) is type(b) and a == b


def _native_error(want: Any, got: Any, atol: Any, rtol: Any) -> float | bool | None:
    """The error of a pair as ``compare`` finds it where it asks the C module (same
    dtype, under its size limit; a strided torch value put in order first, as
    ``compare`` does below the size where it looks for equal values), False when that
    comparison fails, None where ``compare`` would take another path (the caller then
    calls it)."""
    if NATIVE is None or type(want) is not torch.Tensor or type(got) is not np.ndarray:
        return None
    if want.requires_grad or not want.is_cpu or want.is_conj() or want.is_neg():
        return None
    if atol is None or rtol is None or want.dtype in _NO_NUMPY:
        return None
    e = want.numpy()
    if e.shape != got.shape or e.dtype != got.dtype or not NATIVE.compares(e.dtype):
        return None
    if not got.flags.c_contiguous or not 0 < e.size < _NATIVE_DIRECT:
        return None
    if not _native_atol(e, atol):
        return None
    return _asked(e, got, atol, rtol)


def _direct_error(
    want: Any, got: Any, atol: float, rtol: float, route: tuple[Any, Any]
) -> float | bool | None:
    """:func:`_native_error` of a pair whose first input's values went to the C module:
    its dtype, tolerance and size were found fit then, so only what may differ between
    inputs of one shape is checked here (the shapes, the layouts)."""
    if type(want) is not torch.Tensor or type(got) is not np.ndarray:
        return None
    # (a tensor that requires grad, or with a conjugate or negative bit, raises here:
    # the engine runs the input)
    e = want.numpy()
    shape, dtype = route
    if e.shape != shape or got.shape != shape or not got.flags.c_contiguous:
        return None
    if (e.dtype is not dtype and e.dtype != dtype) or (
        got.dtype is not dtype and got.dtype != dtype
    ):
        return None
    return _asked(e, got, atol, rtol)


def _asked(e: np.ndarray, got: np.ndarray, atol: float, rtol: float) -> float | bool | None:
    """The C module's error of two arrays of one fit dtype and shape, ``got`` in order."""
    if not e.flags.c_contiguous:
        # compare() puts both in order and asks the C module, below the size where it
        # first looks for equal values in place (and from two elements: one is in order)
        if e.dtype.kind != "f" or not _RELAYOUT_NATIVE <= e.size < _RELAYOUT:
            return None
        e = _c_order(e)
    err_abs, _rel, nan, _h01, _h001, fails = NATIVE.compare(e, got, atol, rtol, False)[:6]
    if nan:
        return False
    if err_abs == 0.0 or err_abs <= atol or fails == 0:
        return err_abs
    return False


def _numpy(v: Any) -> Any:
    return v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v


def _input_shapes(run: Any) -> tuple[Any, ...]:
    leaves = torch.utils._pytree.tree_leaves((run.args, run.kwargs))
    return tuple(
        (tuple(t.shape), t.dtype) if isinstance(t, torch.Tensor) else type(t) for t in leaves
    )


def _fields_of(v: Any) -> Any:
    return "nan" if isinstance(v, float) and math.isnan(v) else v


def _fields(rec: Record) -> tuple[Any, ...]:
    """The record's fields but those that differ between two runs of one input, NaN
    equal to NaN."""
    return tuple(
        "nan" if isinstance(v, float) and math.isnan(v) else v
        for f in dataclasses.fields(rec)
        if f.name not in _NOT_COMPARED
        for v in (getattr(rec, f.name),)
    )


__all__ = ["ENABLED", "Screen", "Screened"]
