"""Weights a model keeps in an external data file, read in place.

A model above 2 GB keeps its weights beside it (``model.onnx.data``).  Loaded whole, they
are a second copy of the weights in memory next to the program's own; compared one at a
time, each needs only its pages.  :func:`defer_external_data` checks every external
reference of a model loaded without its data (each must point into the model's folder,
inside its file, with the size its shape and type say) and loads the small ones; large
initializers stay in the file, and :func:`external_array` maps one when a node or a
comparison reads it: a read-only array over the file's pages, unmapped when the array
goes, so the pages leave the process with it.
"""

from __future__ import annotations

import math
import mmap
import os
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper

from .errors import SbsInputError

# an initializer at least this large stays in its file until read
DEFERRED_BYTES = 1 << 20

_PAGE = mmap.ALLOCATIONGRANULARITY


_T = onnx.TensorProto
# element types whose raw bytes are one element after another, as numpy lays them out
_PLAIN_TYPES = frozenset(
    {
        _T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.BFLOAT16, _T.BOOL,
        _T.INT8, _T.INT16, _T.INT32, _T.INT64, _T.UINT8, _T.UINT16, _T.UINT32, _T.UINT64,
    }
)  # fmt: skip


def np_dtype(data_type: int) -> np.dtype | None:
    """The array type of a tensor of a plain element type (None for packed, string and
    other types, which are loaded as onnx loads them)."""
    if data_type not in _PLAIN_TYPES:
        return None
    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(data_type))


def _entries(tensor: onnx.TensorProto) -> dict[str, str]:
    return {e.key: e.value for e in tensor.external_data}


def _where(tensor: onnx.TensorProto, folder: Path) -> tuple[Path, int, int]:
    """(file, offset, length) of an external tensor, checked: inside ``folder``, inside
    the file, of the size its shape and type say."""
    entries = _entries(tensor)
    name = tensor.name or "<constant>"
    location = entries.get("location", "")
    target = (folder / location).resolve()
    if not location or os.path.isabs(location) or not target.is_relative_to(folder):
        raise SbsInputError(
            f"tensor {name!r} keeps its data at {location!r}, outside the model's folder "
            f"{str(folder)!r}: an ONNX model may only refer to files beside it"
        )
    if target.exists() and not target.is_file():
        # a FIFO or a device would block or never end a read; a folder holds no data
        raise SbsInputError(
            f"tensor {name!r} keeps its data in {str(target)!r}, which is not a regular file "
            "(a folder, a FIFO or a device): keep the .onnx file and its data file together"
        )
    if not target.is_file():
        raise SbsInputError(
            f"tensor {name!r} keeps its data in {str(target)!r}, which does not exist: keep "
            "the .onnx file and its data file together"
        )
    try:
        offset = int(entries.get("offset", "0"))
        length = int(entries["length"]) if "length" in entries else None
    except ValueError:
        raise SbsInputError(f"tensor {name!r} has a malformed offset or length") from None
    size = target.stat().st_size
    dtype = np_dtype(tensor.data_type)
    expected = math.prod(tensor.dims) * dtype.itemsize if dtype is not None else None
    if length is None:
        length = expected if expected is not None else size - offset
    if offset < 0 or length < 0 or offset + length > size:
        raise SbsInputError(
            f"tensor {name!r} asks bytes {offset} to {offset + length} of {str(target)!r}, "
            f"which holds {size}: the data file is truncated or not this model's"
        )
    if expected is not None and length != expected:
        raise SbsInputError(
            f"tensor {name!r} declares {length} bytes of data, its shape and type "
            f"{expected}: the data file is not this model's"
        )
    return target, offset, length


def tensors_of(graph: onnx.GraphProto, top: bool):
    """(tensor, whether it is a top-level initializer) for every tensor of a graph."""
    for t in graph.initializer:
        yield t, top
    for node in graph.node:
        for att in node.attribute:
            if att.type == onnx.AttributeProto.TENSOR:
                yield att.t, False
            elif att.type == onnx.AttributeProto.TENSORS:
                for t in att.tensors:
                    yield t, False
            elif att.type == onnx.AttributeProto.GRAPH:
                yield from tensors_of(att.g, False)
            elif att.type == onnx.AttributeProto.GRAPHS:
                for g in att.graphs:
                    yield from tensors_of(g, False)


def defer_external_data(model: onnx.ModelProto, folder: Path) -> int:
    """Checks every external reference of ``model`` (loaded without its data) against
    ``folder``; loads those under :data:`DEFERRED_BYTES`, in subgraphs or of packed types,
    and leaves the large initializers in their file.  Returns how many it left."""
    folder = folder.resolve()
    left = 0
    for tensor, top in tensors_of(model.graph, True):
        if not external_data_helper.uses_external_data(tensor):
            continue
        _, _, length = _where(tensor, folder)
        if top and length >= DEFERRED_BYTES and np_dtype(tensor.data_type) is not None:
            left += 1
            continue
        external_data_helper.load_external_data_for_tensor(tensor, str(folder))
        tensor.data_location = onnx.TensorProto.DEFAULT
        del tensor.external_data[:]
    return left


def check_external_data(model: onnx.ModelProto, folder: Path) -> None:
    """Checks every external reference of ``model`` (loaded without its data) as
    :func:`defer_external_data` does, loading nothing."""
    folder = folder.resolve()
    for tensor, _ in tensors_of(model.graph, True):
        if external_data_helper.uses_external_data(tensor):
            _where(tensor, folder)


def is_deferred(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def external_array(tensor: onnx.TensorProto, folder: Path) -> np.ndarray:
    """The values of a deferred tensor, mapped read-only from its file."""
    target, offset, length = _where(tensor, folder.resolve())
    dtype = np_dtype(tensor.data_type)
    assert dtype is not None  # defer_external_data leaves no other type in a file
    start = offset - offset % _PAGE
    with open(target, "rb") as f:
        pages = mmap.mmap(
            f.fileno(), length + offset - start, access=mmap.ACCESS_READ, offset=start
        )
    # the array holds the mapping: it is unmapped when the array (and its views) go
    flat = np.frombuffer(pages, dtype=dtype, count=length // dtype.itemsize, offset=offset - start)
    return flat.reshape(tuple(tensor.dims))


def load_deferred(model: onnx.ModelProto, folder: Path) -> None:
    """Loads every deferred tensor into the model (for what needs the whole model in
    memory: onnxruntime's optimized graph of it, say)."""
    for tensor, _ in tensors_of(model.graph, True):
        if is_deferred(tensor):
            external_data_helper.load_external_data_for_tensor(tensor, str(folder.resolve()))
            tensor.data_location = onnx.TensorProto.DEFAULT
            del tensor.external_data[:]


__all__ = [
    "check_external_data",
    "np_dtype",
    "tensors_of",
    "DEFERRED_BYTES",
    "defer_external_data",
    "external_array",
    "is_deferred",
    "load_deferred",
]
