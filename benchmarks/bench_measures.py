"""Benchmark: the cost of the measures (cosine, SNR, L2, p50/p99 of |diff|, ulps) against
the comparison without them (``measures=False``: today's comparison), in the same process.

    python benchmarks/bench_measures.py [--repeat 5] [--quick]

1. ``diff.compare`` on float32 values that differ (the case the measures cost something:
   identical values are answered by a byte comparison either way), per size, with the C
   module and with the numpy fallback.
2. Whole runs (``run_aligned``) of a tiny Llama and of a wider one, warm, median of
   ``--repeat`` runs each, measures on and off interleaved.
Ratios are measures-on over measures-off: 1.00 means free.
"""

from __future__ import annotations

import argparse
import statistics
import time
import timeit
import warnings

import numpy as np
import torch

from benchmarks.common import print_table  # noqa: F401  (puts the checkout on sys.path)
from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.compare import diff
from onnx_sbs_nb.compare.verdict_policy import make_judge

OFF = make_judge(None, None, measures=False)


def _time_pair(e: torch.Tensor, g: np.ndarray, reps: int) -> tuple[float, float]:
    """Seconds for ``reps`` comparisons without and with the measures (best of 5)."""
    off = min(timeit.repeat(lambda: diff.compare(e, g, judge=OFF), number=reps, repeat=5))
    on = min(timeit.repeat(lambda: diff.compare(e, g), number=reps, repeat=5))
    return off, on


def bench_compare(sizes: list[int], number: int) -> list[list[str]]:
    rows = []
    rng = np.random.default_rng(0)
    native = diff.NATIVE
    for path in ("C module", "numpy") if native is not None else ("numpy",):
        diff.NATIVE = native if path == "C module" else None
        try:
            for n in sizes:
                e = rng.standard_normal(n).astype(np.float32)
                g = e + rng.standard_normal(n).astype(np.float32) * np.float32(1e-5)
                reps = max(3, number * 4096 // max(n, 4096))
                t_off, t_on = _time_pair(torch.from_numpy(e), g, reps)
                rows.append(
                    [
                        path,
                        f"{n:,}",
                        f"{t_off / reps * 1e6:.1f}",
                        f"{t_on / reps * 1e6:.1f}",
                        f"{t_on / t_off:.2f}",
                    ]
                )
        finally:
            diff.NATIVE = native
    return rows


def _run(ep, onx, args, measures: bool) -> float:
    t = time.perf_counter()
    n = sum(1 for _ in run_aligned(ep, onx, args, measures=measures))
    assert n > 0
    return time.perf_counter() - t


def bench_runs(models: list[tuple[str, tuple]], repeat: int) -> list[list[str]]:
    rows = []
    for label, (ep, onx, args) in models:
        _run(ep, onx, args, True)  # warm: sessions, caches
        _run(ep, onx, args, False)
        on, off = [], []
        for _ in range(repeat):  # interleaved: the machine's load moves both alike
            off.append(_run(ep, onx, args, False))
            on.append(_run(ep, onx, args, True))
        m_on, m_off = statistics.median(on), statistics.median(off)
        rows.append([label, f"{m_off * 1e3:.1f}", f"{m_on * 1e3:.1f}", f"{m_on / m_off:.2f}"])
    return rows


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--quick", action="store_true", help="small sizes and one model")
    a = p.parse_args(argv)
    sizes = [64, 4096, 65536] if a.quick else [64, 4096, 65536, 1 << 20]
    print_table(
        "diff.compare on float32 values that differ (us per call)",
        ["path", "elements", "measures off", "measures on", "ratio"],
        bench_compare(sizes, 50),
    )
    from tests.models import tiny_llama

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        models = [("tiny Llama h64 L2 s12", tiny_llama(64, 2, 12))]
        if not a.quick:
            models.append(("Llama h256 L2 s64", tiny_llama(256, 2, 64)))
    print_table(
        "run_aligned, warm (ms, median)",
        ["model", "measures off", "measures on", "ratio"],
        bench_runs(models, a.repeat),
    )


if __name__ == "__main__":
    main()
