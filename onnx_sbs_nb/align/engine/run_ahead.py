"""The run's performance shortcuts: steps that run ahead of the loop.

A stretch of candidate nodes runs as one onnxruntime session (``stretches.py``), laid out
from what an earlier run of the same model on inputs of the same shapes recorded (this
run records for the next when there is no complete record yet); the torch nodes before a
stretch run as one compiled function (``fx_runs.py``).  Values computed ahead are used as
if their nodes had run one at a time; a shortcut that fails is not tried again and its
nodes run one at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..judge.saturation import held_sources
from ..pairing.pairs import Pairing
from .options import RunOptions
from .plan import Plan, schedule
from .side import ReferenceSide
from .sides import OnnxSide
from .stretches import kept_memo, layout, memo_key, runs_stretches


class RunAhead:
    """The shortcuts of one run: its stretches (or the memo it records) and compiled
    torch runs, and which candidate nodes have their values already."""

    def __init__(
        self,
        reference: ReferenceSide,
        candidate: OnnxSide,
        pairing: Pairing,
        options: RunOptions,
    ) -> None:
        self.reference, self.candidate, self.pairing = reference, candidate, pairing
        self.options = options
        self.layout: Any = None  # the run's stretches, or None
        self.notes: dict[int, str] = {}  # how a stretch's nodes ran, by node
        self.memo: Any = None  # what this run records for the next
        self.ahead: bytearray = bytearray()  # nodes whose values a stretch made
        self.own_done: bytearray = bytearray()  # ... and whose own-error values too
        # reference nodes run as one function, by first plan step, and the last step a
        # run has computed
        self.fx_runs: dict[int, Any] = {}
        self.fx_until = -1

    def start(self, env: dict[str, Any], fed: Callable[[], set[str]], allowed: bool) -> Plan | None:
        """Lays out the stretches recorded by an earlier run of this model on inputs of
        these shapes (``env``: the candidate's inputs), or starts the memo this run
        records; ``fed()``: values the run replaces by torch values (no stretch runs across
        them); ``allowed``: False where the run times nodes or changes the model's values.
        Returns the plan that waits for the stretches, None to keep the run's."""
        self.layout = self.memo = None
        cand, options = self.candidate, self.options
        if not allowed or not runs_stretches(cand.runner):
            return None
        key = memo_key(cand.runner, env)
        if key is None:
            return None
        memo = kept_memo(cand, key)
        if not memo.complete:
            self.memo = memo
            return None
        found = layout(memo, cand, frozenset(fed()))
        if not len(found):
            return None
        self.layout = found
        self.notes = memo.notes
        self.ahead = bytearray(len(cand.nodes))
        self.own_done = bytearray(len(cand.nodes))
        # A stretch's nodes wait together for every torch value any of them reads (its
        # own-error runs are one session too: all their inputs exist when the first
        # runs), and the torch nodes before it run as one function (fx_runs.py).
        ref = self.reference
        # the compiled torch runs hold the devices they move values to (sides.FxSide)
        moved = tuple(ref.device_map.items())
        key = (self.pairing.cache_key, options.needs_torch_inputs, moved)
        plan = found.plans.get(key) if key[0] is not None else None
        if plan is None or plan[0] is not ref.graph:
            units = [(s.first, s.last) for s in found.starting.values()]
            needs = options.needs_torch_inputs
            hold = held_sources(cand.model.graph, self.pairing.by_onnx) if needs else None
            made = schedule(ref.graph, cand.graph, self.pairing, needs, units=units, hold=hold)
            plan = (ref.graph, made, ref.compiled_runs(made))
            if key[0] is not None:
                found.plans[key] = plan
        self.fx_runs = plan[2]
        return plan[1]

    def run_fx(self, s: int, ref_env: dict[str, Any]) -> None:
        """Runs the compiled torch run that starts at plan step ``s``: the steps up to
        :attr:`fx_until` are then computed ahead.  On any failure its nodes run one at a
        time (and the run is not tried again)."""
        run = self.fx_runs[s]
        if run.broken:
            return
        try:
            run.fn(ref_env, self.reference.device)
        except Exception:
            run.broken = True
            return
        self.fx_until = run.last

    def stretch_at(self, idx: int, cand_env: dict[str, Any]) -> Any:
        """Runs the stretch starting at candidate node ``idx`` if any; returns it when its
        values were made (None otherwise)."""
        stretch = self.layout.starting.get(idx) if self.layout is not None else None
        if stretch is None or stretch.broken:
            return None
        cand = self.candidate
        feeds = stretch.feeds(cand_env, cand)
        if feeds is None:
            return None  # an input missing, or not as recorded: one node at a time
        try:
            values = stretch.run(feeds, cand)
        except Exception:
            stretch.broken = True
            return None
        cand_env.update(zip(stretch.outputs, values))
        ahead, notes = self.ahead, self.notes
        for k in range(stretch.first, stretch.last + 1):
            ahead[k] = 1
            if k in notes:  # as one node at a time says how it ran
                for o in cand.graph.outputs[k]:
                    if o:
                        cand.notes[o] = notes[k]
        return stretch

    def is_ahead(self, idx: int) -> bool:
        """Whether candidate node ``idx``'s values were made by a stretch."""
        return self.layout is not None and bool(self.ahead[idx])

    def observe(self, idx: int, inputs: list[Any], outputs: tuple[str, ...], values: Any) -> None:
        """Records a node run alone for the next run's stretches."""
        if self.memo is None:
            return
        cand = self.candidate
        # onnxruntime ran it (checked with exact shapes or not: so does a stretch)
        fn = cand.fn(idx)
        plain = getattr(fn, "elsewhere", None) is False
        note = getattr(fn, "fallback_reason", None)
        self.memo.observe(idx, cand.graph.inputs[idx], inputs, outputs, values, plain, note)

    def finish(self) -> None:
        """A run that saw every node: the next run may use what it recorded."""
        if self.memo is not None:
            self.memo.complete = True


__all__ = ["RunAhead"]
