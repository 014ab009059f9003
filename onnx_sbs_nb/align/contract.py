"""The one contract every run kind keeps, so that views never ask which kind they hold.

A run (:class:`Run`) is its records as a stream (iterate it once), a ``status`` (a
:class:`~onnx_sbs_nb.records.RunStatus` any view reads while it goes), ``stop()``, its
``summarize()`` (one call, the same for the session, the widget and the CLI), and the
actions that apply to it: each kind declares them in ``APPLIES`` and says why the others
do not (:meth:`RunContract.why_not`).  What the views need beyond that (the model, the
device, the inputs of a run over many of them, a kind's label) are declared here with
defaults, so a kind overrides what it has and inherits the rest.

:class:`RunContract` is the base a stream kind adds after its engine class
(``class AlignedRun(SideBySideRun, RunContract)``: the engine's attributes win);
:class:`AnswerContract` the base of a kind that answers at once (the optimizer bisection,
the precision advice); :class:`RecordStream` is the iterator the public functions
return, holding the run as ``.run``; :func:`as_run` makes any iterable of records a run
(``SbsSession.from_run``).  The registry of kinds is ``kinds.py``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, ClassVar, Protocol, runtime_checkable

from ..completion import Completion
from ..errors import SbsInputError
from ..records import FAILING_STATUSES, Record, RunStatus
from .blame.summary import Summary, summarize
from .engine.options import RunOptions

# The actions a view may ask of a run (the session's ACTIONS hold the buttons among them)
STOP = "stop"
DEVICE = "device"
RERUN = "rerun"  # one ONNX node again in the torch evaluator
SAVE_REPLAY = "save_replay"  # one node's replay bundle
SAVE_CULPRIT = "save_culprit"  # the culprit's replay bundle, replayed
NODE_DETAIL = "node_detail"  # ONNX op, attributes, pairing, fx target, stack trace
EXPORT = "export"  # the records as one HTML report
NODE_DATA = "save_node_data"  # per-node errors for Model Explorer

ALL_ACTIONS = (STOP, DEVICE, RERUN, SAVE_REPLAY, SAVE_CULPRIT, NODE_DETAIL, EXPORT, NODE_DATA)
# the actions on a torch program against its ONNX export (its nodes rerun in torch)
PROGRAM_ACTIONS = frozenset(ALL_ACTIONS)
# the actions on any stream of records over an ONNX model
MODEL_ACTIONS = frozenset((STOP, EXPORT, NODE_DATA))


@runtime_checkable
class Run(Protocol):
    """What every run kind is (``kinds.RUN_KINDS``), read by every view."""

    KIND: ClassVar[str]  # the registry name
    LABEL: ClassVar[str]  # what views call this kind
    APPLIES: ClassVar[frozenset[str]]  # the actions of ALL_ACTIONS that apply
    options: RunOptions
    status: RunStatus
    records: list[Record]
    model: Any  # the ONNX model the records name (candidate side), or None
    deployment: Any  # the optimized graph onnxruntime ran (optimize=), or None
    device: str | None

    def __iter__(self) -> Iterator[Record]: ...

    def stop(self) -> None: ...

    @property
    def started(self) -> bool: ...

    @property
    def title(self) -> str: ...

    def summarize(
        self, records: list[Record] | None = None, completion: Completion | None = None
    ) -> Summary: ...

    def why_not(self, action: str) -> str | None: ...

    def node_actions(self, record: Record | None = None) -> Any: ...

    def inputs_info(self) -> dict[str, Any] | None: ...

    def input_records(self, index: int) -> list[Record]: ...

    def input_run(self, index: int) -> Any: ...

    def listen_inputs(self, fn: Callable[[int, RunStatus], None]) -> None: ...

    def answer(self) -> str | None: ...

    def timeline(self, decode: Callable[[int], str] | None = None) -> dict[str, Any] | None: ...


class RunContract:
    """The defaults of :class:`Run`: a kind declares ``KIND``, ``LABEL``, ``APPLIES``
    and overrides the methods it has more to say in.  Plain class attributes, so the
    engine's own attributes (set in ``__init__``) win."""

    KIND: ClassVar[str] = "records"
    LABEL: ClassVar[str] = "records"
    APPLIES: ClassVar[frozenset[str]] = frozenset((STOP, EXPORT))
    # why an action outside APPLIES does not apply, in the words of a disabled button
    NOT_HERE: ClassVar[str] = "it needs a torch program against its ONNX export (run_aligned)"
    options: RunOptions = RunOptions()
    model: Any = None
    deployment: Any = None
    device: str | None = None

    @property
    def title(self) -> str:
        """The run's title in reports and views."""
        return f"onnx-sbs: {self.LABEL}"

    def summarize(
        self, records: list[Record] | None = None, completion: Completion | None = None
    ) -> Summary:
        """The summary of ``records`` (the run's own by default): the one call of every
        consumer, with the model's node inputs (the shape-origin blame reads them)."""
        model = self.model
        return summarize(
            self.records if records is None else records,
            node_inputs=model if hasattr(model, "graph") else None,
            completion=completion,
            strict=bool(self.options.strict),
        )

    def why_not(self, action: str) -> str | None:
        """None when ``action`` applies to this run, else why not (a button's tooltip)."""
        if action in self.APPLIES:
            if action == NODE_DATA and self.model is None:
                return "Model Explorer's node data needs the run's ONNX model"
            return None
        if action not in ALL_ACTIONS:
            return f"unknown action {action!r}"
        return f"{action} does not apply to {self.LABEL}: {self.NOT_HERE}"

    def node_actions(self, record: Record | None = None) -> Any:
        """The post-run actions (``post/actions.RunActions``) for ``record``'s node;
        SbsInputError where this kind has none."""
        raise SbsInputError(self.why_not(RERUN) or f"{self.LABEL} has no node actions")

    def inputs_info(self) -> dict[str, Any] | None:
        """Over many inputs ``{"total", "done", "failing", "names"}``; None over one."""
        return None

    def input_records(self, index: int) -> list[Record]:
        raise SbsInputError("this run is over one input")

    def input_run(self, index: int) -> Any:
        """Over many inputs, a new run over input ``index`` alone (not started)."""
        raise SbsInputError("this run is over one input")

    def listen_inputs(self, fn: Callable[[int, RunStatus], None]) -> None:
        """Called after each input of a run over many (their views' progress)."""

    def answer(self) -> str | None:
        """The one-sentence answer of a kind that answers (bisection, advice)."""
        return None

    def timeline(self, decode: Callable[[int], str] | None = None) -> dict[str, Any] | None:
        """Two sides' sequences step by step, where they part and why (the generation
        parity's token streams, ``align/generation_timeline.py``), as plain data a view
        draws; None for a kind that has none.  ``decode``: a token id's text."""
        return None


