"""Instructions per engine run, counted by valgrind's callgrind: this checkout against a
baseline checkout (``--baseline DIR``, e.g. a ``git worktree`` of an earlier commit).

Wall time on a shared 2-core machine moves by 30-40% from minute to minute, more than most
engine changes; the number of instructions a run executes does not (the same binary,
inputs and environment give the same count, whatever else the machine does).  Each
measurement is a child process under callgrind with instrumentation off; it loads the
model, runs the engine once or twice untimed (imports, registries, sessions), and only the
measured runs are counted (``callgrind_control -i on`` around them).  torch runs on one
thread, so every count is one thread's work.

``warm``: the same ExportedProgram again (what a notebook rerun costs);
``own``: the same, with ``own_error=True`` (each node rerun on the torch values of its inputs);
``cold``: a program loaded from the files and never run (what a first run costs, its
preparation included; files loaded before counting).

    .venv/bin/python benchmarks/bench_instructions.py --models large,chain500 \\
        --workdir /tmp/bench --reuse --baseline /tmp/oldhead

Needs valgrind (``apt-get install valgrind``); each child takes 2 to 5 minutes (the
imports run under valgrind too).  A benchmark, not a CI test.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = ("warm", "cold", "own")
REPO_ROOT = Path(__file__).resolve().parents[1]


def child(mode: str, folder: Path, runs: int, flag: Path) -> None:
    """Runs inside callgrind: waits for the parent to switch counting on around the runs."""
    # Nothing imported from benchmarks/: the package counted is the one on PYTHONPATH
    # (this checkout or the baseline), and the loading is spelled out here.
    import onnx
    import torch

    torch.set_num_threads(1)
    from onnx_sbs_nb.align.run import AlignedRun

    def load() -> tuple:
        ep = torch.export.load(str(folder / "model.pt2"))
        args = tuple(torch.load(str(folder / "inputs.pt"), weights_only=True))
        return ep, onnx.load(str(folder / "model.onnx")), args

    ep, onx, args = load()
    options = {"own_error": True} if mode == "own" else {}
    list(AlignedRun(ep, onx, args, **options))
    list(AlignedRun(ep, onx, args, **options))
    fresh = [load() for _ in range(runs)] if mode == "cold" else []
    _touch(flag, "ready")
    _wait(flag, "go")
    for k in range(runs):
        if mode == "cold":
            list(AlignedRun(*fresh[k]))
        else:
            list(AlignedRun(ep, onx, args, **options))
    _touch(flag, "done")
    _wait(flag, "end")


def _touch(flag: Path, what: str) -> None:
    flag.with_suffix("." + what).touch()


def _wait(flag: Path, what: str, timeout: float = 3600.0) -> None:
    deadline = time.monotonic() + timeout
    while not flag.with_suffix("." + what).exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what!r} signal after {timeout:.0f} s")
        time.sleep(0.2)


def count(checkout: Path, mode: str, folder: Path, runs: int, tmp: Path) -> tuple[int, int]:
    """Instructions of ``runs`` engine runs of the package in ``checkout``: (all, those
    of the cyclic garbage collector).  A full collection lands in one run or the next
    as allocations add up, so the second number tells a run that paid for one."""
    flag = tmp / f"{checkout.name}_{folder.name}_{mode}.flag"
    out = flag.with_suffix(".callgrind")
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        sys.executable,
        __file__,
        "--child",
        mode,
        "--files",
        str(folder),
        "--runs",
        str(runs),
        "--flag",
        str(flag),
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        _wait(flag, "ready")
        subprocess.run(
            ["callgrind_control", "-i", "on", str(proc.pid)], check=True, capture_output=True
        )
        _touch(flag, "go")
        _wait(flag, "done")
        subprocess.run(
            ["callgrind_control", "-i", "off", str(proc.pid)], check=True, capture_output=True
        )
        _touch(flag, "end")
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    if proc.returncode != 0:
        raise RuntimeError(f"callgrind child failed ({proc.returncode}): {err.decode()[-2000:]}")
    total = next(
        (int(x.split()[1]) for x in out.read_text().splitlines() if x.startswith("totals:")), None
    )
    if total is None:
        raise RuntimeError(f"no totals line in {out}")
    report = subprocess.run(
        ["callgrind_annotate", "--inclusive=yes", str(out)], capture_output=True, text=True
    ).stdout
    gc = next((_count(x) for x in report.splitlines() if ":gc_collect_main " in x), 0)
    return total, gc


def _millions(total: int, gc: int, runs: int) -> str:
    return f"{total / runs / 1e6:.1f} M ({gc / runs / 1e6:.1f} M)"


def _count(line: str) -> int:
    return int(line.split()[0].replace(",", ""))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="large,chain500", help="large, chain500, ...")
    p.add_argument("--modes", default="warm,cold", help="from warm, cold, own (comma-separated)")
    p.add_argument("--runs", type=int, default=1, help="counted runs per child")
    p.add_argument("--baseline", help="another checkout of the package, counted the same way")
    p.add_argument("--workdir", help="folder for the exported models (default: a temp folder)")
    p.add_argument("--reuse", action="store_true", help="reuse exports left in --workdir")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--files", help=argparse.SUPPRESS)
    p.add_argument("--flag", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        child(a.child, Path(a.files), a.runs, Path(a.flag))
        return 0
    if __package__ in (None, ""):
        sys.path.insert(0, str(REPO_ROOT))
    from benchmarks.bench_engine import SPECS
    from benchmarks.common import export_spec, fmt_ratio, print_table

    missing = [t for t in ("valgrind", "callgrind_control") if shutil.which(t) is None]
    if missing:
        p.error(f"{missing} not found: install valgrind (apt-get install valgrind)")
    modes = [m for m in a.modes.split(",") if m]
    if unknown := [m for m in modes if m not in MODES] + [
        m for m in a.models.split(",") if m not in SPECS
    ]:
        p.error(f"unknown {unknown}: models from {sorted(SPECS)}, modes from {MODES}")
    checkouts = [REPO_ROOT] + ([Path(a.baseline).resolve()] if a.baseline else [])
    for c in checkouts:
        if not (c / "onnx_sbs_nb" / "__init__.py").exists():
            p.error(f"{c} holds no onnx_sbs_nb package")
    root = Path(a.workdir) if a.workdir else Path(tempfile.mkdtemp(prefix="sbs_instr_"))
    rows = []
    with tempfile.TemporaryDirectory(prefix="sbs_callgrind_") as tmp:
        for m in a.models.split(","):
            files = export_spec(SPECS[m], root, reuse=a.reuse)
            for mode in modes:
                counts = [count(c, mode, files.folder, a.runs, Path(tmp)) for c in checkouts]
                (total, gc), base = counts[0], counts[1] if len(counts) > 1 else None
                rows.append(
                    [
                        SPECS[m].label,
                        mode,
                        _millions(total, gc, a.runs),
                        _millions(*base, a.runs) if base else "-",
                        fmt_ratio(total / base[0]) if base else "-",
                        fmt_ratio((total - gc) / (base[0] - base[1])) if base else "-",
                    ]
                )
                print(
                    f"{m} {mode}: {' | '.join(_millions(*c, a.runs) for c in counts)}", flush=True
                )
    print_table(
        "Instructions per run (callgrind; torch on one thread)",
        ["model", "run", "this checkout (GC)", "baseline (GC)", "ratio", "ratio outside GC"],
        rows,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
