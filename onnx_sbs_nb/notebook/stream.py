"""How a session consumes its run: records appended as the run yields them, sent to the
views in batches (at most every ``batch_interval`` seconds), in the calling thread or a
daemon thread, and the summary made once the stream ends, whatever the reason.

:class:`RunConsumer` is the part of :class:`~onnx_sbs_nb.notebook.session.SbsSession` that does
this; the session sets the attributes it reads (``run``, ``background``,
``batch_interval``, ``options`` and the state made by ``SbsSession._init``).
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..align.blame.summary import Summarizer, Summary, summarize
from ..records import Record

# Values of SbsSession.state
IDLE = "idle"
RUNNING = "running"
FINISHED = "finished"
STOPPED = "stopped"
FAILED = "error"

Listener = Callable[[str, dict[str, Any]], None]

_S = TypeVar("_S", bound="RunConsumer")


class RunConsumer:
    """Consumes ``self.run`` into ``self._records`` and tells the listeners (the session
    gives ``status``, ``records`` and ``completion``)."""

    run: Any
    background: bool
    batch_interval: float
    options: Any
    _lock: threading.RLock
    _records: list[Record]
    _listeners: list[Listener]
    _thread: threading.Thread | None
    _done: threading.Event
    _state: str
    _error: str | None
    _summary: Summary | dict[str, Any] | None
    _so_far: Summarizer
    _so_far_n: int
    _stop_requested: bool
    _t0: float | None
    _elapsed: float

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
            except Exception:  # a broken view must not kill the run
                traceback.print_exc()

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

    def _consume(self) -> None:
        state = FINISHED
        sent = 0
        last = time.perf_counter()
        try:
            it: Iterator[Record] = iter(self.run)
            for rec in it:
                with self._lock:
                    self._records.append(rec)
                now = time.perf_counter()
                if now - last >= self.batch_interval:
                    sent = self._flush(sent)
                    last = now
                if self._stop_requested and not hasattr(self.run, "stop"):
                    break  # a plain iterable cannot be told to stop: leave it here
            run_status = getattr(self.run, "status", None)
            if run_status is not None and hasattr(self.run, "stop"):
                # the engine says whether it left steps undone (a Stop after the last
                # step leaves the run whole)
                stopped = bool(getattr(run_status, "stopped", False))
            else:
                stopped = self._stop_requested
            if stopped:
                state = STOPPED
        except KeyboardInterrupt:
            # the interrupt is how a busy kernel stops the run: keep what was computed
            self._stop_requested = True
            self._stop_run()
            state = STOPPED
        except Exception:
            self._error = traceback.format_exc()
            state = FAILED
        finally:
            self._elapsed = time.perf_counter() - (self._t0 or time.perf_counter())
            self._flush(sent)
            self._state = state
            try:
                self._summary = summarize(
                    self.records, completion=self.completion, strict=self.options.strict
                )
            except Exception:
                self._summary = {"error": traceback.format_exc()}
            try:
                # views finish their sync before wait() returns
                self._notify("finished", {"status": self.status, "summary": self._summary})
            finally:
                self._done.set()

    def summary_so_far(self) -> Summary:
        """The summary of the records flushed to the views so far (while the run goes:
        its culprit is the culprit so far; its verdict says the run is incomplete)."""
        with self._lock:
            summary = self._so_far.summary()
        summary.completion = self.completion
        return summary

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

    def _stop_run(self) -> None:
        stop = getattr(self.run, "stop", None)
        if callable(stop):
            stop()


__all__ = ["FAILED", "FINISHED", "IDLE", "RUNNING", "STOPPED", "Listener", "RunConsumer"]
