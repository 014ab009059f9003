"""The one consumer of a run, for the session, the widget and the command line.

:class:`RunConsumer` takes any run kind (``align/contract.py``; any iterable of records
becomes one), appends its records as the run yields them, tells its listeners in
batches (at most every ``batch_interval`` seconds; 0: every record), in the calling
thread or a daemon thread, and makes the summary once the stream ends, whatever the
reason (end, stop, Ctrl-C, error), with the run's own ``summarize``: the session and the
CLI summarize the same way.

Listeners receive ``(event, payload)``: ``"rows"`` ``{"start", "records"}``, ``"status"``
``{"status"}``, ``"finished"`` ``{"status", "summary"}``.  A listener's exception is
printed and the run goes on, unless its type is among ``reraise`` (the CLI's records
file that cannot be written): then the run stops and the exception propagates, as one
of these types raised by the run itself does.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from ..align.blame.summary import Summarizer, Summary
from ..align.contract import Run, as_run
from ..completion import Completion
from ..records import Record

# Values of RunConsumer.state
IDLE = "idle"
RUNNING = "running"
FINISHED = "finished"
STOPPED = "stopped"
FAILED = "error"

Listener = Callable[[str, dict[str, Any]], None]

_S = TypeVar("_S", bound="RunConsumer")


class RunConsumer:
    """Consumes one run into ``records`` and tells the listeners."""

    def __init__(
        self,
        run: Any,
        *,
        background: bool = False,
        batch_interval: float = 0.25,
        reraise: tuple[type[BaseException], ...] = (),
        summary_at_end: bool = True,
    ) -> None:
        if batch_interval < 0:
            raise ValueError(f"batch_interval must be >= 0, got {batch_interval}")
        self.run: Run = as_run(run)
        self.background = bool(background)
        self.batch_interval = float(batch_interval)
        self.reraise = reraise
        # False: the caller summarizes itself (the CLI, from the records file it wrote)
        self.summary_at_end = summary_at_end
        self._lock = threading.RLock()
        self._records: list[Record] = []
        self._listeners: list[Listener] = []
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        self._state = IDLE
        self._error: str | None = None
        self.interrupted = False  # ended by Ctrl-C (KeyboardInterrupt)
        # the Summary once the run ended ({'error': traceback} if summarizing failed)
        self._summary: Summary | dict[str, Any] | None = None
        # fed batch by batch (O(1) a record): the culprit so far while the run goes
        self._so_far = Summarizer()
        self._so_far_n = 0
        self._stop_requested = False
        self._t0: float | None = None
        self._elapsed = 0.0
        # a run over many inputs yields its records at the end: its views learn of its
        # progress after each input
        self.run.listen_inputs(lambda _i, _s: self._notify("status", {"status": self.status}))

    # -------------------------------------------------------------- listeners
    def add_listener(self, fn: Listener) -> None:
        with self._lock:
            self._listeners.append(fn)

    def remove_listener(self, fn: Listener) -> None:
        with self._lock:
            if fn in self._listeners:
                self._listeners.remove(fn)

    def _notify(self, event: str, payload: dict[str, Any]) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for fn in listeners:
            try:
                fn(event, payload)
            except self.reraise:
                raise
            except Exception:  # a broken view must not kill the run
                traceback.print_exc()

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> str:
        return self._state

    @property
    def running(self) -> bool:
        return self._state == RUNNING

    @property
    def finished(self) -> bool:
        """True once the stream ended, whatever the reason."""
        return self._state in (FINISHED, STOPPED, FAILED)

    @property
    def error(self) -> str | None:
        """The traceback of an exception that ended the run, if any."""
        return self._error

    @property
    def records(self) -> list[Record]:
        """A snapshot of the records so far (safe to read while the run goes on)."""
        with self._lock:
            return list(self._records)

    def __len__(self) -> int:
        return len(self._records)

    @property
    def status(self) -> dict[str, Any]:
        """The run's progress (RunStatus fields) plus ``state``, ``error``, ``rows``."""
        d = self.run.status.to_dict()
        with self._lock:
            n = len(self._records)
        if self._t0 is not None:  # wall clock of the whole run, as the user lived it
            d["elapsed"] = (time.perf_counter() - self._t0) if self.running else self._elapsed
        d["state"] = self._state
        d["error"] = self._error
        d["rows"] = n
        if self.finished:
            d["finished"] = True
            d["stopped"] = d.get("stopped") or self._state == STOPPED
        return d

    @property
    def completion(self) -> Completion:
        """How far the run got: finished, stopped (Stop, an interrupt) or incomplete
        (not started, still going, ended by an error)."""
        status = self.run.status
        if self._state == IDLE:
            return Completion.of_run(status, ended=False)
        error = self._error.strip().splitlines()[-1] if self._error else None
        return Completion.of_run(
            status,
            ended=self.finished,
            stopped=self._state == STOPPED,
            error=error if self._state == FAILED else None,
        )

    def summarize(self, records: list[Record] | None = None) -> Summary:
        """The summary of ``records`` (those consumed by default) as far as the run got:
        the one call the session, the widget and the CLI make."""
        return self.run.summarize(self.records if records is None else records, self.completion)

    @property
    def summary(self) -> Summary | dict[str, Any]:
        """The :class:`Summary` (final once the run ended, of the records so far before;
        it reads as its dict too); its verdict is "stopped" or "incomplete" unless the run
        went to its end.  A bug in summarizing leaves ``{"error": traceback}``."""
        if self._summary is not None:
            return self._summary
        return self.summarize()

    def summary_so_far(self) -> Summary:
        """The summary of the records flushed to the views so far (while the run goes:
        its culprit is the culprit so far; its verdict says the run is incomplete)."""
        with self._lock:
            summary = self._so_far.summary()
        summary.completion = self.completion
        return summary

    # ---------------------------------------------------------------- running
    def start(self: _S) -> _S:
        """Start consuming the run: returns at once with ``background=True``, at the
        end of the run otherwise.  Calling it again does nothing."""
        with self._lock:
            if self._state != IDLE:
                return self
            self._state = RUNNING
            self._t0 = time.perf_counter()
        self._notify("status", {"status": self.status})  # views show "running" at once
        if self.background:
            self._thread = threading.Thread(target=self._consume, name="sbs-run", daemon=True)
            self._thread.start()
        else:
            self._consume()
        return self

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run ended (starting it in this thread if not started).
        Returns False on timeout."""
        if self._state == IDLE:
            self.start()
        return self._done.wait(timeout)

    def stop(self) -> None:
        """End the run after the current node; every record is kept.  Thread-safe."""
        self._stop_requested = True
        self.run.stop()

    def _consume(self) -> None:
        state = FINISHED
        sent = 0
        last = time.perf_counter()
        try:
            for rec in self.run:
                with self._lock:
                    self._records.append(rec)
                now = time.perf_counter()
                if now - last >= self.batch_interval:
                    sent = self._flush(sent)
                    last = now
            # the run says whether it left steps undone (a Stop after the last step
            # leaves the run whole)
            if self.run.status.stopped:
                state = STOPPED
        except KeyboardInterrupt:
            # the interrupt is how a busy kernel stops the run: keep what was computed
            self.interrupted = True
            self.stop()
            state = STOPPED
        except self.reraise:
            self.run.stop()
            self._error = traceback.format_exc()
            state = FAILED
            sent = -1  # what failed may be the listener: the rest is not sent again
            raise
        except Exception:
            self._error = traceback.format_exc()
            state = FAILED
        finally:
            self._finish(state, sent)

    def _finish(self, state: str, sent: int) -> None:
        self._elapsed = time.perf_counter() - (self._t0 or time.perf_counter())
        try:
            if sent >= 0:
                self._flush(sent)
        finally:
            self._state = state
            try:
                if self.summary_at_end:
                    self._summary = self.summarize()
            except Exception:
                self._summary = {"error": traceback.format_exc()}
            try:
                # views finish their sync before wait() returns
                self._notify("finished", {"status": self.status, "summary": self._summary})
            finally:
                self._done.set()

    def _flush(self, sent: int) -> int:
        with self._lock:
            batch = self._records[sent:]
            for rec in self._records[self._so_far_n : sent + len(batch)]:
                self._so_far.add(rec)
            self._so_far_n = sent + len(batch)
        if batch:
            self._notify("rows", {"start": sent, "records": batch})
        self._notify("status", {"status": self.status})
        return sent + len(batch)


__all__ = ["FAILED", "FINISHED", "IDLE", "RUNNING", "STOPPED", "Listener", "RunConsumer"]