class AnswerContract(RunContract):
    """A kind that answers at once (its work is done when it returns): its records, if
    it has any, stream from the list it holds; ``status`` says it finished."""

    APPLIES: ClassVar[frozenset[str]] = frozenset((EXPORT,))
    NOT_HERE = "it answers at once, with no node of a run to act on"
    records: list[Record]
    message: str

    def __iter__(self) -> Iterator[Record]:
        return iter(list(self.records))

    def stop(self) -> None:
        """Nothing to stop: the answer is whole."""

    @property
    def started(self) -> bool:
        return True

    @property
    def status(self) -> RunStatus:
        status = status_of(self.records)
        status.finished = True
        status.extra["answer"] = self.answer()
        return status

    def answer(self) -> str | None:
        return self.message

    def to_text(self) -> str:
        """What a terminal prints: the answer (a kind with more to say overrides it)."""
        return self.answer() or ""

    def __str__(self) -> str:
        # print(advice) reads as the command line's text, not as the dataclass's repr
        return self.to_text()


def status_of(records: list[Record]) -> RunStatus:
    """A RunStatus derived from records alone (a run that keeps none of its own)."""
    status = RunStatus(records=len(records))
    status.failures = sum(1 for r in records if r.status in FAILING_STATUSES)
    finite = [r for r in records if isinstance(r.err_abs, float) and math.isfinite(r.err_abs)]
    if finite:
        worst = max(finite, key=lambda r: r.err_abs)
        status.max_err_abs = worst.err_abs
        status.max_err_name = worst.onnx_name or worst.ep_name
    return status


