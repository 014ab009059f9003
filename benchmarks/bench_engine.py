"""Engine benchmark (issue 2): our run_aligned against the floor and against the prior art.

For each tiny Llama (random weights, exported once into a temporary folder):

* floor: one eager run of the program (``ep.module()(*args)``, module built beforehand)
  plus one whole-model onnxruntime run (session built beforehand; its build time is
  printed separately);
* our engine (``runner="onnxruntime"``, with and without ``own_error``):
  cold = a new AlignedRun on a freshly loaded ExportedProgram (includes the program
  preparation), warm = a new AlignedRun on an ExportedProgram already prepared once;
* onnx-diagnostic's ``run_aligned`` (OnnxruntimeEvaluator, ``use_tensor=True``) when
  ``onnx_diagnostic`` is importable (use ``.venv-bench``), else its columns are skipped;
* peak memory of each variant, each in a fresh subprocess (see common.PeakRss), compared
  with a whole-model onnxruntime run (session creation + run) measured the same way.

Every time is measured several times; the machine may be shared, so medians are the
headline and minimums the best case.  Usage::

    .venv/bin/python benchmarks/bench_engine.py                     # ours only
    PYTHONPATH=$PWD .venv-bench/bin/python benchmarks/bench_engine.py   # + prior art
"""

from __future__ import annotations

import argparse
import cProfile
import ctypes
import gc
import io
import pstats
import shutil
import statistics
import sys
import tempfile
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    LlamaSpec,
    ModelFiles,
    PeakRss,
    Timings,
    emit_result,
    export_llama,
    fmt_mb,
    fmt_ratio,
    fmt_s,
    has_onnx_diagnostic,
    load_exported,
    median_of,
    model_files,
    print_table,
    ratio,
    repeat_timed,
    run_child,
    time_call,
)

SMALL = LlamaSpec("small", hidden=64, layers=2, seq=12)
LARGE = LlamaSpec("large", hidden=256, layers=4, seq=64, intermediate=1024)
SPECS = {"small": SMALL, "large": LARGE}

# Our variants: name -> AlignedRun options.
OURS = {
    "ours": {"runner": "onnxruntime"},
    "ours_rerun": {"runner": "onnxruntime", "own_error": True},
}
# The ONNXProgram returned by torch.onnx.export carries the program the exporter lowered:
# passing it instead of its ModelProto skips our preparation (no re-trace at all).
OURS_ONNX_PROGRAM = "ours_onnxprogram"
THEIRS = "onnx-diagnostic"
# float32 tolerance given to both tools (our dtype-aware default for float32).
ATOL = RTOL = 1e-4
MEMORY_BASE = "ort_whole_model"
FLOOR_INNER = 5  # back-to-back floor runs per round (their minimum is the sample)


# ---------------------------------------------------------------- measurements
@dataclass
class Floor:
    """One value per round: each the minimum of FLOOR_INNER back-to-back runs."""

    eager: Timings
    ort_build: Timings
    ort_run: Timings

    def at(self, i: int) -> float:
        return self.eager.values[i] + self.ort_run.values[i]

    @property
    def median(self) -> float:
        return self.eager.median + self.ort_run.median

    @property
    def min(self) -> float:
        return self.eager.min + self.ort_run.min


@dataclass
class VariantResult:
    name: str
    cold: Timings
    warm: Timings | None = None
    records: int = 0
    paired: int = 0
    failing: int = 0
    flagged: int | None = None  # the prior art's own verdict (abs <= atol and rel <= rtol)
    cold_ratios: list[float] = field(default_factory=list)  # per round, to that round's floor
    warm_ratios: list[float] = field(default_factory=list)


@dataclass
class MemoryResult:
    name: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def first(self) -> float:
        return median_of(self.runs, "first")

    @property
    def steady(self) -> float:
        return median_of(self.runs, "steady")


@dataclass
class ModelResult:
    files: ModelFiles
    floor: Floor
    variants: list[VariantResult]
    memory: list[MemoryResult]
    skipped: list[str]


class FloorRunner:
    """The floor: one eager run of the program (module built beforehand) + one whole-model
    onnxruntime run (session built beforehand).  Its runs are short, so each sample is the
    minimum of FLOOR_INNER back-to-back runs."""

    def __init__(self, files: ModelFiles, builds: int):
        import onnxruntime as ort
        import torch

        self._torch = torch
        ep, _, self.args = files.load()
        self.module = ep.module()

        def build() -> Any:
            return ort.InferenceSession(str(files.onnx_path), providers=["CPUExecutionProvider"])

        self.ort_build, self.sess = repeat_timed(build, builds)
        self.feeds = {i.name: a.numpy() for i, a in zip(self.sess.get_inputs(), self.args)}
        self.sample()  # first calls pay lazy initialisation: the floor is steady state

    def sample(self) -> tuple[float, float]:
        with self._torch.no_grad():
            eager, _ = repeat_timed(lambda: self.module(*self.args), FLOOR_INNER)
        ort_run, _ = repeat_timed(lambda: self.sess.run(None, self.feeds), FLOOR_INNER)
        return eager.min, ort_run.min


