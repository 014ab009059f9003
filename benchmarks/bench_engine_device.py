"""The engine on one device (CUDA, where the floor of bench_engine.py has no onnxruntime
run to add): ``run_aligned`` warm on the same program, with and without own errors,
against one eager run of the program on the same device.

    python benchmarks/bench_engine_device.py --device cuda     # scripts/gpu_check.sh runs it

The program is exported on the CPU and run where the inputs are, as a user does; the
eager baseline is the same program moved with torch.export's ``move_to_device_pass``.
The ONNX side runs with the torch evaluator (``runner="torch"``): onnxruntime needs a GPU
build for CUDA, and the engine uses the evaluator without one.  Ratios, not times, are the
result: each is taken to the eager time measured in the same process.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.common import fmt_ratio, print_table

# (hidden, layers, seq, intermediate): the two sizes of Llama
SIZES = ((256, 4, 64, 1024), (1024, 8, 256, None))


def _timed(fn: Callable[[], Any], device: str, runs: int) -> tuple[float, float]:
    """(median, min) seconds of ``runs`` calls, each ended by a device synchronisation."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    times = []
    for _ in range(runs):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def measure(size: tuple, device: str, runs: int) -> list[list[Any]]:
    """Rows of the table for one model size."""
    from torch.export.passes import move_to_device_pass

    from onnx_sbs_nb.align.run import AlignedRun
    from tests.models import tiny_llama

    hidden, layers, seq, inter = size
    ep, onx, args = tiny_llama(hidden, layers, seq, inter)
    on_device = tuple(a.to(device) for a in args)
    module = move_to_device_pass(ep, device).module()
    with torch.no_grad():
        for _ in range(5):
            module(*on_device)
        eager, _ = _timed(lambda: module(*on_device), device, 3 * runs)
    rows = []
    for own in (False, True):

        def run(own: bool = own) -> list[Any]:
            return list(AlignedRun(ep, onx, on_device, runner="torch", own_error=own))

        cold, _ = _timed(run, device, 1)
        records = run()
        warm, best = _timed(run, device, runs)
        failing = sum(1 for r in records if r.failed)
        rows.append(
            [
                f"h{hidden} L{layers} s{seq}",
                "own errors" if own else "-",
                f"{eager * 1e3:.2f} ms",
                f"{cold * 1e3:.1f} ms",
                f"{warm * 1e3:.2f} ms",
                fmt_ratio(warm / eager),
                fmt_ratio(best / eager),
                len(records),
                failing,
            ]
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    p.add_argument("--runs", type=int, default=10, help="timed warm runs per variant")
    p.add_argument("--small", action="store_true", help="one tiny Llama (a smoke test)")
    a = p.parse_args(argv)
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible to torch: use --device cpu", file=sys.stderr)
        return 2
    sizes = ((32, 1, 4, None),) if a.small else SIZES
    warnings.simplefilter("ignore")
    rows = [row for size in sizes for row in measure(size, a.device, a.runs)]
    print_table(
        f"run_aligned on {a.device}, warm, against eager torch there (median; min/eager)",
        ["model", "variant", "eager", "ours cold", "ours warm", "warm/eager", "min/eager",
         "records", "failing"],
        rows,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
