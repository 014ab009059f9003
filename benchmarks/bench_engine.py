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

import time

T_START = time.perf_counter()  # a cold child counts its imports from here

import argparse  # noqa: E402
import cProfile  # noqa: E402
import ctypes  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import os  # noqa: E402
import pstats  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (  # noqa: E402
    ChainSpec,
    LlamaSpec,
    ModelFiles,
    PeakRss,
    Timings,
    emit_result,
    export_spec,
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
LARGE12 = LlamaSpec("large12", hidden=256, layers=12, seq=64, intermediate=1024)
CHAIN500 = ChainSpec("chain500", 500)
CHAIN5000 = ChainSpec("chain5000", 5000)
SPECS = {s.name: s for s in (SMALL, LARGE, LARGE12, CHAIN500, CHAIN5000)}
DEFAULT_MODELS = "small,large,large12,chain500,chain5000"

# Our variants: name -> AlignedRun options ("prepare" is the benchmark's own, see stream_ours).
OURS = {
    "ours": {"runner": "onnxruntime"},
    "ours_retrace": {"runner": "onnxruntime", "prepare": "retrace"},
    "ours_rerun": {"runner": "onnxruntime", "own_error": True},
}
# The variants timed on the chains (no weights, nothing to rerun: cost per node).
CHAIN_VARIANTS = ("ours", "ours_retrace")
# On the long chain the re-trace and the prior art take seconds per cold run: they get
# this many rounds at most; ours (under half a second) gets every round, so that its
# growth is a median, not one sample.
CHAIN_ROUNDS = {"chain5000": 1}
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
    first: Timings = field(default_factory=Timings)  # cold: seconds to the first record
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
    fresh: list[Any] = field(default_factory=list)  # FreshResult per variant


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


def stream_ours(ep: Any, onx: Any, args: tuple, options: dict[str, Any]) -> Iterator[Any]:
    """Our records as they come.  ``prepare="retrace"``: the program is prepared by the
    exporter's own re-trace (``prepare_program(ep)``, what the engine did before it
    reproduced the preparation) and handed to the engine the way an ONNXProgram hands
    its program: the before of issue 13, timed in the same run as the after."""
    from onnx_sbs_nb.align.run import AlignedRun

    options = dict(options)
    if options.pop("prepare", None) == "retrace":
        onx = with_retraced_program(ep, onx)
    return iter(AlignedRun(ep, onx, args, **options))


class _ModelAndProgram:
    """What torch.onnx.export returns, as far as the engine reads it."""

    def __init__(self, model: Any, program: Any):
        self.model_proto = model
        self.exported_program = program


def with_retraced_program(ep: Any, onx: Any) -> Any:
    from onnx_sbs_nb.align.source.loading import load_exported_program, load_onnx_model
    from onnx_sbs_nb.align.source.prepare.program import prepare_program

    prepared = prepare_program(load_exported_program(ep))  # no model: the re-trace
    return _ModelAndProgram(load_onnx_model(onx), prepared.program)


def run_ours(ep: Any, onx: Any, args: tuple, options: dict[str, Any]) -> list[Any]:
    return list(stream_ours(ep, onx, args, options))


def stream_theirs(ep: Any, onx: Any, args: tuple) -> Iterator[Any]:
    from onnx_diagnostic.reference import OnnxruntimeEvaluator
    from onnx_diagnostic.torch_onnx.sbs import run_aligned

    return iter(
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


def run_theirs(ep: Any, onx: Any, args: tuple) -> list[Any]:
    return list(stream_theirs(ep, onx, args))


def time_stream(make: Callable[[], Iterator[Any]]) -> tuple[float, float, list[Any]]:
    """(seconds to the last record, seconds to the first, records) of one run; the
    clock starts before ``make()`` (validation and preparation count)."""
    t = time.perf_counter()
    records = []
    first = float("nan")
    for rec in make():
        if not records:
            first = time.perf_counter() - t
        records.append(rec)
    return time.perf_counter() - t, first, records


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
    (seconds, seconds to the first record, records); ``rounds`` caps how many rounds
    include it."""

    name: str
    cold: Callable[[], tuple[float, float, list[Any]]]
    warm: Callable[[], tuple[float, float, list[Any]]] | None
    rounds: int
    count: Callable[[list[Any]], tuple[int, ...]]


def _ours_protocol(files: ModelFiles, name: str, repeats: int, warm: bool = True) -> _Protocol:
    options = OURS[name]

    def cold() -> tuple[float, float, list[Any]]:
        ep, onx, args = files.load()  # a fresh program: the preparation is included
        gc.collect()
        return time_stream(lambda: stream_ours(ep, onx, args, options))

    if not warm:
        return _Protocol(name, cold, None, repeats, count_ours)
    ep, onx, args = files.load()
    run_ours(ep, onx, args, options)  # prepares this ep once: the warm runs reuse it

    def warm_run() -> tuple[float, float, list[Any]]:
        gc.collect()
        return time_stream(lambda: stream_ours(ep, onx, args, options))

    return _Protocol(name, cold, warm_run, repeats, count_ours)


def _onnx_program_protocol(files: ModelFiles, repeats: int) -> _Protocol:
    """Our engine given the ONNXProgram: nothing to prepare, so cold == warm (one protocol).
    Needs an export in this process (untimed); not measured for memory (not picklable)."""
    import torch

    ep, _, args = files.load()
    program = torch.onnx.export(ep, args, dynamo=True, verbose=False)
    options = OURS["ours"]

    def cold() -> tuple[float, float, list[Any]]:
        gc.collect()
        return time_stream(lambda: stream_ours(ep, program, args, options))

    return _Protocol(OURS_ONNX_PROGRAM, cold, None, repeats, count_ours)


def _theirs_protocol(files: ModelFiles, repeats: int) -> _Protocol:
    # no preparation to cache: every run costs the same, so only the cold protocol
    def cold() -> tuple[float, float, list[Any]]:
        ep, onx, args = files.load()
        gc.collect()
        return time_stream(lambda: stream_theirs(ep, onx, args))

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
    ratio is taken to the floor of its own round.  On a chain, only the cold runs of
    CHAIN_VARIANTS and the prior art (cost per node), the slow ones in CHAIN_ROUNDS rounds
    at most."""
    chain = isinstance(files.spec, ChainSpec)
    rounds = min(repeats, CHAIN_ROUNDS.get(files.spec.name, repeats))
    floor_runner = FloorRunner(files, builds=repeats)
    names = CHAIN_VARIANTS if chain else tuple(OURS)
    protocols = [
        _ours_protocol(files, name, repeats if name == "ours" else rounds, warm=not chain)
        for name in names
    ]
    if with_onnx_program and not chain:
        protocols.append(_onnx_program_protocol(files, repeats))
    if with_theirs:
        protocols.append(_theirs_protocol(files, min(theirs_repeats, rounds)))
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
            t, first, last[p.name] = p.cold()
            r.cold.values.append(t)
            r.first.values.append(first)
            r.cold_ratios.append(t / floor.at(i))
            if p.warm is not None and r.warm is not None:
                t, _, last[p.name] = p.warm()
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
    # the re-trace's own one-time costs (the export machinery)
    first["ours_retrace"], _ = time_call(lambda: run_ours(*files.load(), OURS["ours_retrace"]))
    if with_theirs:
        first[THEIRS], _ = time_call(lambda: run_theirs(*files.load()))
    return first


# ---------------------------------------------------------------- cold from files (children)
FRESH_VARIANTS = ("ours", "ours_retrace")
# ours in a process whose cache folder is empty: what the very first run on a
# machine pays once (the exporter's op decisions computed from torchlib's registry)
FRESH_EMPTY_CACHE = "ours_empty_cache"
CLI = "ours_cli"


def fresh_variants(with_theirs: bool) -> list[str]:
    names = [*FRESH_VARIANTS, FRESH_EMPTY_CACHE]
    return [*names, THEIRS] if with_theirs else names


def child_fresh(name: str, folder: Path) -> dict[str, Any]:
    """In a fresh process, what a command-line user waits for: imports (counted from the
    start of this script), loading the three files, then the run (first record, last
    record), each first use of a lazy import or registry included."""
    import onnx  # noqa: F401
    import onnxruntime  # noqa: F401
    import torch  # noqa: F401

    if name == THEIRS:
        import onnx_diagnostic.reference  # noqa: F401
        import onnx_diagnostic.torch_onnx.sbs  # noqa: F401
    else:
        import onnx_sbs_nb.align.run  # noqa: F401
    imports = time.perf_counter() - T_START
    warnings.simplefilter("ignore")
    load, (ep, onx, args) = time_call(lambda: load_exported(folder))
    if name == THEIRS:
        total, first, records = time_stream(lambda: stream_theirs(ep, onx, args))
        counts = count_theirs(records)
    else:
        options = OURS[name]
        total, first, records = time_stream(lambda: stream_ours(ep, onx, args, options))
        counts = count_ours(records)
    return {
        "variant": name,
        "imports": imports,
        "load": load,
        "first": first,
        "run": total,
        "records": len(records),
        "paired": counts[0],
        "failing": counts[1],
    }


@dataclass
class FreshResult:
    name: str
    runs: list[dict[str, Any]] = field(default_factory=list)  # the child's figures + "wall"

    def median(self, key: str) -> float:
        return median_of(self.runs, key)


def _child_env(empty_cache: bool, tmp: Path) -> dict[str, str] | None:
    if not empty_cache:
        return None
    folder = Path(tempfile.mkdtemp(prefix="cache-", dir=tmp))
    return {"ONNX_SBS_CACHE_DIR": str(folder)}


def measure_fresh(files: ModelFiles, names: list[str], repeats: int) -> list[FreshResult]:
    """Each variant in fresh processes, round-robin; ``wall``: the child's whole life
    (interpreter start included), timed here."""
    script = Path(__file__).resolve()
    results = {n: FreshResult(n) for n in names}
    tmp = Path(tempfile.mkdtemp(prefix="sbs_fresh_"))
    try:
        for _ in range(max(1, repeats)):
            for name in names:
                if name == CLI:
                    results[name].runs.append({"wall": _time_cli(files)})
                    continue
                variant = "ours" if name == FRESH_EMPTY_CACHE else name
                env = _child_env(name == FRESH_EMPTY_CACHE, tmp)
                t = time.perf_counter()
                run = run_child(
                    script, ["--fresh-child", variant, "--files", str(files.folder)], env=env
                )
                run["wall"] = time.perf_counter() - t
                results[name].runs.append(run)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return list(results.values())


def _time_cli(files: ModelFiles) -> float:
    """Wall time of ``onnx-sbs run`` on the three files (the command a user types)."""
    from benchmarks.common import REPO_ROOT

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "onnx_sbs_nb", "run", "--ep", str(files.ep_path)]
    cmd += ["--onnx", str(files.onnx_path), "--inputs", str(files.inputs_path), "--no-progress"]
    with tempfile.TemporaryDirectory(prefix="sbs_cli_") as cwd:  # it writes its records there
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800, cwd=cwd)
        wall = time.perf_counter() - t
    if proc.returncode not in (0, 1):  # 1: the run found failing pairs
        raise RuntimeError(f"onnx-sbs run failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall


# ---------------------------------------------------------------- peak memory (children)
def memory_variants(with_theirs: bool, files: ModelFiles | None = None) -> list[str]:
    if files is not None and isinstance(files.spec, ChainSpec):
        names = [MEMORY_BASE, *CHAIN_VARIANTS]
    else:
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
    fresh_repeats: int = 0,
    fresh_names: list[str] | None = None,
) -> ModelResult:
    """All measurements for one exported model (the core the smoke test runs).
    ``fresh_repeats``: cold runs from the files in fresh processes (0: none)."""
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
        names = memory_names or memory_variants(with_theirs, files)
        memory = measure_memory(files, names, memory_repeats)
    else:
        skipped.append("peak memory (--no-memory)")
    fresh = []
    if fresh_repeats > 0:
        names = fresh_names or [*fresh_variants(with_theirs), CLI]
        fresh = measure_fresh(files, names, fresh_repeats)
    return ModelResult(files, floor, variants, memory, skipped, fresh)


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
                    fmt_s(v.first.median),
                    len(v.cold.values),
                ]
            )
    print_table(
        "Wall time (median / min); ratios to the floor: median over rounds of the ratio to "
        "the same round's floor, and min / min; first record: cold, from the call",
        [
            "model",
            "variant",
            "cold",
            "warm",
            "cold/floor (med)",
            "warm/floor (med)",
            "best/floor (min)",
            "first record",
            "rounds",
        ],
        rows,
    )
    print_fresh(results)
    print_growth(results)

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
        method = next(r.memory[0].runs[0]["method"] for r in results if r.memory)
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