def run_ours(ep: Any, onx: Any, args: tuple, options: dict[str, Any]) -> list[Any]:
    from onnx_sbs_nb.align.run import AlignedRun

    return list(AlignedRun(ep, onx, args, **options))


def run_theirs(ep: Any, onx: Any, args: tuple) -> list[Any]:
    from onnx_diagnostic.reference import OnnxruntimeEvaluator
    from onnx_diagnostic.torch_onnx.sbs import run_aligned

    return list(
        run_aligned(
            ep,
            onx,
            OnnxruntimeEvaluator,
            args=args,
            use_tensor=True,
            atol=ATOL,
            rtol=RTOL,
            exc=False,
            verbose=0,
        )
    )


def count_ours(records: list[Any]) -> tuple[int, int]:
    from onnx_sbs_nb.records import UNPAIRED

    paired = sum(1 for r in records if r.paired_by != UNPAIRED)
    return paired, sum(1 for r in records if r.failed)


def _shape_type(s: str | None) -> str:
    # the prior art prefixes the device ("CT1s2x3" / "GT1s2x3"): compare dtype and shape only
    return (s or "")[1:] if (s or "")[:1] in ("C", "G") else (s or "")


def count_theirs(records: list[Any]) -> tuple[int, int, int]:
    """(paired, failing, flagged): failing = different shape/type or err_abs > ATOL (the
    verdict our engine applies to float32); flagged = its own test (abs<=atol and rel<=rtol).
    A pair without err_abs (it computes none for some integer values) fails only on shape."""
    paired = failing = flagged = 0
    for r in records:
        if r.ep_name is None or r.onnx_name is None:
            continue
        paired += 1
        mismatch = _shape_type(r.ep_shape_type) != _shape_type(r.onnx_shape_type)
        bad_abs = r.err_abs is not None and not (r.err_abs <= ATOL)
        failing += mismatch or bad_abs
        bad_rel = r.err_rel is not None and not (r.err_rel <= RTOL)
        flagged += bad_abs or bad_rel
    return paired, failing, flagged


@dataclass
class _Protocol:
    """How one variant is timed: ``cold()`` / ``warm()`` each run once and return
    (seconds, records); ``rounds`` caps how many rounds include it."""

    name: str
    cold: Callable[[], tuple[float, list[Any]]]
    warm: Callable[[], tuple[float, list[Any]]] | None
    rounds: int
    count: Callable[[list[Any]], tuple[int, ...]]


def _ours_protocol(files: ModelFiles, name: str, repeats: int) -> _Protocol:
    options = OURS[name]

    def cold() -> tuple[float, list[Any]]:
        ep, onx, args = files.load()  # a fresh program: the preparation is included
        gc.collect()
        return time_call(lambda: run_ours(ep, onx, args, options))

    ep, onx, args = files.load()
    run_ours(ep, onx, args, options)  # prepares this ep once: the warm runs reuse it

    def warm() -> tuple[float, list[Any]]:
        gc.collect()
        return time_call(lambda: run_ours(ep, onx, args, options))

    return _Protocol(name, cold, warm, repeats, count_ours)


def _onnx_program_protocol(files: ModelFiles, repeats: int) -> _Protocol:
    """Our engine given the ONNXProgram: nothing to prepare, so cold == warm (one protocol).
    Needs an export in this process (untimed); not measured for memory (not picklable)."""
    import torch

    ep, _, args = files.load()
    program = torch.onnx.export(ep, args, dynamo=True, verbose=False)
    options = OURS["ours"]

    def cold() -> tuple[float, list[Any]]:
        gc.collect()
        return time_call(lambda: run_ours(ep, program, args, options))

    return _Protocol(OURS_ONNX_PROGRAM, cold, None, repeats, count_ours)


def _theirs_protocol(files: ModelFiles, repeats: int) -> _Protocol:
    # no preparation to cache: every run costs the same, so only the cold protocol
    def cold() -> tuple[float, list[Any]]:
        ep, onx, args = files.load()
        gc.collect()
        return time_call(lambda: run_theirs(ep, onx, args))

    return _Protocol(THEIRS, cold, None, repeats, count_theirs)


