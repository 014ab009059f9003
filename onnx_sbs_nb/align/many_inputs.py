"""Runs over many inputs: one run per input, folded into one record per pair.

Export bugs often show on some inputs only (a fully masked row, left padding, a NaN in
one batch element, values near a branch point).  :class:`ManyInputsRun` runs the usual
side-by-side run once per input, in turn, and folds each record into the aggregate of
its pair: the worst input's record (what the views show and the summary judges), how
many inputs fail there and the mean error.  Then it yields one record per pair, in
execution order, so that the summary's culprit is the first node that fails on any input
and names that input.  A pair that passes on every input shows its record on the first
input where something fails: the values upstream of that failure, where an error made
under tolerance and amplified later is found, rather than its largest rounding.

What a second run of the same program and model needs is kept between runs
(``engine/setup_cache.py``: prepared program, pairing, tables, plan; ``engine/runners.py``:
compiled sessions), so inputs after the first cost their execution only.  An input after
the first where every pair passes costs less still: the screen (``screen.py``) finds
that from one run of each side and folds its errors; the inputs where a pair fails run
through the engine, and the aggregates are the engine's either way.  A run holds
one input's values at a time: memory stays that of one input's run plus one record per
pair (and, with ``keep_records=True``, every input's records).
"""

from __future__ import annotations

import dataclasses
import math
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from ..errors import SbsInputError
from ..records import (
    FAILING_STATUSES,
    KIND_WEIGHT,
    STATUS_ERROR,
    STATUS_PRECISION_LOSS,
    STATUS_QUANTIZATION_NOISE,
    STATUS_WEIGHT_DIFFERS,
    STATUSES,
    WEIGHT_UNREAD_NOTE,
    Record,
    RunStatus,
    copy_record,
)
from .contract import PROGRAM_ACTIONS, RunContract
from .input_items import split_input
from .judge.judging import SbsMismatchError

# a run over one input: (args, kwargs) -> an iterable run with .status, .stop(), .records
RunFactory = Callable[[Any, Any], Any]

_JUDGED_ELSEWHERE = frozenset(k for k, v in STATUSES.items() if v.judged_elsewhere)


@dataclasses.dataclass
class ModelReuse:
    """What every input's run reads of the model alone, kept by the first input's run
    for the others: the model checked and put in run order, its structure digest and its
    exporter metadata (``run.AlignedRun``).  Checking a 4-layer Llama again costs a
    fifth of a later input's run, and nothing in it depends on the input.

    ``checks`` counts the times the model was read and checked: 1 over a run of any
    length (a test holds it there; a run that reads the model per input again is slower
    by that much per input and says nothing)."""

    facts: Any = None  # (checked model, structure digest, FxMetadata)
    checks: int = 0

    def keep(self, facts: Any) -> None:
        self.facts = facts
        self.checks += 1


def sessions_built(run: Any) -> int:
    """The onnxruntime sessions (one node's or a stretch's) a run's runner built: a run
    over many inputs builds them for its first inputs only (the runners share them)."""
    runner = getattr(getattr(run, "candidate", None), "runner", None)
    if runner is None:
        return 0
    return int(getattr(runner, "sessions_built", 0)) + int(
        getattr(runner, "stretch_sessions_built", 0)
    )


class InputReadError(RuntimeError):
    """Reading the next input (a DataLoader, a generator) raised: names its index."""


# a record's fields in the order its __init__ takes them: one call copies a record, where
# dataclasses.replace and copy.copy cost 6x more on its 61 slots (a Llama's ~400
# aggregates are copied once per run, the records a screened input makes worst too)
def pair_key(rec: Record) -> tuple[Any, ...]:
    """What identifies a pair across the runs of one program and model."""
    return (rec.kind, rec.ep_name, rec.onnx_name, rec.onnx_id_output)


