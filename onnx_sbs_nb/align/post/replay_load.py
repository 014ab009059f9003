"""Opening a replay bundle someone else wrote, without running anything from it.

A bundle ships its own ``replay.py``: running it runs whatever that file holds, so it is
for bundles you wrote yourself.  :func:`load_replay` (``onnx-sbs replay BUNDLE``) reads a
bundle with the package's own code: tensors with ``torch.load(weights_only=True)``, the
JSON files bounded in size and depth, the ONNX sub-models checked as any model is (every
external reference inside the bundle, no cycle or value computed by nobody, nesting
bounded, data matching dims) before onnxruntime runs them.  The bundle's ``replay.py``
is never read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...errors import SbsInputError
from ..source.loading import load_onnx_model
from ..source.model_check import check_model, check_opset
from ..source.pt2_sizes import check_pt_sizes
from ..source.untrusted_pt2 import unpickling_reason
from .replay_guard import check_replay_memory

# a JSON file of a bundle larger than this is no file onnx-sbs wrote
MAX_JSON_BYTES = 64 << 20


@dataclass
class Replay:
    """What :func:`load_replay` found: the node, and per output its comparisons."""

    folder: Path
    node: str | None
    op_type: str | None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)  # per run: why it failed
    recorded: dict[str, Any] | None = None  # the errors the run recorded

    def to_text(self) -> str:
        from .replay_template import _clean, _fmt

        lines = [f"node {_clean(self.node)} ({_clean(self.op_type)}): {_clean(self.folder)}"]
        for e in self.outputs:
            lines.append(f"  output {_clean(e['name'])} (fx: {_clean(e['fx_name'])})")
            if not e["has_expected"]:
                lines.append("    no torch value to compare with (no torch partner)")
            for label in ("torch_inputs", "onnx_inputs"):
                c = e.get(label)
                if not e["has_expected"]:
                    break
                if c is None:
                    lines.append(f"    on {label:<12}: {_clean(self.errors.get(label, '-'))}")
                elif c["error"]:
                    lines.append(f"    on {label:<12}: {_clean(c['error'])}")
                else:
                    lines.append(
                        f"    on {label:<12}: max abs {_fmt(c['max_abs'])}  max rel "
                        f"{_fmt(c['max_rel'])}  nan/inf mismatches {c['nan']}"
                    )
        if self.recorded:
            r = self.recorded
            lines.append(
                f"  recorded during the run: err_abs {_fmt(r.get('err_abs'))}  "
                f"own err_abs2 {_fmt(r.get('err_abs2'))}"
            )
        return "\n".join(lines)


def _json(folder: Path, name: str) -> Any:
    path = folder / name
    if not path.exists():
        return None
    if not path.is_file() or path.stat().st_size > MAX_JSON_BYTES:
        raise SbsInputError(f"{str(path)!r} is not a file onnx-sbs wrote in a replay bundle")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, RecursionError, UnicodeDecodeError) as e:
        raise SbsInputError(f"{str(path)!r} is not valid JSON ({type(e).__name__})") from None


def _tensors(folder: Path, name: str, required: bool = True) -> dict[str, torch.Tensor] | None:
    path = folder / name
    if not path.exists() and not required:
        return None
    if not path.is_file():
        raise SbsInputError(f"the replay bundle {str(folder)!r} has no file {name}")
    check_pt_sizes(path, "the bundle's")  # before torch.load inflates anything
    try:
        value = torch.load(str(path), weights_only=True, map_location="cpu")
    except Exception as e:
        reason = unpickling_reason(e) or f"{type(e).__name__}: {e}"
        raise SbsInputError(f"{str(path)!r} was not loaded: {reason}") from None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in value.items()
    ):
        raise SbsInputError(f"{str(path)!r} does not hold tensors by name, as a bundle's do")
    return value


def _checked_model(folder: Path, name: str) -> Path:
    path = folder / name
    if not path.is_file():
        raise SbsInputError(f"the replay bundle {str(folder)!r} has no file {name}")
    # every external reference inside the bundle, checked before onnxruntime opens one
    model = load_onnx_model(path, defer_weights=True)
    check_model(model)
    check_opset(model)
    return path


def load_replay(path: str | os.PathLike[str]) -> Replay:
    """Reads the replay bundle at ``path`` and runs its sub-model with onnxruntime on the
    torch inputs and on the ONNX inputs, each compared with the torch outputs; nothing in
    the bundle is executed (its ``replay.py`` is not read)."""
    from .replay_template import compare, run_model

    folder = Path(path)
    if not folder.is_dir():
        raise SbsInputError(f"{str(folder)!r} is not a replay bundle folder")
    model_path = _checked_model(folder, "model.onnx")
    node = _json(folder, "node.json") or {}
    mapping = _json(folder, "mapping.json") or {}
    record = _json(folder, "record.json")
    if not isinstance(node, dict) or not isinstance(mapping, dict):
        raise SbsInputError(f"{str(folder)!r}: node.json and mapping.json must be objects")
    expected = _tensors(folder, "expected.pt") or {}
    result = Replay(folder, node.get("node_name"), node.get("op_type"))
    runs: dict[str, dict[str, torch.Tensor] | None] = {}
    for label in ("torch_inputs", "onnx_inputs"):
        feeds = _tensors(folder, f"{label}.pt") or {}
        try:
            # the run's memory guard: an output larger than the memory free is not allocated
            check_replay_memory(str(model_path), feeds)
            runs[label], _ = run_model(str(model_path), feeds)
        except Exception as e:  # the failure itself is the reproduction
            runs[label] = None
            result.errors[label] = f"{type(e).__name__}: {e}"
    import onnx

    outputs = [o.name for o in onnx.load(str(model_path), load_external_data=False).graph.output]
    for name in outputs:
        entry: dict[str, Any] = {
            "name": name,
            "fx_name": mapping.get(name),
            "has_expected": name in expected,
        }
        for label, res in runs.items():
            ok = res is not None and name in res and name in expected
            entry[label] = compare(res[name], expected[name]) if ok else None
        result.outputs.append(entry)
    if isinstance(record, dict):
        result.recorded = {k: record.get(k) for k in ("err_abs", "err_rel", "err_abs2", "err_rel2")}
    return result


__all__ = ["Replay", "load_replay"]