def print_fresh(results: list[ModelResult]) -> None:
    rows = []
    for r in results:
        theirs = {f.name: f for f in r.fresh}.get(THEIRS)
        for f in r.fresh:
            rows.append(
                [
                    r.files.spec.name,
                    f.name,
                    fmt_s(f.median("wall")),
                    fmt_s(f.median("imports")),
                    fmt_s(f.median("load")),
                    fmt_s(f.median("first")),
                    fmt_s(f.median("run")),
                    fmt_ratio(ratio(f.median("wall"), theirs.median("wall"))) if theirs else "-",
                    fmt_ratio(ratio(f.median("run"), theirs.median("run"))) if theirs else "-",
                    len(f.runs),
                ]
            )
    if rows:
        print_table(
            "Cold from files in a fresh process (median): wall = the whole process; first "
            f"record and run from the call on the loaded files; {CLI} = `onnx-sbs run`, "
            f"{FRESH_EMPTY_CACHE} = ours with an empty cache folder",
            [
                "model",
                "variant",
                "wall",
                "imports",
                "load files",
                "first record",
                "run",
                "wall / prior art",
                "run / prior art",
                "runs",
            ],
            rows,
        )


def _chain_results(results: list[ModelResult]) -> tuple[ModelResult, ModelResult] | None:
    """The shortest and the longest chain measured, if two were."""
    chains = sorted(
        (r for r in results if isinstance(r.files.spec, ChainSpec)),
        key=lambda r: r.files.spec.nodes,
    )
    return (chains[0], chains[-1]) if len(chains) >= 2 else None