def fails(rec: Record) -> bool:
    """The pair fails on this input: its first comparison failed (a value that only
    inherits an error from upstream, drifted, counts too: the input shows the error), or
    its own error did (the count its culprit's why gives is this one).  Quantization noise
    fails nothing: its own rerun is beyond tolerance by the model's quantization alone."""
    if rec.status == STATUS_QUANTIZATION_NOISE:
        return False
    if rec.status in FAILING_STATUSES or rec.passed2 is False:
        return True
    return rec.passed is False and rec.status not in _JUDGED_ELSEWHERE


def _severity(rec: Record, failed: bool | None = None) -> tuple[int, float]:
    """How bad one input's record of a pair is: its own failure first (the node makes
    the error on that input), then a failure, then the size of the error (NaN worst).
    ``failed``: :func:`fails` of the record, when the caller knows it."""
    if rec.status in (STATUS_PRECISION_LOSS, STATUS_QUANTIZATION_NOISE):  # below any fault
        level, value = 1, rec.err_abs2 if rec.err_abs2 is not None else rec.err_abs
    elif rec.kind == KIND_WEIGHT and WEIGHT_UNREAD_NOTE in (rec.comment or ""):
        # a weight whose difference this input does not read: an input that reads it shows
        # the fault, its consumer failing there (trial 4, finding 07)
        level, value = 1, 0.0
    elif rec.passed2 is False or rec.status == STATUS_ERROR:
        level, value = 2, rec.err_abs2 if rec.err_abs2 is not None else rec.err_abs
    elif fails(rec) if failed is None else failed:
        level, value = 1, rec.err_abs
    else:
        level, value = 0, rec.err_abs
    if value is None:
        return level, -1.0
    return level, math.inf if math.isnan(value) else float(value)


@dataclasses.dataclass
class PairAggregate:
    """One pair over the inputs run so far."""

    worst: Record
    worst_input: int
    severity: tuple[int, float]
    order: tuple[int, int]  # (first input it was seen on, its step there)
    failing: int = 0
    seen: int = 0
    err_sum: float = 0.0
    err_count: int = 0
    # its record on the first input where some pair fails: a pair that passes on every
    # input shows that input, where the values upstream of the failure are (an error
    # made under tolerance is found among them), rather than its largest rounding
    on_failing_input: tuple[Record, int] | None = None

    def add(self, rec: Record, index: int) -> bool:
        """Folds one input's record in; returns whether it fails (:func:`fails`)."""
        self.seen += 1
        failed = fails(rec)
        if failed:
            self.failing += 1
        if rec.err_abs is not None:
            self.err_sum += rec.err_abs  # a NaN makes the mean NaN: it is no number
            self.err_count += 1
        severity = _severity(rec, failed)
        if severity > self.severity:  # ties keep the earlier input
            self.worst, self.worst_input, self.severity = rec, index, severity
        return failed

    def shown(self) -> tuple[Record, int]:
        """The record the views show for this pair, and its input."""
        if self.severity[0] == 0 and self.on_failing_input is not None:
            return self.on_failing_input
        return self.worst, self.worst_input

    def record(self, step: int, name: str | None) -> Record:
        shown, index = self.shown()
        return copy_record(
            shown,
            step=step,
            input_index=index,
            input_name=name,
            inputs_failing=self.failing,
            inputs_total=self.seen,
            err_abs_mean=self.err_sum / self.err_count if self.err_count else None,
        )


