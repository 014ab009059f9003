"""onnxruntime's whole-model session, as the optimized graph needs it.

A session at an optimization level on execution providers, what onnxruntime said while
building it (its log says, for each graph transformer, whether it modified the graph), the
model it wrote after its optimizations, and the plumbing around them: a temporary folder
per process, models over protobuf's 2 GiB handed over as files, the types of the values
onnxruntime created.  :mod:`.optimized` maps that model onto the original.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from ...errors import SbsInputError
from ...files import atomic_folder, make_parent, write_bytes_atomic
from ...option_names import OPTIMIZE_LEVELS

# optimize= levels, mildest first; "layout" exists from onnxruntime 1.22 on
LEVELS = OPTIMIZE_LEVELS


_ORT_LEVEL_NAMES = {
    "disabled": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "layout": "ORT_ENABLE_LAYOUT",
    "all": "ORT_ENABLE_ALL",
}


_TRANSFORMER_LINE = re.compile(r"GraphTransformer (\S+) modified: (\d)")


_ORT_INFO = re.compile(r"\[[IV]:onnxruntime")


# expected whenever a level above "extended" is saved: we run it where it was made
_HARDWARE_WARNING = "may contain hardware specific optimizations"


# protobuf cannot serialise 2 GiB; beyond this much weight data the model goes through a file
_INLINE_LIMIT = 1 << 30


@dataclass
class SessionInfo:
    """A whole-model session and what onnxruntime said while building it."""

    session: Any  # onnxruntime.InferenceSession
    applied: list[str]  # optimizers that modified the graph (empty when the log is unreadable)
    log_read: bool  # False: this process's stderr could not be captured
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------- temp files
_PROCESS_TMP: Path | None = None


_TMP_LOCK = threading.Lock()


def process_temp_dir() -> Path:
    """This process's own temporary folder, removed at exit."""
    global _PROCESS_TMP
    with _TMP_LOCK:
        if _PROCESS_TMP is None or not _PROCESS_TMP.is_dir():
            _PROCESS_TMP = Path(tempfile.mkdtemp(prefix=f"onnx_sbs_nb_{os.getpid()}_"))
            atexit.register(shutil.rmtree, _PROCESS_TMP, True)
        return _PROCESS_TMP


def _weight_bytes(model: onnx.ModelProto) -> int:
    total = 0
    for init in model.graph.initializer:
        total += len(init.raw_data) if init.raw_data else init.ByteSize()
    return total


def save_model(model: onnx.ModelProto, path: str | os.PathLike) -> Path:
    """Saves ``model`` at ``path``; its weights go to ``<name>.data`` beside it when they
    are too large for one protobuf.  The caller's model keeps its weights."""
    path = Path(path)
    if _weight_bytes(model) < _INLINE_LIMIT:
        write_bytes_atomic(path, model.SerializeToString())
        return path
    # onnx.save moves the weights out of the proto it saves: save a copy, the caller's
    # model stays whole (the copy lives only while the file is written)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    # onnx appends to the data file it names: both are written in a fresh folder
    with atomic_folder(make_parent(path).parent) as tmp:
        onnx.save(
            copy, str(tmp / path.name), save_as_external_data=True, location=path.name + ".data"
        )
    del copy
    return path


@contextlib.contextmanager
def _session_source(model: onnx.ModelProto, folder: Path) -> Iterator[str | bytes]:
    """What to hand onnxruntime: the serialised model, or a file when it is too large."""
    if _weight_bytes(model) < _INLINE_LIMIT:
        yield model.SerializeToString()
        return
    yield str(save_model(model, folder / "input.onnx"))


# ---------------------------------------------------------------- onnxruntime
def _ort():
    import onnxruntime

    return onnxruntime


def ort_level(level: str) -> Any:
    ort = _ort()
    name = _ORT_LEVEL_NAMES.get(level)
    if name is None or not hasattr(ort.GraphOptimizationLevel, name):
        known = [lv for lv in LEVELS if hasattr(ort.GraphOptimizationLevel, _ORT_LEVEL_NAMES[lv])]
        raise SbsInputError(f"optimize={level!r} is not a level: use one of {known}")
    return getattr(ort.GraphOptimizationLevel, name)


def check_providers(providers: Sequence[Any] | None) -> list[Any]:
    """The providers to use (CPU by default); an unavailable one is an input error."""
    if providers is None:
        return ["CPUExecutionProvider"]
    if isinstance(providers, str):
        providers = [providers]
    available = _ort().get_available_providers()
    out = []
    for p in providers:
        name = p[0] if isinstance(p, tuple | list) else p
        if name not in available:
            raise SbsInputError(
                f"execution provider {name!r} is not available in this onnxruntime build "
                f"(available: {available}): install the onnxruntime package that has it "
                "(onnxruntime-gpu for CUDAExecutionProvider) or pick one of those"
            )
        out.append(tuple(p) if isinstance(p, list) else p)
    return out


_STDERR_LOCK = threading.Lock()


