"""Values between numpy and torch, for every dtype both sides can hold.

The bottom floor of the package: the engine, the evaluator and the comparisons all move
values through here.  numpy has no bfloat16 or float8 types; ``ml_dtypes`` provides them
and they cross over through a same-width integer view, without a copy.  Conversions
share memory whenever they can, and never hand out a writable alias of read-only data.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from .dtypes import ONNX_TO_TORCH, np_to_onnx_dtype
from .external import external_array, is_deferred

_T = onnx.TensorProto
# element types numpy holds itself: a tensor's raw bytes are its array, as
# numpy_helper.to_array reads them (without its lookups per call: a warm run converts each
# initializer once or twice)
_RAW_NP = {
    t: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t))
    for t in (
        _T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.BOOL, _T.INT8, _T.INT16, _T.INT32, _T.INT64,
        _T.UINT8, _T.UINT16, _T.UINT32, _T.UINT64,
    )
}  # fmt: skip
_LITTLE_ENDIAN = sys.byteorder == "little"  # raw_data is little-endian

# integer views of the same width, for the dtypes numpy only knows through ml_dtypes
_VIEW_NP = {1: np.uint8, 2: np.uint16}
_VIEW_TORCH = {1: torch.uint8, 2: torch.int16}
_TORCH_TO_ML: dict[torch.dtype, Any] = {}
_ML_NAMES = (
    "bfloat16",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
)
# sub-byte types: held unpacked, one element per byte, under torch's storage-only dtype
# of the same name (float4e2m1 under float4_e2m1fn_x2, as a tag: one code per byte);
# see evaluator/lowbit.py
_ML_SUBBYTE = {
    "int4": "int4",
    "uint4": "uint4",
    "int2": "int2",
    "uint2": "uint2",
    "float4_e2m1fn": "float4_e2m1fn_x2",
}


def _ml_dtype(dtype: torch.dtype) -> Any:
    """The ml_dtypes numpy type of a torch dtype numpy lacks, or None."""
    if not _TORCH_TO_ML:
        import ml_dtypes

        for name in _ML_NAMES:
            if hasattr(torch, name) and hasattr(ml_dtypes, name):
                _TORCH_TO_ML[getattr(torch, name)] = np.dtype(getattr(ml_dtypes, name))
        for ml_name, torch_name in _ML_SUBBYTE.items():
            if hasattr(torch, torch_name) and hasattr(ml_dtypes, ml_name):
                _TORCH_TO_ML[getattr(torch, torch_name)] = np.dtype(getattr(ml_dtypes, ml_name))
    return _TORCH_TO_ML.get(dtype)


def _torch_dtype_of_ml(dtype: np.dtype) -> torch.dtype:
    if dtype.name == "float8_e8m0fnu" and hasattr(torch, "float8_e8m0fnu"):
        return torch.float8_e8m0fnu
    sub = _ML_SUBBYTE.get(dtype.name)
    if sub is not None and hasattr(torch, sub):
        return getattr(torch, sub)
    try:
        elem = np_to_onnx_dtype(dtype)
    except Exception:
        elem = None
    torch_dtype = ONNX_TO_TORCH.get(elem) if elem is not None else None
    if torch_dtype is None:
        raise TypeError(f"numpy dtype {dtype} has no torch dtype")
    return torch_dtype


def _symbolic_hint(v: Any) -> Any:
    hint = getattr(getattr(v, "node", None), "hint", None)
    return hint if hint is not None else int(v)


def to_numpy(v: Any) -> Any:
    """A numpy array from a tensor (ml_dtypes for bfloat16 and float8); lists stay lists."""
    if isinstance(v, torch.Tensor):
        # a run converts hundreds of values: no detached copy, no device object, where
        # neither is needed (``numpy()`` refuses only a tensor that requires grad)
        t = v.detach() if v.requires_grad else v
        if not t.is_cpu:
            t = t.cpu()
        ml = _ml_dtype(t.dtype)
        if ml is not None:
            # the integer view first: torch's storage-only dtypes (int4, ...) cannot copy
            return t.view(_VIEW_TORCH[t.element_size()]).contiguous().numpy().view(ml)
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        return t.numpy()
    if isinstance(v, list | tuple):
        return [to_numpy(x) for x in v]
    if isinstance(v, bool | int | float):
        return np.asarray(v)
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        return np.asarray(_symbolic_hint(v))
    return v


def to_torch(v: Any, device: torch.device | str | None = None) -> Any:
    """A tensor from a numpy value (memory shared when writable), on ``device`` if given."""
    if isinstance(v, torch.Tensor):
        return v if device is None else v.to(device)
    if isinstance(v, np.ndarray | np.generic):
        a = np.asarray(v)
        if a.dtype == np.object_ or a.dtype.kind in "SU":
            raise TypeError("string tensors have no torch dtype")
        if not a.flags.writeable or not a.flags.c_contiguous:
            # a writable tensor must never alias read-only data; negative strides and
            # other layouts torch cannot view are copied too (0-d arrays stay 0-d)
            a = np.array(a, copy=True, order="C")
        if a.dtype.kind == "V" or a.dtype.type.__module__.startswith("ml_dtypes"):
            width = _VIEW_NP.get(a.dtype.itemsize)
            if width is None:
                raise TypeError(f"numpy dtype {a.dtype} has no torch dtype")
            t = torch.from_numpy(a.view(width)).view(_torch_dtype_of_ml(a.dtype))
        else:
            t = torch.from_numpy(a)
        return t if device is None else t.to(device)
    if isinstance(v, list | tuple):
        return [to_torch(x, device) for x in v]
    if isinstance(v, bool | int | float):
        return torch.tensor(v, device=device)
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        return torch.tensor(_symbolic_hint(v), device=device)
    return v


def convert(v: Any, kind: str, device: torch.device | str | None = None) -> Any:
    """``v`` in the form a node runner wants: kind ``"numpy"`` or ``"torch"``."""
    return to_numpy(v) if kind == "numpy" else to_torch(v, device)


def initializer_value(
    init: onnx.TensorProto, kind: str, device: Any = None, folder: Path | None = None
) -> Any:
    """An initializer's value in the form a node runner wants; ``folder``: where a model
    loaded with its large weights left in their file finds them (``external.py``)."""
    if folder is not None and is_deferred(init):
        return convert(external_array(init, folder), kind, device)
    return convert(tensor_array(init), kind, device)


def _raw_dtype(t: onnx.TensorProto) -> np.dtype | None:
    """The array type of a tensor whose raw bytes are its array, None for any other."""
    dtype = _RAW_NP.get(t.data_type)
    if (
        dtype is not None
        and _LITTLE_ENDIAN
        and t.data_location != _T.EXTERNAL
        and t.HasField("raw_data")
        and not t.HasField("segment")
    ):
        return dtype
    return None


def tensor_array(t: onnx.TensorProto) -> np.ndarray:
    """``numpy_helper.to_array(t)``; a tensor of a numpy type with its raw bytes in the
    model is read straight from them (the same read-only array)."""
    dtype = _raw_dtype(t)
    if dtype is not None:
        return np.frombuffer(t.raw_data, dtype=dtype).reshape(t.dims)
    return numpy_helper.to_array(t)


def raw_tensor_array(t: onnx.TensorProto, raw: bytes) -> np.ndarray | None:
    """:func:`tensor_array` of ``t`` from ``raw``, its ``raw_data`` already read (each
    read copies the bytes: protobuf hands out a new bytes object); None for a tensor
    :func:`tensor_array` reads otherwise.  ``raw`` must be the bytes ``t`` holds."""
    dtype = _raw_dtype(t)
    if dtype is None:
        return None
    return np.frombuffer(raw, dtype=dtype).reshape(t.dims)


def device_of(v: Any) -> str:
    if isinstance(v, torch.Tensor) and not v.is_cpu:  # is_cpu: no device object made
        return str(v.device)
    return "cpu"


__all__ = [
    "convert",
    "device_of",
    "initializer_value",
    "raw_tensor_array",
    "tensor_array",
    "to_numpy",
    "to_torch",
]
