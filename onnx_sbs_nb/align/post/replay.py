"""Replay bundles: a folder per suspect node that anyone can rerun with ``python replay.py``.

:class:`ReplayConfig` selects the nodes (by name, op type, error threshold) and saves to
JSON so a selection can be reapplied to a new export; :func:`write_replay_bundle` writes
one folder.  Folder names come from model-supplied names, which are untrusted: they are
sanitised and the final path is checked to stay inside the chosen root.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx
import torch

from ...dtypes import np_to_onnx_dtype, onnx_to_torch_dtype, torch_to_onnx_dtype
from ...files import atomic_folder
from ...records import Record
from ..engine.replay_config import ReplayConfig
from .submodel import extract_submodel, find_node, prefix_model, submodel_inputs

TEMPLATE = pathlib.Path(__file__).with_name("replay_template.py")
PROTOBUF_LIMIT = 1_800_000_000  # bytes; protobuf refuses to serialise 2 GB
MAX_DIRNAME = 64  # characters kept from the node name, before the hash

BUNDLE_FILES = frozenset(
    {
        "model.onnx",
        "model.onnx.data",
        "prefix_model.onnx",
        "prefix_model.onnx.data",
        "torch_inputs.pt",
        "onnx_inputs.pt",
        "expected.pt",
        "prefix_inputs.pt",
        "mapping.json",
        "record.json",
        "node.json",
        "replay.py",
    }
)

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_dirname(name: str) -> str:
    """A folder name from an untrusted node name: [A-Za-z0-9._-] only, bounded, unique.

    A short hash of the original name keeps two names that sanitise alike apart.
    """
    digest = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    stem = _UNSAFE.sub("_", name)[:MAX_DIRNAME].strip("._-")
    return f"{stem or 'node'}-{digest}"


def safe_child(root: str | os.PathLike[str], name: str) -> pathlib.Path:
    """``root/<safe_dirname(name)>``, verified to resolve inside ``root``."""
    root_path = pathlib.Path(root).resolve()
    child = (root_path / safe_dirname(name)).resolve()
    if child.parent != root_path:
        raise ValueError(f"refusing to write {child}: it is not directly inside {root_path}")
    return child


def model_fingerprint(model: onnx.ModelProto) -> str:
    """A short digest of a model's graph: its nodes (with their attributes) and its
    weights' names, types and shapes, not their bytes (a 2 GB model is not read again).
    Two models share one only when they are the same graph."""
    h = hashlib.sha1()
    for n in model.graph.node:
        h.update(n.SerializeToString())
    for t in model.graph.initializer:
        h.update(f"{t.name}\0{t.data_type}\0{list(t.dims)}\0".encode("utf-8", "surrogatepass"))
    for v in (*model.graph.input, *model.graph.output):
        h.update(v.SerializeToString())
    return h.hexdigest()[:16]


def _bundle_folder(root: str | os.PathLike[str], node_name: str, fingerprint: str) -> pathlib.Path:
    """Where the bundle of ``node_name`` goes: its own folder, written again for the same
    model, a new one (``-2``, ``-3``...) when that name holds another model's bundle, so
    saving ``mul_19`` of two models into one folder keeps both."""
    first = safe_child(root, node_name)
    for k in range(1, 1000):
        folder = first if k == 1 else first.with_name(f"{first.name}-{k}")
        if not folder.is_dir() or folder.is_symlink():
            return folder  # free (or in the way: writing there fails and says so)
        if _bundle_fingerprint(folder) == fingerprint:
            return folder  # this model's bundle of this node: refreshed
    raise ValueError(f"1000 bundles of {node_name!r} in {root}: choose another folder")


def _bundle_fingerprint(folder: pathlib.Path) -> str | None:
    """The model fingerprint a bundle's node.json names (None: not a bundle of ours)."""
    path = folder / "node.json"
    try:
        if path.is_symlink() or not path.is_file() or path.stat().st_size > 1 << 20:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = data.get("model_fingerprint") if isinstance(data, dict) else None
    return value if isinstance(value, str) else None


def _as_tensor(value: Any, name: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        t = value.detach()
    elif isinstance(value, np.ndarray):
        elem = np_to_onnx_dtype(value.dtype)
        dtype = onnx_to_torch_dtype(elem)
        arr = np.ascontiguousarray(value)
        if arr.dtype.name == "bfloat16" or arr.dtype.name.startswith("float8"):
            # ml_dtypes arrays: reinterpret the bits, numpy cannot hand them to torch
            bits = {1: np.uint8, 2: np.int16}[arr.dtype.itemsize]
            t = torch.from_numpy(arr.view(bits).copy()).view(dtype)
        else:
            t = torch.from_numpy(arr.copy())
    elif isinstance(value, (int, float, bool)):
        t = torch.tensor(value)
    else:
        raise TypeError(f"value {name!r} is a {type(value).__name__}, expected a tensor or array")
    # a compact CPU copy: saving a view would save its whole storage
    return t.to("cpu").clone()


def _save_tensors(path: pathlib.Path, tensors: Mapping[str, Any]) -> None:
    torch.save({str(k): _as_tensor(v, k) for k, v in tensors.items()}, path)


def _save_model(model: onnx.ModelProto, path: pathlib.Path) -> None:
    """Written in the bundle's fresh folder (see write_replay_bundle)."""
    if model.ByteSize() < PROTOBUF_LIMIT:
        onnx.save_model(model, str(path))
        return
    # beyond protobuf's 2 GB the weights go to a file next to the model, in the bundle
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=0,
    )


def _write_json(path: pathlib.Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=1, default=str), encoding="utf-8")


