"""Warm runs against the floor (issue 50), on a quiet machine and under load.

Issue 50's goals, on the 4-layer tiny Llama: a warm ``run_aligned`` (an ExportedProgram
already prepared once, the same ModelProto) costs at most 2x the floor (one eager run
plus one whole-model onnxruntime run, ``bench_engine.FloorRunner``), and at most 3x with
own errors (``own_error=True``: each node rerun on the torch values of its inputs).

A warm run here is the third of its kind or later (the second builds the stretches'
onnxruntime sessions and torch functions).  Each round samples the floor, then times one
warm run of each variant; a ratio is taken
to the floor of its own round (median over rounds), and min / min beside it.  The rounds
run twice: as the machine is, then with ``--load`` busy processes (``while 1: pass``)
started beside them, the way a shared 2-core machine often is; both are printed.
Contention only adds time, so on a busy machine the min / min ratio is the better
estimate of the engine's own cost.  Usage::

    .venv/bin/python benchmarks/bench_warm.py [--rounds 7] [--load 2] [--workdir DIR --reuse]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_engine import LARGE, FloorRunner, run_ours  # noqa: E402
from benchmarks.common import ModelFiles, export_spec, fmt_ratio, fmt_s, print_table  # noqa: E402

# variant -> (AlignedRun options, issue 50's goal as a multiple of the floor)
VARIANTS = {
    "ours": ({"runner": "onnxruntime"}, 2.0),
    "ours_rerun": ({"runner": "onnxruntime", "own_error": True}, 3.0),
}


@dataclass
class Rounds:
    """Per round: the floor and each variant's warm time (seconds)."""

    floor: list[float] = field(default_factory=list)
    warm: dict[str, list[float]] = field(default_factory=lambda: {n: [] for n in VARIANTS})

    def ratio_median(self, name: str) -> float:
        return statistics.median(t / f for t, f in zip(self.warm[name], self.floor, strict=True))

    def ratio_min(self, name: str) -> float:
        return min(self.warm[name]) / min(self.floor)


def measure(files: ModelFiles, floor: FloorRunner, rounds: int) -> Rounds:
    ep, onx, args = files.load()
    for options, _ in VARIANTS.values():
        # the first run prepares the program, the second builds the stretches' sessions
        # (stretches.py, fx_runs.py): from the third on, a run is what a rerun costs
        for _ in range(2):
            run_ours(ep, onx, args, options)
    out = Rounds()
    for _ in range(rounds):
        eager, ort_run = floor.sample()
        out.floor.append(eager + ort_run)
        for name, (options, _) in VARIANTS.items():
            t = time.perf_counter()
            run_ours(ep, onx, args, options)
            out.warm[name].append(time.perf_counter() - t)
    return out


@contextlib.contextmanager
def busy(n: int) -> Iterator[None]:
    """``n`` processes spinning on a core each for the time of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]
    try:
        time.sleep(0.5)  # they are running before the first round
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def report(quiet: Rounds, loaded: Rounds | None, load: int) -> None:
    rows = []
    for label, r in (("quiet", quiet), (f"{load} busy processes", loaded)):
        if r is None:
            continue
        for name, (_, goal) in VARIANTS.items():
            rows.append(
                [
                    label,
                    name,
                    f"{fmt_s(statistics.median(r.floor))} / {fmt_s(min(r.floor))}",
                    f"{fmt_s(statistics.median(r.warm[name]))} / {fmt_s(min(r.warm[name]))}",
                    fmt_ratio(r.ratio_median(name)),
                    fmt_ratio(r.ratio_min(name)),
                    f"<= {goal:g}x",
                ]
            )
    print_table(
        "Warm runs against the floor (median / min; ratio: median per round, and min / min)",
        ["machine", "variant", "floor", "warm", "warm/floor (med)", "min/min", "goal"],
        rows,
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=7, help="rounds per machine state")
    p.add_argument("--load", type=int, default=2, help="busy processes for the loaded rounds")
    p.add_argument("--workdir", help="folder for the exported model (default: a temp folder)")
    p.add_argument("--reuse", action="store_true", help="reuse the export left in --workdir")
    p.add_argument("--torch-threads", type=int, help="torch.set_num_threads(N)")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    import torch

    if a.torch_threads:
        torch.set_num_threads(a.torch_threads)
    with contextlib.ExitStack() as stack:
        root = a.workdir or stack.enter_context(tempfile.TemporaryDirectory(prefix="sbs_warm_"))
        files = export_spec(LARGE, Path(root), reuse=bool(a.reuse and a.workdir))
        print(f"{LARGE.label}, torch intra-op threads: {torch.get_num_threads()}", flush=True)
        floor = FloorRunner(files, builds=2)
        quiet = measure(files, floor, a.rounds)
        loaded = None
        if a.load > 0:
            with busy(a.load):
                loaded = measure(files, floor, a.rounds)
        report(quiet, loaded, a.load)
    return 0


if __name__ == "__main__":
    sys.exit(main())