class RecordsRun(RunContract):
    """Any iterable of records as a run (a generator, a list, records read back): the
    status is derived from the records as they come; ``stop()`` leaves the iterable
    where it is."""

    NOT_HERE = "it holds records, not the run that made them"

    def __init__(self, records: Iterable[Record]) -> None:
        self._source = records
        self.records: list[Record] = []
        self.status = RunStatus()
        self._stop = False
        self._started = False

    def __iter__(self) -> Iterator[Record]:
        self._started = True
        for rec in self._source:
            self.records.append(rec)
            self.status = status_of(self.records)
            yield rec
            if self._stop:
                self.status.stopped = True
                return
        self.status.finished = True

    def stop(self) -> None:
        self._stop = True

    @property
    def started(self) -> bool:
        return self._started


class RecordStream(Iterator[Record]):
    """What the public run functions return: the records as they come, and the run that
    makes them (``.run``); it keeps the contract by asking its run."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self._records: Iterator[Record] | None = None  # made on the first record

    def __next__(self) -> Record:
        if self._records is None:
            self._records = iter(self.run)
        return next(self._records)

    # the contract, the run's
    KIND = property(lambda self: self.run.KIND)
    LABEL = property(lambda self: self.run.LABEL)
    APPLIES = property(lambda self: self.run.APPLIES)
    options = property(lambda self: self.run.options)
    status = property(lambda self: self.run.status)
    records = property(lambda self: self.run.records, doc="The records yielded so far.")
    model = property(lambda self: self.run.model)
    deployment = property(lambda self: self.run.deployment)
    device = property(lambda self: self.run.device)
    started = property(lambda self: self._records is not None or self.run.started)
    title = property(lambda self: self.run.title)

    def stop(self) -> None:
        self.run.stop()

    def summarize(
        self, records: list[Record] | None = None, completion: Completion | None = None
    ) -> Summary:
        return self.run.summarize(records, completion)

    def why_not(self, action: str) -> str | None:
        return self.run.why_not(action)

    def node_actions(self, record: Record | None = None) -> Any:
        return self.run.node_actions(record)

    def inputs_info(self) -> dict[str, Any] | None:
        return self.run.inputs_info()

    def input_records(self, index: int) -> list[Record]:
        return self.run.input_records(index)

    def input_run(self, index: int) -> Any:
        return self.run.input_run(index)

    def listen_inputs(self, fn: Callable[[int, RunStatus], None]) -> None:
        self.run.listen_inputs(fn)

    def answer(self) -> str | None:
        return self.run.answer()

    def timeline(self, decode: Callable[[int], str] | None = None) -> dict[str, Any] | None:
        return self.run.timeline(decode)


def as_run(given: Any) -> Run:
    """``given`` as a run: a run kind or a RecordStream as it is, any other iterable of
    records wrapped (:class:`RecordsRun`)."""
    if isinstance(given, RunContract | RecordStream):
        return given  # type: ignore[return-value]
    if not isinstance(given, Iterable):
        raise SbsInputError(f"expected a run or records, got {type(given).__name__}")
    return RecordsRun(given)


__all__ = [
    "ALL_ACTIONS",
    "AnswerContract",
    "MODEL_ACTIONS",
    "PROGRAM_ACTIONS",
    "RecordStream",
    "RecordsRun",
    "Run",
    "RunContract",
    "as_run",
    "status_of",
]