def _ort_whole(r: ModelResult) -> float:
    """A whole-model onnxruntime session created and run once (medians)."""
    return r.floor.ort_build.median + r.floor.ort_run.median


def print_growth(results: list[ModelResult]) -> None:
    chains = _chain_results(results)
    if chains is None:
        return
    small, large = chains
    rows = []
    cold_small = {v.name: v.cold.median for v in small.variants}
    for v in large.variants:
        rows.append(
            [
                v.name,
                fmt_s(cold_small.get(v.name)),
                fmt_s(v.cold.median),
                fmt_ratio(ratio(v.cold.median, cold_small.get(v.name))),
                fmt_ratio(ratio(v.cold.median, _ort_whole(large))),
            ]
        )
    rows.append(
        [
            "whole-model ORT (session + run)",
            fmt_s(_ort_whole(small)),
            fmt_s(_ort_whole(large)),
            fmt_ratio(ratio(_ort_whole(large), _ort_whole(small))),
            "1.00x",
        ]
    )
    print_table(
        f"Cost versus graph size: cold runs on {small.files.spec.label} and "
        f"{large.files.spec.label} (median)",
        [
            "variant",
            small.files.spec.name,
            large.files.spec.name,
            "growth",
            "long / whole-model ORT",
        ],
        rows,
    )


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def print_goals(results: list[ModelResult]) -> None:
    """Each goal of issue 13, with the figures of this run."""
    by_name = {r.files.spec.name: r for r in results}
    lines = ["\nGoals (issue 13):"]
    for name in (LARGE.name, LARGE12.name):
        r = by_name.get(name)
        if r is None:
            continue
        fresh = {f.name: f for f in r.fresh}
        theirs = fresh.get(THEIRS)
        variants = {v.name: v for v in r.variants}
        for ours in ("ours", "ours_retrace"):
            parts = []
            if theirs is not None and ours in fresh:
                f = fresh[ours]
                parts.append(
                    f"fresh process {fmt_ratio(ratio(f.median('wall'), theirs.median('wall')))}"
                    f" (run alone {fmt_ratio(ratio(f.median('run'), theirs.median('run')))})"
                )
            if THEIRS in variants and ours in variants:
                in_process = ratio(variants[ours].cold.median, variants[THEIRS].cold.median)
                parts.append(f"in process {fmt_ratio(in_process)}")
            if parts:
                lines.append(f"  1. cold <= 0.5x prior art, {name}, {ours}: " + ", ".join(parts))
        if name == LARGE.name:
            for ours in ("ours", "ours_retrace"):
                firsts = [fmt_s(variants[ours].first.median)] if ours in variants else []
                if ours in fresh:
                    firsts.append(f"fresh process {fmt_s(fresh[ours].median('first'))}")
                if firsts:
                    lines.append(f"  1. first record <= 1 s, {name}, {ours}: " + ", ".join(firsts))
            for ours in ("ours", "ours_rerun"):
                v = variants.get(ours)
                if v is not None and v.warm is not None:
                    lines.append(
                        f"  2. warm <= 3x floor, {name}, {ours}: "
                        f"{fmt_ratio(_median(v.warm_ratios))} (median per round), "
                        f"{fmt_ratio(ratio(v.warm.min, r.floor.min))} (min/min)"
                    )
            mem = {m.name: m for m in r.memory}
            for ours in ("ours", "ours_retrace"):
                if MEMORY_BASE in mem and ours in mem:
                    base = mem[MEMORY_BASE]
                    lines.append(
                        f"  4. peak memory ~0.8x whole-model ORT, {name}, {ours}: steady "
                        f"{fmt_ratio(ratio(mem[ours].steady, base.steady))}, first run "
                        f"{fmt_ratio(ratio(mem[ours].first, base.first))}"
                    )
            if THEIRS in variants:
                lines.append(
                    f"  paired >= prior art, {name}: ours {variants['ours'].paired}, "
                    f"ours_retrace {variants['ours_retrace'].paired}, prior art "
                    f"{variants[THEIRS].paired}"
                )
    chains = _chain_results(results)
    if chains is not None:
        small, large = chains
        cold_small = {v.name: v.cold.median for v in small.variants}
        for v in large.variants:
            lines.append(
                f"  3. growth <= 10x and {large.files.spec.nodes} nodes <= 5x whole-model ORT, "
                f"{v.name}: growth "
                f"{fmt_ratio(ratio(v.cold.median, cold_small.get(v.name)))}, "
                f"{fmt_ratio(ratio(v.cold.median, _ort_whole(large)))} of ORT"
            )
        mem = {m.name: m for m in large.memory}
        if MEMORY_BASE in mem:
            for m in large.memory:
                if m.name != MEMORY_BASE:
                    lines.append(
                        f"  4. peak memory on {large.files.spec.name}, {m.name}: steady "
                        f"{fmt_mb(m.steady)} ({fmt_ratio(ratio(m.steady, mem[MEMORY_BASE].steady))}"
                        " of whole-model ORT)"
                    )
    fails = {r.files.spec.name: {v.name: v.failing for v in r.variants} for r in results}
    lines.append(f"  zero failing pairs: {fails}")
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
    p.add_argument(
        "--models", default=DEFAULT_MODELS, help=f"comma-separated, from: {DEFAULT_MODELS}"
    )
    p.add_argument("--repeats", type=int, default=5, help="timed runs per measurement")
    p.add_argument("--theirs-repeats", type=int, default=3, help="timed runs of the prior art")
    p.add_argument("--memory-repeats", type=int, default=2, help="subprocesses per variant")
    p.add_argument(
        "--fresh-repeats",
        type=int,
        default=2,
        help="fresh processes per variant for the cold runs from files (0: none)",
    )
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    p.add_argument("--no-theirs", action="store_true", help="skip onnx-diagnostic")
    p.add_argument("--profile", action="store_true", help="cProfile our engine on each model")
    p.add_argument("--workdir", help="folder for the exported models (default: a temp folder)")
    p.add_argument(
        "--reuse", action="store_true", help="reuse the exports an earlier run left in --workdir"
    )
    p.add_argument(
        "--torch-threads",
        type=int,
        help="torch.set_num_threads(N) for every measurement (default: torch's own choice)",
    )
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--fresh-child", help=argparse.SUPPRESS)
    p.add_argument("--files", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    warnings.simplefilter("ignore")
    if a.torch_threads:
        import torch

        torch.set_num_threads(a.torch_threads)
    if a.child:
        emit_result(child_memory(a.child, Path(a.files)))
        return 0
    if a.fresh_child:
        emit_result(child_fresh(a.fresh_child, Path(a.files)))
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
            all_files.append(export_spec(SPECS[m], root, reuse=a.reuse and a.workdir))
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
                    with_memory=not a.no_memory and files.spec != CHAIN500,
                    fresh_repeats=a.fresh_repeats if files.spec in (LARGE, LARGE12) else 0,
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
