"""Runs over many inputs (issue 38, item 1): time for 1, 2, 8 and 32 inputs, the cost of
inputs 2..N against the first, and peak memory over 32 inputs against one.

Each measurement runs in a fresh interpreter (``run_child``): the child loads the
exported Llama from files (not timed), then times ``list(aligned_over_inputs(ep, onx,
inputs))`` over N inputs of the same shape (random token ids), noting when each input
ends.  The first input pays the preparation, the pairing and the sessions; the others
reuse them (``engine/setup_cache.py``, the runners' session caches).  Peak memory is the
resident peak of the child during the run above its resident size before it
(``PeakRss``), for 1 input and for 32.

    .venv/bin/python benchmarks/bench_many_inputs.py [--repeats 2] [--model small|large]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    MB,
    LlamaSpec,
    PeakRss,
    emit_result,
    export_spec,
    fmt_mb,
    fmt_ratio,
    fmt_s,
    median_of,
    model_files,
    print_table,
    ratio,
    run_child,
)

SPECS = {
    "small": LlamaSpec("small", hidden=64, layers=2, seq=12),
    "large": LlamaSpec("large", hidden=256, layers=4, seq=64, intermediate=1024),
}
# 2: the second run builds the sessions of stretches of nodes (README, "Second runs"), a
# one-time cost: from 2 inputs on, memory must stay flat
COUNTS = (1, 2, 8, 32)


def measure(folder: Path, n: int, threads: int) -> dict:
    """Runs ``n`` inputs over the model in ``folder``; times each input's end."""
    import torch

    if threads > 0:
        # the machine may be shared: torch's thread pool spinning against other jobs
        # makes single runs vary tenfold
        torch.set_num_threads(threads)

    from onnx_sbs_nb import aligned_over_inputs

    ep, onx, args = model_files(folder).load()
    g = torch.Generator().manual_seed(0)
    inputs = [(torch.randint(0, 128, args[0].shape, generator=g),) for _ in range(n)]
    ends: list[float] = []
    start = time.perf_counter()
    with PeakRss() as peak:
        run = aligned_over_inputs(
            ep, onx, inputs, on_input=lambda i, s: ends.append(time.perf_counter())
        )
        records = list(run)
    total = time.perf_counter() - start
    first = ends[0] - start
    rest = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {
        "n": n,
        "total": total,
        "first": first,
        "rest_mean": sum(rest) / len(rest) if rest else None,
        "records": len(records),
        "peak_increase": peak.increase,
        "peak": peak.peak,
        "method": peak.method,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=2, help="fresh processes per count")
    p.add_argument("--model", choices=sorted(SPECS), default="small")
    p.add_argument("--workdir", default=None, help="keep the exported model here")
    p.add_argument(
        "--torch-threads", type=int, default=1, help="torch threads in the children (0: torch's)"
    )
    p.add_argument("--child", nargs=3, metavar=("FOLDER", "N", "T"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        emit_result(measure(Path(a.child[0]), int(a.child[1]), int(a.child[2])))
        return
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(a.workdir or tmp)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            files = export_spec(SPECS[a.model], root, reuse=a.workdir is not None)
        results = {
            n: [
                run_child(
                    Path(__file__), ["--child", str(files.folder), str(n), str(a.torch_threads)]
                )
                for _ in range(max(1, a.repeats))
            ]
            for n in COUNTS
        }
    rows = []
    one = median_of(results[1], "total")
    for n in COUNTS:
        total = median_of(results[n], "total")
        first = median_of(results[n], "first")
        rest = median_of(results[n], "rest_mean") if n > 1 else None
        rows.append(
            [
                n,
                fmt_s(total),
                fmt_s(total / n),
                fmt_ratio(ratio(total, one)),
                fmt_s(first),
                fmt_s(rest),
                fmt_ratio(ratio(rest, first)),
            ]
        )
    print_table(
        f"time over N inputs: {SPECS[a.model].label}, median of {a.repeats} fresh processes, "
        f"{a.torch_threads or 'default'} torch thread(s)",
        [
            "N",
            "total",
            "per input",
            "total / N=1",
            "first input",
            "each later input",
            "later / first",
        ],
        rows,
    )
    mem_rows = []
    one_inc = median_of(results[1], "peak_increase")
    one_peak = median_of(results[1], "peak")
    for n in COUNTS:
        inc = median_of(results[n], "peak_increase")
        peak = median_of(results[n], "peak")
        mem_rows.append(
            [
                n,
                fmt_mb(inc),
                fmt_ratio(ratio(inc, one_inc)),
                fmt_mb(peak),
                fmt_ratio(ratio(peak, one_peak)),
            ]
        )
    method = results[1][0]["method"]
    print_table(
        f"peak resident memory during the run ({method}), median of {a.repeats}",
        ["N", "peak increase", "vs N=1", "peak (process)", "vs N=1"],
        mem_rows,
    )
    rest32 = median_of(results[32], "rest_mean")
    first32 = median_of(results[32], "first")
    inc32 = median_of(results[32], "peak_increase")
    print(
        f"\nlater inputs cost {fmt_ratio(ratio(rest32, first32))} of the first (target <= 0.5x); "
        f"peak increase over 32 inputs is {fmt_ratio(ratio(inc32, one_inc))} of one input's "
        f"({inc32 / MB:.1f} vs {one_inc / MB:.1f} MB; target <= 1.2x), "
        f"{fmt_ratio(ratio(inc32, median_of(results[2], 'peak_increase')))} of two inputs'"
    )


if __name__ == "__main__":
    main()