def measure_timings(
    files: ModelFiles,
    *,
    repeats: int,
    theirs_repeats: int,
    with_theirs: bool,
    with_onnx_program: bool,
) -> tuple[Floor, list[VariantResult]]:
    """Round-robin: each round samples the floor, then runs every variant once (cold and
    warm), so that load changes on a shared machine hit floor and variants alike; each
    ratio is taken to the floor of its own round."""
    floor_runner = FloorRunner(files, builds=repeats)
    protocols = [_ours_protocol(files, name, repeats) for name in OURS]
    if with_onnx_program:
        protocols.append(_onnx_program_protocol(files, repeats))
    if with_theirs:
        protocols.append(_theirs_protocol(files, theirs_repeats))
    floor = Floor(Timings(), floor_runner.ort_build, Timings())
    results = {
        p.name: VariantResult(p.name, Timings(), Timings() if p.warm else None) for p in protocols
    }
    last: dict[str, list[Any]] = {}
    for i in range(max(1, repeats)):
        eager, ort_run = floor_runner.sample()
        floor.eager.values.append(eager)
        floor.ort_run.values.append(ort_run)
        for p in protocols:
            if i >= p.rounds:
                continue
            r = results[p.name]
            t, last[p.name] = p.cold()
            r.cold.values.append(t)
            r.cold_ratios.append(t / floor.at(i))
            if p.warm is not None and r.warm is not None:
                t, last[p.name] = p.warm()
                r.warm.values.append(t)
                r.warm_ratios.append(t / floor.at(i))
    for p in protocols:
        r = results[p.name]
        counts = p.count(last[p.name])
        r.records = len(last[p.name])
        r.paired, r.failing = counts[0], counts[1]
        if len(counts) > 2:
            r.flagged = counts[2]
    return floor, [results[p.name] for p in protocols]


def warm_up_process(files: ModelFiles, with_theirs: bool) -> dict[str, float]:
    """First calls in a process pay one-time costs (imports, the exporter's decomposition
    registry, onnxruntime environment): paid here, on the smallest model, and reported."""
    first: dict[str, float] = {}
    first["ours"], _ = time_call(lambda: run_ours(*files.load(), OURS["ours"]))
    if with_theirs:
        first[THEIRS], _ = time_call(lambda: run_theirs(*files.load()))
    return first


# ---------------------------------------------------------------- peak memory (children)
def memory_variants(with_theirs: bool) -> list[str]:
    names = [MEMORY_BASE, "eager", *OURS]
    return names + [THEIRS] if with_theirs else names


def _run_variant(name: str, files: ModelFiles, ep: Any, onx: Any, args: tuple) -> None:
    if name == MEMORY_BASE:
        import onnxruntime as ort

        sess = ort.InferenceSession(str(files.onnx_path), providers=["CPUExecutionProvider"])
        sess.run(None, {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)})
        del sess
    elif name == "eager":
        import torch

        with torch.no_grad():
            ep.module()(*args)
    elif name == THEIRS:
        run_theirs(ep, onx, args)
    else:
        run_ours(ep, onx, args, OURS[name])


def _trim_heap() -> None:
    # returns freed heap pages to the OS so that the next baseline is the live memory
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def child_memory(name: str, folder: Path) -> dict[str, Any]:
    """In a fresh process: peak RSS increase of one variant above the baseline taken after
    imports and model loading.  ``first``: the first run in the process (lazy imports and
    one-time initialisation count); ``steady``: a second run on another, unprepared copy
    of the program, after the first run's memory was released."""
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    import onnx_sbs_nb.align.run  # noqa: F401

    if name == THEIRS:
        import onnx_diagnostic.torch_onnx.sbs  # noqa: F401
    files = model_files(folder)
    ep1, onx, args = load_exported(folder)
    ep2, _, _ = load_exported(folder)
    warnings.simplefilter("ignore")
    _trim_heap()
    with PeakRss() as first:
        _run_variant(name, files, ep1, onx, args)
    _trim_heap()
    with PeakRss() as steady:
        _run_variant(name, files, ep2, onx, args)
    return {
        "variant": name,
        "first": first.increase,
        "steady": steady.increase,
        "baseline": first.baseline,
        "peak_first": first.peak,
        "method": first.method,
    }


def measure_memory(files: ModelFiles, names: list[str], repeats: int) -> list[MemoryResult]:
    script = Path(__file__).resolve()
    results = []
    for name in names:
        m = MemoryResult(name)
        for _ in range(max(1, repeats)):
            m.runs.append(run_child(script, ["--child", name, "--files", str(files.folder)]))
        results.append(m)
    return results


