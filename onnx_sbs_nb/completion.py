"""How far a run got, which bounds what its summary may claim.

A run that was stopped (the widget's Stop, Ctrl-C), that ended early (an error, a
killed process) or that is still going compared only part of the model: its verdict is
``stopped`` or ``incomplete``, never ``pass``.  A :class:`Completion` travels with the
summary into every view and report file, and comes back from a records file (the
``.jsonl`` trailer, the CSV's ``run_*`` columns, the xlsx ``run`` sheet).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FINISHED = "finished"
STOPPED = "stopped"
INCOMPLETE = "incomplete"
STATES = (FINISHED, STOPPED, INCOMPLETE)


STOPPED_BEFORE_END = "stopped before the end"


@dataclass(frozen=True)
class Completion:
    """``state`` (finished, stopped, incomplete), ONNX nodes run of how many, and why."""

    state: str = FINISHED
    nodes_done: int | None = None
    nodes_total: int | None = None
    reason: str | None = None  # why the run did not reach its end, in words

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"Completion.state must be one of {STATES}, got {self.state!r}")
        for name in ("nodes_done", "nodes_total"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"Completion.{name} must be an int >= 0 or None, got {v!r}")
        if self.reason is not None and not isinstance(self.reason, str):
            raise ValueError(f"Completion.reason must be a string, got {self.reason!r}")

    @property
    def finished(self) -> bool:
        return self.state == FINISHED

    @property
    def nodes(self) -> str:
        """``"300 of 1002 ONNX nodes"`` (what is known of it)."""
        done, total = self.nodes_done, self.nodes_total
        if done is not None and total is not None:
            return f"{done} of {total} ONNX nodes"
        if total is not None:
            return f"? of {total} ONNX nodes"
        if done is not None:
            return f"{done} ONNX nodes"
        return ""

    @classmethod
    def of_run(
        cls,
        status: Any,
        *,
        ended: bool,
        stopped: bool = False,
        error: str | None = None,
    ) -> Completion:
        """From a run's RunStatus (or its dict, or None) and what its consumer saw.

        ``ended``: the stream was consumed to its end or left (stop, error);
        ``stopped``: the user stopped it; ``error``: the exception that ended it.
        """
        if isinstance(status, Mapping):
            get = status.get
        else:

            def get(key: str, default: Any = None) -> Any:
                return getattr(status, key, default)

        total = get("total_onnx_nodes") or None
        done = get("done_onnx_nodes") if total is not None else None
        stopped = stopped or bool(get("stopped", False))
        inputs = _inputs_done(get("extra"))
        if error:
            where = f" after {inputs}" if inputs else ""
            return cls(INCOMPLETE, done, total, f"the run ended with an error{where}: {error}")
        if stopped:
            return cls(
                STOPPED, done, total, f"stopped after {inputs}" if inputs else STOPPED_BEFORE_END
            )
        if not ended:
            return cls(INCOMPLETE, done, total, "the run is still going")
        if total is not None and done is not None and done < total:
            return cls(INCOMPLETE, done, total, "the run ended before the last node")
        return cls(FINISHED, done, total)

    def to_dict(self) -> dict[str, Any]:
        return {
            "state": self.state,
            "nodes_done": self.nodes_done,
            "nodes_total": self.nodes_total,
            "reason": self.reason,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Completion:
        """From :meth:`to_dict` (ValueError for anything else: a file is untrusted)."""
        if not isinstance(d, Mapping):
            raise ValueError(f"a run's completion must be an object, got {type(d).__name__}")
        unknown = set(d) - {"state", "nodes_done", "nodes_total", "reason"}
        if unknown:
            raise ValueError(f"unknown completion keys {sorted(unknown)}")
        return cls(
            state=d.get("state", FINISHED),
            nodes_done=d.get("nodes_done"),
            nodes_total=d.get("nodes_total"),
            reason=d.get("reason"),
        )


__all__ = ["FINISHED", "INCOMPLETE", "STATES", "STOPPED", "Completion"]


def _inputs_done(extra: Any) -> str | None:
    """ "11,212 of 100,000 inputs" for a run over many inputs, else None."""
    if not isinstance(extra, Mapping) or not isinstance(extra.get("inputs_done"), int):
        return None
    total = extra.get("inputs_total")
    of = f" of {total:,}" if isinstance(total, int) else ""
    return f"{extra['inputs_done']:,}{of} inputs"
