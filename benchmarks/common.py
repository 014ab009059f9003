"""Shared helpers for the benchmark scripts: model files, timing, peak memory, tables.

Run the scripts from the repository root (``python benchmarks/bench_engine.py``) or with
``PYTHONPATH`` pointing at it: they import ``onnx_sbs_nb`` and the test model builders
(``tests/models.py``) from the checkout, so they also run in a venv where the package is
not installed (the prior-art venv ``.venv-bench``).
"""

from __future__ import annotations

import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# A child prints its measurement on one line starting with this marker; everything else
# it prints (warnings, library chatter) is ignored by the parent.
RESULT_MARKER = "@@BENCH_RESULT "

MB = 1024.0 * 1024.0


# ---------------------------------------------------------------- models and files
@dataclass(frozen=True)
class LlamaSpec:
    """A tiny transformers Llama (random weights) as the benchmarks use it."""

    name: str
    hidden: int
    layers: int
    seq: int
    intermediate: int | None = None

    @property
    def label(self) -> str:
        inter = self.intermediate or 2 * self.hidden
        return f"{self.name} (h{self.hidden} i{inter} L{self.layers} s{self.seq})"


@dataclass(frozen=True)
class ChainSpec:
    """A chain of ``nodes`` elementwise ops (alternately ``x * 1.001`` and ``sin``) on a
    small tensor: one fx node and one ONNX node per op, so cost per node shows alone."""

    name: str
    nodes: int

    @property
    def label(self) -> str:
        return f"{self.name} (chain of {self.nodes} ops)"


def op_chain(nodes: int) -> Any:
    """The ChainSpec's torch.nn.Module (torch imported on first use)."""
    import torch

    class OpChain(torch.nn.Module):
        def forward(self, x):
            for i in range(nodes):
                x = torch.sin(x) if i % 2 else x * 1.001
            return x

    return OpChain()


@dataclass
class ModelFiles:
    """One exported model saved on disk, so that subprocesses load the same thing."""

    spec: LlamaSpec | ChainSpec
    folder: Path
    weight_bytes: int

    @property
    def ep_path(self) -> Path:
        return self.folder / "model.pt2"

    @property
    def onnx_path(self) -> Path:
        return self.folder / "model.onnx"

    @property
    def inputs_path(self) -> Path:
        return self.folder / "inputs.pt"

    def load(self) -> tuple[Any, Any, tuple[Any, ...]]:
        """(ExportedProgram, ModelProto, args), each a fresh object."""
        return load_exported(self.folder)


def export_llama(spec: LlamaSpec, root: Path) -> ModelFiles:
    """Exports the spec'd Llama once (torch.export + dynamo ONNX export) into root/<name>."""
    import onnx
    import torch

    from tests.models import tiny_llama

    folder = Path(root) / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    ep, onx, args = tiny_llama(spec.hidden, spec.layers, spec.seq, spec.intermediate)
    torch.export.save(ep, str(folder / "model.pt2"))
    onnx.save(onx, str(folder / "model.onnx"))
    torch.save(tuple(args), str(folder / "inputs.pt"))
    meta = {"spec": spec.__dict__, "weight_bytes": state_bytes(ep)}
    (folder / "meta.json").write_text(json.dumps(meta))
    return ModelFiles(spec, folder, meta["weight_bytes"])