# ---------------------------------------------------------------- one model
def bench_model(
    files: ModelFiles,
    *,
    repeats: int = 3,
    theirs_repeats: int = 2,
    memory_repeats: int = 2,
    with_theirs: bool | None = None,
    with_memory: bool = True,
    with_onnx_program: bool = True,
    memory_names: list[str] | None = None,
) -> ModelResult:
    """All measurements for one exported model (the core the smoke test runs)."""
    if with_theirs is None:
        with_theirs = has_onnx_diagnostic()
    skipped = [] if with_theirs else [f"{THEIRS} (not importable: run in .venv-bench)"]
    floor, variants = measure_timings(
        files,
        repeats=repeats,
        theirs_repeats=theirs_repeats,
        with_theirs=with_theirs,
        with_onnx_program=with_onnx_program,
    )
    memory = []
    if with_memory:
        names = memory_names or memory_variants(with_theirs)
        memory = measure_memory(files, names, memory_repeats)
    else:
        skipped.append("peak memory (--no-memory)")
    return ModelResult(files, floor, variants, memory, skipped)


# ---------------------------------------------------------------- printing
def print_results(results: list[ModelResult], first_calls: dict[str, float]) -> None:
    rows = []
    for r in results:
        f = r.floor
        rows.append(
            [
                r.files.spec.label,
                f"{fmt_s(f.eager.median)} / {fmt_s(f.eager.min)}",
                f"{fmt_s(f.ort_build.median)} / {fmt_s(f.ort_build.min)}",
                f"{fmt_s(f.ort_run.median)} / {fmt_s(f.ort_run.min)}",
                f"{fmt_s(f.median)} / {fmt_s(f.min)}",
            ]
        )
    print_table(
        "Floor (median / min)",
        ["model", "eager ep.module()", "ORT session build", "ORT run", "floor = eager + ORT run"],
        rows,
    )

    rows = []
    for r in results:
        fl = r.floor
        for v in r.variants:
            warm = v.warm
            best = warm if warm else v.cold
            rows.append(
                [
                    r.files.spec.name,
                    v.name,
                    f"{fmt_s(v.cold.median)} / {fmt_s(v.cold.min)}",
                    f"{fmt_s(warm.median)} / {fmt_s(warm.min)}" if warm else "-",
                    fmt_ratio(_median(v.cold_ratios)),
                    fmt_ratio(_median(v.warm_ratios)) if warm else "-",
                    fmt_ratio(ratio(best.min, fl.min)),
                    len(v.cold.values),
                ]
            )
    print_table(
        "Wall time (median / min); ratios to the floor: median over rounds of the ratio to "
        "the same round's floor, and min / min",
        [
            "model",
            "variant",
            "cold",
            "warm",
            "cold/floor (med)",
            "warm/floor (med)",
            "best/floor (min)",
            "rounds",
        ],
        rows,
    )

    rows = [
        [
            r.files.spec.name,
            v.name,
            v.records,
            v.paired,
            v.failing,
            "-" if v.flagged is None else v.flagged,
        ]
        for r in results
        for v in r.variants
    ]
    print_table(
        "Records",
        ["model", "variant", "records", "paired", "failing pairs", "flagged by its own test"],
        rows,
    )

    rows = []
    for r in results:
        base = {m.name: m for m in r.memory}.get(MEMORY_BASE)
        for m in r.memory:
            rows.append(
                [
                    r.files.spec.name,
                    m.name,
                    fmt_mb(m.first),
                    fmt_mb(m.steady),
                    fmt_ratio(ratio(m.first, base.first)) if base else "-",
                    fmt_ratio(ratio(m.steady, base.steady)) if base else "-",
                    fmt_mb(median_of(m.runs, "baseline")),
                    len(m.runs),
                ]
            )
    if rows:
        method = results[0].memory[0].runs[0]["method"]
        print_table(
            f"Peak RSS increase above the loaded baseline (median of runs, {method}); "
            f"ratios to {MEMORY_BASE}",
            [
                "model",
                "variant",
                "first run",
                "steady run",
                "first / ORT",
                "steady / ORT",
                "baseline RSS",
                "runs",
            ],
            rows,
        )

    if first_calls:
        print(
            "\nFirst call in the process (small model; one-time imports and registries): "
            + ", ".join(f"{k} {fmt_s(v)}" for k, v in first_calls.items())
        )
    for r in results:
        for s in r.skipped:
            print(f"skipped for {r.files.spec.name}: {s}")
    print_goals(results)


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def print_goals(results: list[ModelResult]) -> None:
    by_name = {r.files.spec.name: r for r in results}
    target = by_name.get(LARGE.name) or results[-1]
    ours = {v.name: v for v in target.variants}
    lines = [f"\nGoals ({target.files.spec.name} model):"]
    v = ours["ours"]
    fl = target.floor
    if v.warm is not None:
        lines.append(
            f"  wall <= 3x floor: warm {fmt_ratio(_median(v.warm_ratios))} (median per round), "
            f"{fmt_ratio(ratio(v.warm.min, fl.min))} (min/min); cold "
            f"{fmt_ratio(_median(v.cold_ratios))} / {fmt_ratio(ratio(v.cold.min, fl.min))}"
        )
    onnx_program = ours.get(OURS_ONNX_PROGRAM)
    if onnx_program is not None:
        lines.append(
            "  given the ONNXProgram (no preparation): "
            f"{fmt_ratio(_median(onnx_program.cold_ratios))} (median per round), "
            f"{fmt_ratio(ratio(onnx_program.cold.min, fl.min))} (min/min)"
        )
    fails = {r.files.spec.name: {v.name: v.failing for v in r.variants} for r in results}
    lines.append(f"  zero failing pairs: {fails}")
    theirs = ours.get(THEIRS)
    if theirs is not None:
        lines.append(f"  paired >= prior art: ours {v.paired} vs {theirs.paired}")
    mem = {m.name: m for m in target.memory}
    if MEMORY_BASE in mem and "ours" in mem:
        lines.append(
            "  peak memory <= 1.10x whole-model ORT: steady "
            f"{fmt_ratio(ratio(mem['ours'].steady, mem[MEMORY_BASE].steady))}, first "
            f"{fmt_ratio(ratio(mem['ours'].first, mem[MEMORY_BASE].first))}"
        )
    print("\n".join(lines))


