"""How long ``onnx-sbs --help`` and an argument error take, against a bare Python.

The command line answers these before torch and onnx are imported (seconds): the
parser is built from light modules only (``onnx_sbs_nb/option_names.py``) and a
subcommand imports the engine once its flags parsed.  Each case runs as its own
process, as a user's command does; the baseline ``python -c pass`` is timed in the same
run, so the ratios compare like with like on this machine.

    python benchmarks/bench_cli_startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]

CASES: list[tuple[str, list[str]]] = [
    ("python -c pass (baseline)", ["-c", "pass"]),
    ("onnx-sbs --help", ["-m", "onnx_sbs_nb", "--help"]),
    ("onnx-sbs run --help", ["-m", "onnx_sbs_nb", "run", "--help"]),
    ("onnx-sbs run --atol x (argument error)", ["-m", "onnx_sbs_nb", "run", "--atol", "x"]),
    ("onnx-sbs bogus (unknown command)", ["-m", "onnx_sbs_nb", "bogus"]),
    ("import torch (for scale)", ["-c", "import torch"]),
]


def time_case(args: list[str], repeats: int) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(
            [sys.executable, *args],
            env=env,
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=False,
        )
        times.append(time.perf_counter() - t0)
    return times


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    time_case(CASES[0][1], 1)  # warm the file cache
    results = [(name, time_case(cmd, args.repeats)) for name, cmd in CASES]
    base = statistics.median(results[0][1])
    print(f"{'case':42s} {'median s':>9s} {'min s':>7s} {'x baseline':>10s}")
    for name, ts in results:
        med = statistics.median(ts)
        print(f"{name:42s} {med:9.3f} {min(ts):7.3f} {med / base:10.1f}")


if __name__ == "__main__":
    main()
