"""Where a warm run's time goes, against the floor of issue 13's goal 2 (run alone).

For one tiny Llama, warm (an ExportedProgram already prepared once), with and without
``own_error``, this splits a run into:

* **torch kernels**: every aten/prims op call of the reference side (``OpOverload``);
* **onnxruntime**: every session run of the candidate side, the first run of each node
  (``main``) apart from its rerun on the torch values of its inputs (``own``);
* **the rest**: the engine's own work (scheduling, comparisons, records), the wall time
  of the run minus the two above;

and prints each beside the floor timed in the same process (one eager run plus one
whole-model onnxruntime run, ``bench_engine.FloorRunner``).  The kernels alone set how
much of the 3x budget is left to the rest of the engine.

It also times the onnxruntime sessions that took longest inside the run again, alone,
on the same inputs: the difference is what the two runtimes' thread pools cost each
other when their calls alternate (torch's OpenMP workers keep spinning for a while after
each parallel op, on the cores onnxruntime's workers then need).

The split needs wrappers around the two runtimes' calls (about a microsecond each): the
wall times printed first are from runs without them.  Usage::

    .venv/bin/python benchmarks/bench_budget.py [--models large] [--repeats 10]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_engine import SPECS, FloorRunner, run_ours  # noqa: E402
from benchmarks.common import export_spec, fmt_ratio, fmt_s, print_table  # noqa: E402

VARIANTS = {
    "ours": {"runner": "onnxruntime"},
    "ours_rerun": {"runner": "onnxruntime", "own_error": True},
}
# the loop's methods that rerun candidate nodes on torch inputs (own errors)
OWN_METHODS = ("_run_own_error", "_rerun_stretch")
SLOWEST = 3  # sessions timed again alone


@dataclass
class Split:
    """Seconds and calls summed over ``runs`` instrumented runs (``per_run`` divides)."""

    runs: int = 0
    wall: float = 0.0
    torch: float = 0.0
    ort_main: float = 0.0
    ort_own: float = 0.0
    torch_calls: int = 0
    ort_calls: int = 0
    # per session: [seconds, calls, the last call's arguments, session] inside the run
    sessions: dict[int, list[Any]] = field(default_factory=dict)

    def per_run(self, value: float) -> float:
        return value / max(self.runs, 1)

    @property
    def rest(self) -> float:
        return self.wall - self.torch - self.ort_main - self.ort_own


class _Probe:
    """Wraps torch's op calls, onnxruntime's session runs and the loop's own-error
    methods for the time of a ``with`` block."""

    def __init__(self, split: Split) -> None:
        self.split = split
        self.own_depth = 0
        self._undo: list[tuple[Any, str, Any]] = []

    def _patch(self, owner: Any, name: str, make: Any) -> None:
        original = getattr(owner, name)
        self._undo.append((owner, name, original))
        setattr(owner, name, make(original))

    def __enter__(self) -> _Probe:
        import torch
        from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

        from onnx_sbs_nb.align.engine import loop

        split, clock = self.split, time.perf_counter

        def torch_call(original: Any) -> Any:
            def call(op: Any, *args: Any, **kwargs: Any) -> Any:
                t = clock()
                try:
                    return original(op, *args, **kwargs)
                finally:
                    split.torch += clock() - t
                    split.torch_calls += 1

            return call

        def ort_run(original: Any) -> Any:
            def run(sess: Any, names: Any, feeds: Any, *rest: Any) -> Any:
                t = clock()
                try:
                    return original(sess, names, feeds, *rest)
                finally:
                    dt = clock() - t
                    if self.own_depth:
                        split.ort_own += dt
                    else:
                        split.ort_main += dt
                    split.ort_calls += 1
                    entry = split.sessions.setdefault(id(sess), [0.0, 0, None, sess])
                    entry[0] += dt
                    entry[1] += 1
                    entry[2] = (names, feeds, *rest)

            return run

        def own_method(original: Any) -> Any:
            def method(run: Any, *args: Any, **kwargs: Any) -> Any:
                self.own_depth += 1
                try:
                    return original(run, *args, **kwargs)
                finally:
                    self.own_depth -= 1

            return method

        self._patch(torch._ops.OpOverload, "__call__", torch_call)
        self._patch(ort_c.InferenceSession, "run", ort_run)
        for name in OWN_METHODS:
            self._patch(loop.SideBySideRun, name, own_method)
        return self

    def __exit__(self, *exc: Any) -> None:
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()


def _timed_run(ep: Any, onx: Any, args: tuple, options: dict) -> float:
    gc.collect()
    t = time.perf_counter()
    run_ours(ep, onx, args, options)
    return time.perf_counter() - t


def measure_split(ep: Any, onx: Any, args: tuple, options: dict, repeats: int) -> Split:
    split = Split()
    with _Probe(split):
        for _ in range(repeats):
            split.wall += _timed_run(ep, onx, args, options)
            split.runs += 1
    return split


def alone(split: Split, top: int = SLOWEST, repeats: int = 20) -> Iterator[tuple[float, float]]:
    """(mean seconds per call inside the run, median seconds alone) of the sessions that
    took longest inside the run, each run again on the inputs of its last call."""
    slowest = sorted(split.sessions.values(), key=lambda e: -e[0])[:top]
    for total, calls, call_args, sess in slowest:
        sess.run(*call_args)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            sess.run(*call_args)
            times.append(time.perf_counter() - t)
        yield total / calls, statistics.median(times)


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} us"


def budget_rows(split: Split, floor: float) -> list[list[str]]:
    rows = []
    parts = (
        ("run (instrumented)", split.wall, None),
        ("torch kernels", split.torch, split.torch_calls),
        ("onnxruntime, first runs", split.ort_main, None),
        ("onnxruntime, own-error reruns", split.ort_own, None),
        ("the rest of the engine", split.rest, None),
    )
    for label, seconds, calls in parts:
        per_run = split.per_run(seconds)
        note = f"{calls // max(split.runs, 1)} calls" if calls else ""
        rows.append([label, fmt_s(per_run), fmt_ratio(per_run / floor), note])
    kernels = split.per_run(split.torch + split.ort_main + split.ort_own)
    left = 3 * floor - kernels
    rows.append(
        [
            "left to the rest at 3x the floor",
            fmt_s(max(left, 0.0)),
            fmt_ratio(max(left, 0.0) / floor),
            f"the rest would have to shrink {fmt_ratio(split.per_run(split.rest) / left)}"
            if left > 0
            else "the kernels alone exceed 3x",
        ]
    )
    return rows


def bench(files: Any, repeats: int) -> None:
    ep, onx, args = files.load()
    floor_runner = FloorRunner(files, builds=1)
    for options in VARIANTS.values():
        run_ours(ep, onx, args, options)  # prepares the program, builds every session
        run_ours(ep, onx, args, options)  # ... and the stretches of a second run
    samples = [floor_runner.sample() for _ in range(repeats)]
    eager = min(s[0] for s in samples)
    ort_run = min(s[1] for s in samples)
    floor = eager + ort_run
    print(
        f"\nfloor (min of {repeats}): {fmt_s(floor)} = eager {fmt_s(eager)} + whole-model "
        f"onnxruntime run {fmt_s(ort_run)}"
    )
    for name, options in VARIANTS.items():
        walls = [_timed_run(ep, onx, args, options) for _ in range(repeats)]
        median = statistics.median(walls)
        split = measure_split(ep, onx, args, options, repeats)
        print_table(
            f"{files.spec.label}, {name}, warm: {fmt_s(median)} median without the wrappers "
            f"({fmt_ratio(median / floor)} the floor), {fmt_s(min(walls))} min",
            ["part (per run)", "time", "x floor", "note"],
            budget_rows(split, floor),
        )
        lines = [
            f"  {_us(inside)} a call inside the run, {_us(by_itself)} alone "
            f"({fmt_ratio(inside / by_itself)})"
            for inside, by_itself in alone(split)
        ]
        print("slowest onnxruntime sessions, timed again alone on the same inputs:")
        print("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="large", help=f"comma-separated, from {sorted(SPECS)}")
    p.add_argument("--repeats", type=int, default=10, help="timed runs per measurement")
    p.add_argument("--workdir", help="folder for the exported models (default: a temp folder)")
    p.add_argument("--reuse", action="store_true", help="reuse the exports left in --workdir")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    unknown = [m for m in a.models.split(",") if m not in SPECS]
    if unknown:
        p.error(f"unknown model(s) {unknown}: choose from {sorted(SPECS)}")
    with contextlib.ExitStack() as stack:
        root = (
            Path(a.workdir)
            if a.workdir
            else Path(stack.enter_context(tempfile.TemporaryDirectory()))
        )
        for m in a.models.split(","):
            files = export_spec(SPECS[m], root, reuse=bool(a.reuse and a.workdir))
            bench(files, a.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