def _not_a_file(p: Path) -> str | None:
    """Why the entry ``p`` of an inputs folder is no input file, or None when it is one."""
    try:
        mode = p.stat().st_mode  # follows a link: a link to a regular file is that file
    except OSError as e:
        if p.is_symlink():
            return "a link to nothing (a dataset not fetched yet: dvc pull, git annex get?)"
        return f"unreadable ({type(e).__name__})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def input_files(folder: str | os.PathLike) -> list[Path]:
    """The ``.pt`` files of a folder, in name order: the inputs it holds.  An entry named
    ``*.pt`` that is no regular file (a dangling link, a FIFO, a folder, a device) is
    refused by name, as the same path given alone is: dropping it would run fewer inputs
    than the folder names."""
    path = Path(folder)
    named = sorted(p for p in path.iterdir() if p.suffix == ".pt")
    bad = [(p, why) for p in named if (why := _not_a_file(p)) is not None]
    if bad:
        listed = "; ".join(f"{p.name!r}: {why}" for p, why in bad[:5])
        more = f" (and {len(bad) - 5} more)" if len(bad) > 5 else ""
        raise SbsInputError(
            f"the inputs folder {str(path)!r} holds .pt entries that are no input files: "
            f"{listed}{more}; fetch or remove them"
        )
    files = named
    if not files:
        raise SbsInputError(
            f"the inputs folder {str(path)!r} holds no .pt file: save each input with "
            "torch.save((x, y), 'folder/input_000.pt')"
        )
    return files


def as_inputs(inputs: Any) -> Iterable[Any]:
    """The inputs as an iterable of inputs, checked as far as that can be done without
    running: a list or tuple of inputs, any other iterable (a generator, a
    ``torch.utils.data.DataLoader``), a folder of ``.pt`` files or a
    ``torch.onnx.InputObserver`` (its observed calls, ``source/observed.py``)."""
    if isinstance(inputs, str | os.PathLike):
        if Path(inputs).is_dir():
            return input_files(inputs)
        raise SbsInputError(
            f"inputs={str(inputs)!r} is not a folder: inputs= takes many inputs (a list, a "
            "DataLoader, a folder of .pt files); give one input file as args"
        )
    from .source.observed import is_input_observer, observed_inputs

    if is_input_observer(inputs):  # torch.onnx.InputObserver: one input per stored call
        return observed_inputs(inputs)
    if isinstance(inputs, torch.Tensor | dict):
        raise SbsInputError(
            f"inputs= takes many inputs, and a {type(inputs).__name__} is one: pass "
            "inputs=[(x1,), (x2,)] (or a DataLoader), or give one input as args"
        )
    if not isinstance(inputs, Iterable):
        raise SbsInputError(
            f"inputs= takes an iterable of inputs (a list, a DataLoader, a folder of .pt "
            f"files), got {type(inputs).__name__}"
        )
    if isinstance(inputs, Sequence):
        if len(inputs) == 0:
            raise SbsInputError("inputs= is empty: give at least one input")
        for i, item in enumerate(inputs):
            split_input(item, i)  # every input's kind is checked now
    return inputs


def _name(item: Any) -> str | None:
    return Path(item).name if isinstance(item, str | os.PathLike) else None