def export_chain(spec: ChainSpec, root: Path) -> ModelFiles:
    """Exports the spec'd chain once into root/<name>."""
    import warnings

    import onnx
    import torch

    folder = Path(root) / spec.name
    folder.mkdir(parents=True, exist_ok=True)
    args = (torch.randn(4, 8),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(op_chain(spec.nodes).eval(), args)
        onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    torch.export.save(ep, str(folder / "model.pt2"))
    onnx.save(onx, str(folder / "model.onnx"))
    torch.save(tuple(args), str(folder / "inputs.pt"))
    meta = {"kind": "chain", "spec": spec.__dict__, "weight_bytes": state_bytes(ep)}
    (folder / "meta.json").write_text(json.dumps(meta))
    return ModelFiles(spec, folder, meta["weight_bytes"])


def export_spec(spec: LlamaSpec | ChainSpec, root: Path, reuse: bool = False) -> ModelFiles:
    """The files of ``spec`` in root/<name>: exported now, or (``reuse``) the ones an
    earlier run left there with the same spec (exports take minutes on large chains)."""
    folder = Path(root) / spec.name
    if reuse and (folder / "meta.json").exists():
        files = model_files(folder)
        if files.spec == spec and all(
            p.exists() for p in (files.ep_path, files.onnx_path, files.inputs_path)
        ):
            return files
    return export_chain(spec, root) if isinstance(spec, ChainSpec) else export_llama(spec, root)


def model_files(folder: Path) -> ModelFiles:
    """The ModelFiles saved by export_llama or export_chain in folder."""
    meta = json.loads((Path(folder) / "meta.json").read_text())
    kind = ChainSpec if meta.get("kind") == "chain" else LlamaSpec
    return ModelFiles(kind(**meta["spec"]), Path(folder), int(meta["weight_bytes"]))


def load_exported(folder: Path) -> tuple[Any, Any, tuple[Any, ...]]:
    import onnx
    import torch

    folder = Path(folder)
    ep = torch.export.load(str(folder / "model.pt2"))
    onx = onnx.load(str(folder / "model.onnx"))
    args = torch.load(str(folder / "inputs.pt"), weights_only=True)
    return ep, onx, tuple(args)


def state_bytes(ep: Any) -> int:
    """Bytes of the program's weights, buffers and constants (shared storage counted once)."""
    import torch

    seen: set[int] = set()
    total = 0
    for value in [*ep.state_dict.values(), *ep.constants.values()]:
        if not isinstance(value, torch.Tensor):
            continue
        ptr = value.untyped_storage().data_ptr()
        if ptr in seen:
            continue
        seen.add(ptr)
        total += value.untyped_storage().nbytes()
    return total


def has_onnx_diagnostic() -> bool:
    return importlib.util.find_spec("onnx_diagnostic") is not None


# ---------------------------------------------------------------- timing
@dataclass
class Timings:
    """Repeated wall-clock measurements of one thing; the machine is shared, so the
    median is the headline and the minimum the best case."""

    values: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    @property
    def min(self) -> float:
        return min(self.values) if self.values else float("nan")


def time_call(fn: Callable[[], Any]) -> tuple[float, Any]:
    t = time.perf_counter()
    result = fn()
    return time.perf_counter() - t, result


def repeat_timed(
    fn: Callable[[], Any], repeats: int, setup: Callable[[], Any] | None = None
) -> tuple[Timings, Any]:
    """Times fn ``repeats`` times; ``setup()`` (untimed) builds fn's argument each time."""
    timings = Timings()
    result = None
    for _ in range(max(1, repeats)):
        arg = setup() if setup is not None else None
        gc.collect()
        t = time.perf_counter()
        result = fn(arg) if setup is not None else fn()
        timings.values.append(time.perf_counter() - t)
        del arg
    return timings, result


# ---------------------------------------------------------------- peak memory
def _status_kb(key: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss() -> int:
    kb = _status_kb("VmRSS")
    if kb is not None:
        return kb * 1024
    import psutil

    return psutil.Process().memory_info().rss


def _reset_high_water_mark() -> bool:
    """Resets the kernel's peak-RSS counter (VmHWM) of this process (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return _status_kb("VmHWM") is not None


class PeakRss:
    """Peak resident memory of this process while the block runs, above the RSS at entry.

    Preferred method: reset the kernel's high-water mark (``/proc/self/clear_refs``) at
    entry and read ``VmHWM`` at exit: exact, catches spikes of any length, costs nothing.
    Fallback (other OSes, restricted /proc): a thread samples RSS with psutil every
    millisecond, which can miss spikes shorter than that.
    """

    def __init__(self, interval: float = 0.001):
        self.interval = interval
        self.method = ""
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def increase(self) -> int:
        return max(0, self.peak - self.baseline)

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.baseline = current_rss()
        if _reset_high_water_mark():
            self.method = "VmHWM"
        else:
            self.method = "psutil-sampling"
            self.peak = self.baseline
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        import psutil

        proc = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, proc.memory_info().rss)
            time.sleep(self.interval)

    def __exit__(self, *exc: Any) -> None:
        if self.method == "VmHWM":
            self.peak = (_status_kb("VmHWM") or 0) * 1024
        else:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()
        self.peak = max(self.peak, current_rss())


def emit_result(result: dict[str, Any]) -> None:
    """Child side: hands a JSON-safe dict back to the parent."""
    sys.stdout.flush()
    print(RESULT_MARKER + json.dumps(result), flush=True)


def run_child(
    script: Path,
    argv: Sequence[str],
    timeout: float = 1800,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Runs ``python script *argv`` in a fresh interpreter (same venv, ``env`` added to
    this process's environment) and returns the dict it emitted; raises with the child's
    stderr when it failed."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(script), *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=str(REPO_ROOT),
    )
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_MARKER):
            return json.loads(line[len(RESULT_MARKER) :])
    raise RuntimeError(
        f"benchmark child {script.name} {' '.join(argv)} failed (rc={proc.returncode}):\n"
        f"{proc.stderr[-4000:]}"
    )


def median_of(results: Sequence[dict[str, Any]], key: str) -> float:
    values = [r[key] for r in results if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------- printing
def fmt_s(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    return f"{x * 1000:.1f} ms" if x < 1 else f"{x:.2f} s"


def fmt_mb(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    return f"{x / MB:.1f} MB"


def fmt_ratio(x: float | None) -> str:
    if x is None or x != x:
        return "-"
    return f"{x:.2f}x" if x < 100 else f"{x:.0f}x"


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or a != a or b != b or b == 0:
        return None
    return a / b


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text (markdown-compatible) table."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cells[0]), sep, *(line(r) for r in cells[1:])])


def print_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    print(f"\n### {title}\n")
    print(format_table(headers, rows))
    sys.stdout.flush()
