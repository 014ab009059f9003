"""Memory versus depth (issue 4): peak memory of our engine on a shallow and a deep Llama.

Two tiny Llamas with the same width (default hidden 256, intermediate 1024, seq 128),
2 and 12 layers.  Each variant runs in fresh subprocesses (see ``bench_engine.child_memory``
and ``common.PeakRss``); the script prints the peak RSS increase of each, the size of the
deep model's extra weights, and what keeping every activation would add (the sum of the
sizes of all values the program computes).  Goal: our difference stays near the extra
weights (the engine keeps a converted copy of the weights it compares), well below extra
weights + extra activations.

    .venv/bin/python benchmarks/bench_memory.py [--layers 2,12 --hidden 256 --seq 128]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_engine import MEMORY_BASE, OURS, MemoryResult, measure_memory  # noqa: E402
from benchmarks.common import (  # noqa: E402
    MB,
    LlamaSpec,
    ModelFiles,
    export_llama,
    fmt_mb,
    fmt_ratio,
    print_table,
    ratio,
)

VARIANTS = [MEMORY_BASE, *OURS]


@dataclass
class DepthPoint:
    files: ModelFiles
    activation_bytes: int
    memory: dict[str, MemoryResult]


def activation_bytes(ep: Any) -> int:
    """Bytes of every tensor the program computes (what keeping all activations costs),
    from the shapes torch.export recorded on the nodes."""
    import torch

    total = 0
    for node in ep.graph.nodes:
        if node.op != "call_function":
            continue
        vals = node.meta.get("val")
        for v in vals if isinstance(vals, list | tuple) else [vals]:
            if isinstance(v, torch.Tensor):
                try:
                    total += int(v.numel()) * v.element_size()
                except Exception:  # symbolic sizes: not counted
                    pass
    return total


def bench_depth(
    specs: list[LlamaSpec], root: Path, *, repeats: int = 2, variants: list[str] | None = None
) -> list[DepthPoint]:
    """Exports each spec into root and measures each variant's peak memory (the core the
    smoke test runs)."""
    points = []
    for spec in specs:
        print(f"exporting {spec.label} ...", flush=True)
        files = export_llama(spec, root)
        ep, _, _ = files.load()
        act = activation_bytes(ep)
        del ep
        print(f"measuring {spec.label} ...", flush=True)
        mem = measure_memory(files, variants or VARIANTS, repeats)
        points.append(DepthPoint(files, act, {m.name: m for m in mem}))
    return points


def print_depth(points: list[DepthPoint]) -> dict[str, Any]:
    """Prints the tables; returns the deep-minus-shallow figures (bytes) per variant."""
    names = list(points[0].memory)
    rows = []
    for p in points:
        for name in names:
            m = p.memory[name]
            rows.append(
                [
                    p.files.spec.label,
                    fmt_mb(p.files.weight_bytes),
                    fmt_mb(p.activation_bytes),
                    name,
                    fmt_mb(m.first),
                    fmt_mb(m.steady),
                    len(m.runs),
                ]
            )
    print_table(
        "Peak RSS increase above the loaded baseline (median of runs)",
        ["model", "weights", "all activations", "variant", "first run", "steady run", "runs"],
        rows,
    )
    shallow, deep = points[0], points[-1]
    extra_w = deep.files.weight_bytes - shallow.files.weight_bytes
    extra_a = deep.activation_bytes - shallow.activation_bytes
    diffs: dict[str, Any] = {"extra_weights": extra_w, "extra_activations": extra_a}
    rows = []
    for name in names:
        d_first = deep.memory[name].first - shallow.memory[name].first
        d_steady = deep.memory[name].steady - shallow.memory[name].steady
        diffs[name] = {"first": d_first, "steady": d_steady}
        rows.append(
            [
                name,
                fmt_mb(d_first),
                fmt_mb(d_steady),
                fmt_ratio(ratio(d_steady, extra_w)),
                fmt_ratio(ratio(d_steady, extra_w + extra_a)),
            ]
        )
    print_table(
        f"{deep.files.spec.name} minus {shallow.files.spec.name}: extra weights "
        f"{fmt_mb(extra_w)}, extra activations (if all were kept) {fmt_mb(extra_a)}",
        [
            "variant",
            "diff first",
            "diff steady",
            "steady / extra weights",
            "steady / (extra weights + activations)",
        ],
        rows,
    )
    if "ours" in diffs:
        d = diffs["ours"]["steady"]
        print(
            f"\nGoal: ours' difference ({d / MB:.1f} MB) near the extra weights "
            f"({extra_w / MB:.1f} MB), far from weights + all activations "
            f"({(extra_w + extra_a) / MB:.1f} MB)."
        )
    return diffs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--layers", default="2,12", help="comma-separated depths (first vs last)")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--seq", type=int, default=128, help="<= 256 (the config's max positions)")
    p.add_argument("--repeats", type=int, default=2, help="subprocesses per variant and model")
    p.add_argument("--workdir", help="folder for the exported models (default: a temp folder)")
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    layers = [int(x) for x in a.layers.split(",")]
    if len(layers) < 2:
        p.error("--layers needs at least two depths, e.g. 2,12")
    specs = [LlamaSpec(f"L{n}", a.hidden, n, a.seq, a.intermediate) for n in layers]
    tmp = None
    root = Path(a.workdir) if a.workdir else Path(tmp := tempfile.mkdtemp(prefix="sbs_mem_"))
    try:
        print_depth(bench_depth(specs, root, repeats=a.repeats))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