def write_replay_bundle(
    root: str | os.PathLike[str],
    *,
    model: onnx.ModelProto,
    node_name: str,
    torch_inputs: Mapping[str, torch.Tensor],
    onnx_inputs: Mapping[str, np.ndarray | torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    mapping: Mapping[str, str],
    record: Record | None = None,
    prefix_inputs: Mapping[str, Any] | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> pathlib.Path:
    """Write the replay bundle of ``node_name`` in ``root/<sanitised name>`` and return it.

    ``torch_inputs`` / ``onnx_inputs`` are keyed by ONNX value names: the values with a
    torch partner the sub-model starts from (it walks back from the node's inputs to the
    nearest names present in ``torch_inputs``; initializers stay inside the sub-model).
    ``expected`` holds the torch values of the node's outputs, keyed by ONNX output name
    (outputs without a torch partner may be left out);
    ``mapping`` maps ONNX value names to fx node names.  ``prefix_inputs`` (the original
    model inputs, by ONNX name) also writes ``prefix_model.onnx``.  ``base_dir`` is where
    the model's external data lives, if any.
    """
    if not isinstance(model, onnx.ModelProto):
        raise TypeError(f"model must be an onnx.ModelProto, not {type(model).__name__}")
    _, node = find_node(model, node_name)
    inputs = submodel_inputs(model, node.name or node_name, lambda n: n in torch_inputs)
    missing_t = [n for n in inputs if n not in torch_inputs]
    missing_o = [n for n in inputs if n not in onnx_inputs]
    if missing_t or missing_o:
        raise ValueError(
            f"the sub-model of {node_name!r} starts from {inputs}; torch_inputs lacks "
            f"{missing_t} and onnx_inputs lacks {missing_o}"
        )
    outputs = [o for o in node.output if o]
    unknown = [n for n in expected if n not in outputs]
    if unknown:
        raise ValueError(
            f"expected has {unknown}, which are not outputs of node {node_name!r}: {outputs}"
        )

    t_inputs = {n: _as_tensor(torch_inputs[n], n) for n in inputs}
    o_inputs = {n: _as_tensor(onnx_inputs[n], n) for n in inputs}
    # an output without a torch partner has no expected value: replay.py still compares
    # the run on torch inputs with the run on ONNX inputs for it
    exp = {n: _as_tensor(expected[n], n) for n in outputs if n in expected}
    # real shapes from the run; element types as the ONNX side has them
    value_shapes: dict[str, tuple[int, list[int]]] = {
        n: (torch_to_onnx_dtype(o_inputs[n].dtype), list(o_inputs[n].shape)) for n in inputs
    }
    known = {vi.name: vi for vi in (*model.graph.value_info, *model.graph.output)}
    for n in exp:
        elem = known[n].type.tensor_type.elem_type if n in known else 0
        value_shapes[n] = (elem or torch_to_onnx_dtype(exp[n].dtype), list(exp[n].shape))

    sub = extract_submodel(model, node.name or node_name, inputs, value_shapes, base_dir=base_dir)
    prefix = None
    p_inputs: dict[str, torch.Tensor] = {}
    if prefix_inputs is not None:
        prefix = prefix_model(model, node.name or node_name, base_dir=base_dir)
        needed = [i.name for i in prefix.graph.input]
        lacking = [n for n in needed if n not in prefix_inputs]
        if lacking:
            raise ValueError(f"prefix_inputs lacks the model inputs {lacking}")
        p_inputs = {n: _as_tensor(prefix_inputs[n], n) for n in needed}

    fingerprint = model_fingerprint(model)
    folder = _bundle_folder(root, node.name or node_name, fingerprint)
    folder.mkdir(parents=True, exist_ok=True)
    # re-check after creation: a symlink planted at that name must not redirect writes
    if folder.resolve() != folder or folder.is_symlink():
        raise ValueError(f"refusing to write into {folder}: it resolves elsewhere")
    for leftover in folder.iterdir():
        # a bundle written again must not keep files of the previous one (a stale prefix
        # model); links planted at the names written are replaced by atomic_folder
        if leftover.is_symlink() or leftover.name in BUNDLE_FILES:
            leftover.unlink()
    with atomic_folder(folder) as tmp:
        _write_bundle_files(
            tmp, sub, t_inputs, o_inputs, exp, mapping, record, node, inputs, fingerprint
        )
        if prefix is not None:
            _save_model(prefix, tmp / "prefix_model.onnx")
            _save_tensors(tmp / "prefix_inputs.pt", p_inputs)
    return folder


def _write_bundle_files(
    folder: pathlib.Path,
    sub: onnx.ModelProto,
    t_inputs: Mapping[str, torch.Tensor],
    o_inputs: Mapping[str, torch.Tensor],
    exp: Mapping[str, torch.Tensor],
    mapping: Mapping[str, str],
    record: Record | None,
    node: onnx.NodeProto,
    inputs: list[str],
    fingerprint: str,
) -> None:
    outputs = [o for o in node.output if o]
    _save_model(sub, folder / "model.onnx")
    _save_tensors(folder / "torch_inputs.pt", t_inputs)
    _save_tensors(folder / "onnx_inputs.pt", o_inputs)
    _save_tensors(folder / "expected.pt", exp)
    _write_json(folder / "mapping.json", {str(k): v for k, v in mapping.items()})
    _write_json(folder / "record.json", None if record is None else record.to_dict())
    _write_json(
        folder / "node.json",
        {
            "node_name": node.name,
            "op_type": node.op_type,
            "domain": node.domain,
            "inputs": inputs,
            "outputs": outputs,
            "model_fingerprint": fingerprint,
            "versions": {
                "torch": torch.__version__,
                "onnx": onnx.__version__,
            },
        },
    )
    shutil.copyfile(TEMPLATE, folder / "replay.py")


__all__ = ["ReplayConfig", "safe_child", "safe_dirname", "write_replay_bundle"]