@contextlib.contextmanager
def _captured_stderr() -> Iterator[list[str]]:
    """Captures what native code writes to file descriptor 2 (onnxruntime's log).

    Yields a list that holds the captured text once the block ends; stays empty when the
    descriptor cannot be redirected.  Lines that are not onnxruntime's info log are
    written back, so nothing another thread printed meanwhile is lost.
    """
    out: list[str] = []
    with _STDERR_LOCK:
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):
            yield out
            return
        with tempfile.TemporaryFile(dir=process_temp_dir()) as f:
            os.dup2(f.fileno(), 2)
            try:
                yield out
            finally:
                os.dup2(saved, 2)
                os.close(saved)
                f.seek(0)
                out.append(f.read().decode("utf-8", "replace"))


def _parse_log(text: str) -> tuple[list[str], list[str], list[str]]:
    """(optimizers that modified the graph, notes, lines to give back to stderr)."""
    applied: list[str] = []
    notes: list[str] = []
    others: list[str] = []
    for line in text.splitlines():
        m = _TRANSFORMER_LINE.search(line)
        if m:
            if m.group(2) == "1" and m.group(1) not in applied:
                applied.append(m.group(1))
            continue
        if _ORT_INFO.search(line):
            continue
        if _HARDWARE_WARNING in line:
            notes.append(
                "onnxruntime: the optimized model may hold hardware-specific kernels "
                "(NCHWc layout); it is run here, on the machine that made it"
            )
            continue
        if line.strip():
            others.append(line)
    return applied, notes, others


def ort_session(
    model: onnx.ModelProto,
    level: str,
    providers: Sequence[Any] | None = None,
    *,
    disabled_optimizers: Sequence[str] = (),
    optimized_model_path: str | Path | None = None,
    session_config: dict[str, str] | None = None,
) -> SessionInfo:
    """A whole-model session at ``level`` ("disabled" too), reading what it applied."""
    ort = _ort()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort_level(level)
    # INFO is where each graph transformer says whether it modified the graph
    so.log_severity_level = 1
    for k, v in (session_config or {}).items():
        so.add_session_config_entry(k, v)
    if optimized_model_path is not None:
        path = Path(optimized_model_path)
        so.optimized_model_filepath = str(path)
        # weights go to a side file: an optimized model can exceed protobuf's 2 GiB
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", path.name + ".data"
        )
        so.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024"
        )
    providers = check_providers(providers)
    kwargs: dict[str, Any] = {}
    if disabled_optimizers:
        kwargs["disabled_optimizers"] = list(disabled_optimizers)
    with tempfile.TemporaryDirectory(dir=process_temp_dir()) as folder:
        with _session_source(model, Path(folder)) as source, _captured_stderr() as log:
            try:
                session = ort.InferenceSession(source, so, providers=providers, **kwargs)
                error = None
            except Exception as e:
                session, error = None, e
    text = log[0] if log else ""
    applied, notes, others = _parse_log(text)
    if others:
        sys.stderr.write("\n".join(others) + "\n")
    if error is not None:
        raise SbsInputError(
            f"onnxruntime could not build a session at level {level!r} on {providers} "
            f"({type(error).__name__}: {str(error).strip()[:500]})"
        ) from error
    log_read = (bool(log) and "GraphTransformer" in text) or level == "disabled"
    return SessionInfo(session, applied, log_read, notes)


def declare_types(model: onnx.ModelProto, providers: Sequence[Any]) -> None:
    """Declares the type of every value onnxruntime created (it writes none).

    A value of unknown type pairs with anything of the same name or metadata; a float32
    value computing a float16 one would then be compared as if it were that value.  The
    types come from onnxruntime itself (it knows its contrib ops), from a session of the
    graph without its weights: the initializers become typed inputs, nothing is folded.
    """
    g = model.graph
    known = {vi.name for vi in [*g.value_info, *g.input, *g.output]}
    known |= {i.name for i in g.initializer}
    missing = [o for n in g.node for o in n.output if o and o not in known]
    if not missing:
        return
    ort = _ort()
    light = onnx.ModelProto()  # no weight is copied
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    lg = light.graph
    lg.node.extend(g.node)
    lg.input.extend(g.input)
    lg.input.extend(
        onnx.helper.make_tensor_value_info(i.name, i.data_type, list(i.dims)) for i in g.initializer
    )
    lg.output.extend(g.output)
    lg.output.extend(onnx.ValueInfoProto(name=o) for o in missing)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        sess = ort.InferenceSession(light.SerializeToString(), so, providers=list(providers))
    except Exception:  # a kernel that insists on constant weights: types stay unknown
        return
    wanted = set(missing)
    for out in sess.get_outputs():
        if out.name not in wanted or not out.type.startswith("tensor("):
            continue
        elem = getattr(onnx.TensorProto, out.type[7:-1].upper(), None)
        if elem is None:
            continue
        dims = [d if isinstance(d, int) else None for d in (out.shape or [])]
        g.value_info.append(onnx.helper.make_tensor_value_info(out.name, elem, dims))


__all__ = [
    "LEVELS",
    "SessionInfo",
    "check_providers",
    "declare_types",
    "ort_level",
    "ort_session",
    "process_temp_dir",
    "save_model",
]