class ManyInputsRun(RunContract):
    """A side-by-side run over many inputs: iterate it for one record per pair.

    ``make_run(args, kwargs)`` makes the run over one input (an
    :class:`~onnx_sbs_nb.align.run.AlignedRun`).  The first input's run is made now, so
    that bad inputs and options raise SbsInputError here; a later input that cannot run
    raises SbsInputError naming it when the iteration reaches it.

    After the iteration: ``records`` are the aggregates, ``failing_inputs`` the inputs on
    which some pair fails, ``records_by_input`` each input's records when
    ``keep_records=True``; :meth:`input_records` gives one input's records again (by
    running it again when they were not kept).
    """

    KIND = "many_inputs"
    LABEL = "a torch program against its ONNX export over many inputs"
    APPLIES = PROGRAM_ACTIONS

    def __init__(
        self,
        make_run: RunFactory,
        inputs: Any,
        *,
        keep_records: bool = False,
        on_input: Callable[[int, RunStatus], None] | None = None,
        reuse: ModelReuse | None = None,
        screen: bool | None = None,
    ) -> None:
        self._make_run = make_run
        # screen the inputs after the first (``screen.py``); None: the module's switch
        self.screen = screen
        # what make_run keeps of the model between inputs, when it keeps something
        self.reuse = reuse
        # called after each input with its index and this run's status: a view's progress
        self.on_input = on_input
        self.inputs = as_inputs(inputs)
        self.keep_records = bool(keep_records)
        self.records: list[Record] = []
        self.records_by_input: list[list[Record]] = []
        self.failing_inputs: list[int] = []
        self.input_names: list[str | None] = []
        # onnxruntime sessions each input's run built: none after the first inputs
        self.sessions_by_input: list[int] = []
        # per input: whether the per-node engine ran it (False: the screen passed it)
        self.full_runs: list[bool] = []
        self.status = RunStatus()
        try:
            self.status.extra["inputs_total"] = len(self.inputs)  # type: ignore[arg-type]
        except TypeError:
            pass  # an iterable of unknown length
        self.status.extra["inputs_done"] = 0
        self._stop = threading.Event()
        self._started = False
        self._current: Any = None
        self._iter: Iterator[Any] = iter(self.inputs)
        try:
            first = next(self._iter)
        except StopIteration:
            raise SbsInputError("inputs= holds no input: give at least one") from None
        self.input_names.append(_name(first))
        self._first: Any = self._run_for(first, 0)  # validated here, run when iterated
        # what views read of a run: the same for every input
        self.device = getattr(self._first, "device", None)
        self.options = getattr(self._first, "options", None)
        self.model = getattr(self._first, "model", None)
        self.status.total_onnx_nodes = self._first.status.total_onnx_nodes
        self.status.total_ep_nodes = self._first.status.total_ep_nodes

    def stop(self) -> None:
        """Ends the run after the current node; the inputs run so far are aggregated."""
        self._stop.set()
        run = self._current
        if run is not None:
            run.stop()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def started(self) -> bool:
        """Whether the run was iterated (or is being): a run can be iterated once."""
        return self._started

    def __iter__(self) -> Iterator[Record]:
        if self._started:
            raise RuntimeError("a run can be iterated once; its records are in .records")
        self._started = True
        return self._records()

    # -- the run -------------------------------------------------------------------
    def _run_for(self, item: Any, index: int) -> Any:
        args, kwargs = split_input(item, index)
        try:
            return self._make_run(args, kwargs)
        except SbsInputError as e:
            raise SbsInputError(f"input {index}{_label(_name(item))}: {e}") from None

    def _records(self) -> Iterator[Record]:
        t0 = time.perf_counter()
        status = self.status
        pairs: dict[tuple[Any, ...], PairAggregate] = {}
        # The aggregate is yielded after the last input, so an interrupt or an error on
        # input k would lose every input before it: the inputs done are yielded first,
        # then the interrupt or error goes on to the consumer.
        ended: BaseException | None = None
        try:
            self._fold_all(pairs)
        except SbsMismatchError:
            raise  # exc=True: the first failing pair is the answer
        except KeyboardInterrupt as e:
            status.stopped = True
            ended = e
        except Exception as e:
            ended = e
        yield from self._aggregates(pairs)
        status.extra["failing_inputs"] = list(self.failing_inputs)
        status.elapsed = time.perf_counter() - t0
        status.current = None
        status.finished = True
        if ended is not None:
            raise ended

    def _fold_all(self, pairs: dict[tuple[Any, ...], PairAggregate]) -> None:
        status = self.status
        index = 0
        item_run, self._first = self._first, None
        screen: Any = None
        item: Any = None
        while True:
            found = None
            if item_run is None:  # an input after the first, with a screen
                # the screen binds the input itself: no run is made where it passes
                found = screen.screened_item(item)
                if found is None:
                    item_run = self._run_for(item, index)
                    if screen.binding is None:  # it binds from the run
                        found = screen.screened(item_run)
            self._current = item_run
            first: list[Record] | None = [] if index == 0 and self._screens() else None
            if found is not None:
                self._fold_screened(screen, found, index, pairs)
            else:
                self._fold(item_run, index, pairs, first)
            self.full_runs.append(found is None)
            if (
                first
                and not status.stopped
                and not self._stop.is_set()
                and not any(fails(r) for r in first)
            ):
                from .screen import Screen

                screen = Screen.of_first(item_run, first)
            self.sessions_by_input.append(sessions_built(item_run) if item_run is not None else 0)
            self._current = None
            status.extra["inputs_done"] = index + 1
            item_run = item = None
            if self.on_input is not None:
                self.on_input(index, status)
            if self._stop.is_set() or status.stopped:
                status.stopped = True
                break
            try:
                item = next(self._iter)
            except StopIteration:
                break
            except Exception as e:  # a DataLoader whose dataset raises on this item
                raise InputReadError(
                    f"input {index + 1} could not be read ({type(e).__name__}: {e}); "
                    f"the {index + 1} input(s) before it are kept"
                ) from e
            index += 1
            self.input_names.append(_name(item))
            if screen is None:
                item_run = self._run_for(item, index)

    def _aggregates(self, pairs: dict[tuple[Any, ...], PairAggregate]) -> Iterator[Record]:
        status = self.status
        ordered = sorted(pairs.values(), key=lambda a: a.order)
        for step, agg in enumerate(ordered):
            rec = agg.record(step, self.input_names[agg.shown()[1]])
            self.records.append(rec)
            status.records += 1
            if rec.failed:
                status.failures += 1
            if (
                rec.err_abs is not None
                and rec.status != STATUS_WEIGHT_DIFFERS  # differs by design: no error
                and (status.max_err_name is None or _worse(rec.err_abs, status.max_err_abs))
            ):
                status.max_err_abs = rec.err_abs
                status.max_err_name = rec.onnx_name or rec.ep_name
            yield rec

    def _screens(self) -> bool:
        """Whether this run may screen its inputs after the first (``screen.py``)."""
        if self.keep_records:  # every input's own records are asked for: the engine's
            return False
        if self.screen is not None:
            return self.screen
        from . import screen

        return screen.ENABLED

    def _fold(
        self,
        run: Any,
        index: int,
        pairs: dict[tuple[Any, ...], PairAggregate],
        first: list[Record] | None = None,
    ) -> None:
        """Folds the records of one input's run; ``first`` gets them when given."""
        status = self.status
        kept: list[Record] = []
        seen: list[tuple[PairAggregate, Record]] = []  # until an input fails
        failing = False
        name = self.input_names[index]
        # read once: a Llama's input yields some 400 records, each folded here
        stop, inner, first_failing = self._stop, run.status, not self.failing_inputs
        try:
            for rec in run:
                if stop.is_set():
                    run.stop()
                rec.input_index, rec.input_name = index, name
                key = (rec.kind, rec.ep_name, rec.onnx_name, rec.onnx_id_output)  # pair_key
                agg = pairs.get(key)
                if agg is None:
                    agg = pairs[key] = PairAggregate(rec, index, _severity(rec), (index, rec.step))
                if agg.add(rec, index) and not failing and not rec.drifted:
                    failing = True
                if first_failing:
                    seen.append((agg, rec))
                if self.keep_records:
                    kept.append(rec)
                if first is not None:
                    first.append(rec)
                status.total_onnx_nodes = inner.total_onnx_nodes
                status.done_onnx_nodes = inner.done_onnx_nodes
                status.current = inner.current
        except SbsMismatchError as e:  # exc=True: the first failing pair, on this input
            e.record.input_index, e.record.input_name = index, name
            e.args = (f"input {index}{_label(name)}: {e.args[0] if e.args else ''}",)
            raise
        if run.status.stopped:
            status.stopped = True
        if failing:
            if not self.failing_inputs:
                for agg, rec in seen:
                    agg.on_failing_input = (rec, index)
            self.failing_inputs.append(index)
        if self.keep_records:
            self.records_by_input.append(kept)

    def _fold_screened(
        self, screen: Any, found: Any, index: int, pairs: dict[tuple[Any, ...], PairAggregate]
    ) -> None:
        """Folds an input the screen passed (``screen.py``): every pair passes there, so
        each aggregate takes its error, and a record only where it is the worst so far
        (what :meth:`PairAggregate.add` does with the engine's record, without making
        the ~400 records nobody would see)."""
        name = self.input_names[index]
        errors = found.errors
        if screen.aggregates is None:
            screen.aggregates = [pairs[pair_key(t)] for t in screen.templates]
        for i, (t, agg) in enumerate(zip(screen.templates, screen.aggregates, strict=True)):
            err = errors[i] if i in errors else t.err_abs
            agg.seen += 1
            if err is not None:
                agg.err_sum += err  # a NaN makes the mean NaN, as in add()
                agg.err_count += 1
            severity = (0, -1.0 if err is None else math.inf if math.isnan(err) else float(err))
            if severity > agg.severity:  # ties keep the earlier input
                rec = screen.record(i, found) if i in errors else copy_record(t)
                rec.input_index, rec.input_name = index, name
                agg.worst, agg.worst_input, agg.severity = rec, index, severity
        self.status.done_onnx_nodes = self.status.total_onnx_nodes

    # -- one input, on demand ------------------------------------------------------
    def input_run(self, index: int) -> Any:
        """A new run over input ``index`` alone (not started): for its records, or the
        actions on one node (``run.actions``).  A list of inputs is indexed; another
        iterable (a DataLoader) is iterated again up to it, so it must give the same
        inputs in the same order (no shuffling)."""
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise SbsInputError(f"an input index is an int >= 0, got {index!r}")
        if isinstance(self.inputs, Sequence):
            if index >= len(self.inputs):
                raise SbsInputError(f"input {index} does not exist: there are {len(self.inputs)}")
            return self._run_for(self.inputs[index], index)
        if isinstance(getattr(self.inputs, "sampler", None), torch.utils.data.RandomSampler):
            raise SbsInputError(
                "this DataLoader shuffles: read again, it gives other inputs in another order; "
                "run with shuffle=False, or with keep_records=True to see one input's records"
            )
        it = iter(self.inputs)
        if it is self.inputs:
            raise SbsInputError(
                "these inputs can be read once (an iterator): run again with a list or a "
                "DataLoader, or with keep_records=True, to see one input's records"
            )
        for i, item in enumerate(it):
            if i == index:
                return self._run_for(item, index)
        raise SbsInputError(f"input {index} does not exist: the inputs hold {index} or fewer")

    def node_actions(self, record: Record | None = None) -> Any:
        """The actions of a run over the input where ``record`` is worst (made for it)."""
        index = record.input_index if record is not None else None
        return self.input_run(index if isinstance(index, int) else 0).actions

    def inputs_info(self) -> dict[str, Any] | None:
        return {
            "total": self.status.extra.get("inputs_total"),
            "done": self.status.extra.get("inputs_done", 0),
            "failing": list(self.failing_inputs),
            "names": list(self.input_names),
        }

    def listen_inputs(self, fn: Callable[[int, RunStatus], None]) -> None:
        if self.on_input is None:  # a user's own callback stays
            self.on_input = fn

    def input_records(self, index: int) -> list[Record]:
        """The records of input ``index`` alone, as a run over that input gives them."""
        if self.keep_records and index < len(self.records_by_input):
            return list(self.records_by_input[index])
        run = self.input_run(index)
        name = self.input_names[index] if index < len(self.input_names) else None
        records = list(run)
        for rec in records:
            rec.input_index, rec.input_name = index, name
        return records


def _label(name: str | None) -> str:
    return f" ({name})" if name else ""


def _worse(a: float, b: float) -> bool:
    if math.isnan(b):
        return False
    return math.isnan(a) or a > b


__all__ = [
    "InputReadError",
    "ManyInputsRun",
    "ModelReuse",
    "PairAggregate",
    "copy_record",
    "as_inputs",
    "input_files",
    "pair_key",
    "sessions_built",
]