def profile_ours(files: ModelFiles, name: str = "ours", top: int = 25) -> str:
    """cProfile of one cold and one warm run (cold first, then warm on the same program)."""
    options = OURS[name]
    out = io.StringIO()
    ep, onx, args = files.load()
    for label in ("cold", "warm"):
        prof = cProfile.Profile()
        prof.enable()
        run_ours(ep, onx, args, options)
        prof.disable()
        for key in ("tottime", "cumulative"):
            out.write(f"\n--- {name} {label} run, {files.spec.name} model, sorted by {key}\n")
            pstats.Stats(prof, stream=out).sort_stats(key).print_stats(top)
    return out.getvalue()


# ---------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", default="small,large", help="comma-separated: small,large")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement")
    p.add_argument("--theirs-repeats", type=int, default=3, help="timed runs of the prior art")
    p.add_argument("--memory-repeats", type=int, default=2, help="subprocesses per variant")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    p.add_argument("--no-theirs", action="store_true", help="skip onnx-diagnostic")
    p.add_argument("--profile", action="store_true", help="cProfile our engine on each model")
    p.add_argument("--workdir", help="folder for the exported models (default: a temp folder)")
    p.add_argument(
        "--torch-threads",
        type=int,
        help="torch.set_num_threads(N) for every measurement (default: torch's own choice)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--files", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    if a.torch_threads:
        import torch

        torch.set_num_threads(a.torch_threads)
    if a.child:
        emit_result(child_memory(a.child, Path(a.files)))
        return 0

    with_theirs = not a.no_theirs and has_onnx_diagnostic()
    if not with_theirs:
        why = "--no-theirs" if a.no_theirs else "onnx_diagnostic is not importable"
        print(f"note: {why}: the prior-art columns are skipped (use .venv-bench, see README)")
    unknown = [m for m in a.models.split(",") if m not in SPECS]
    if unknown:
        p.error(f"unknown model(s) {unknown}: choose from {sorted(SPECS)}")
    tmp = None
    root = Path(a.workdir) if a.workdir else Path(tmp := tempfile.mkdtemp(prefix="sbs_bench_"))
    try:
        all_files = []
        for m in a.models.split(","):
            print(f"exporting {SPECS[m].label} ...", flush=True)
            all_files.append(export_llama(SPECS[m], root))
        import torch

        print(f"torch intra-op threads: {torch.get_num_threads()}", flush=True)
        first_calls = warm_up_process(all_files[0], with_theirs)
        results = []
        for files in all_files:
            print(f"measuring {files.spec.label} ...", flush=True)
            results.append(
                bench_model(
                    files,
                    repeats=a.repeats,
                    theirs_repeats=a.theirs_repeats,
                    memory_repeats=a.memory_repeats,
                    with_theirs=with_theirs,
                    with_memory=not a.no_memory,
                )
            )
        print_results(results, first_calls)
        if a.profile:
            for files in all_files:
                print(profile_ours(files))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
