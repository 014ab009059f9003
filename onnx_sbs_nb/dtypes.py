"""Mappings between ONNX element types, torch dtypes and numpy dtypes."""

from __future__ import annotations

import numpy as np
import onnx
import torch

TP = onnx.TensorProto

ONNX_TO_TORCH: dict[int, torch.dtype] = {
    TP.FLOAT: torch.float32,
    TP.DOUBLE: torch.float64,
    TP.FLOAT16: torch.float16,
    TP.BFLOAT16: torch.bfloat16,
    TP.INT8: torch.int8,
    TP.INT16: torch.int16,
    TP.INT32: torch.int32,
    TP.INT64: torch.int64,
    TP.UINT8: torch.uint8,
    TP.BOOL: torch.bool,
    TP.COMPLEX64: torch.complex64,
    TP.COMPLEX128: torch.complex128,
}
for _name, _onnx in (
    ("uint16", TP.UINT16),
    ("uint32", TP.UINT32),
    ("uint64", TP.UINT64),
    ("float8_e4m3fn", TP.FLOAT8E4M3FN),
    ("float8_e4m3fnuz", TP.FLOAT8E4M3FNUZ),
    ("float8_e5m2", TP.FLOAT8E5M2),
    ("float8_e5m2fnuz", TP.FLOAT8E5M2FNUZ),
):
    if hasattr(torch, _name):
        ONNX_TO_TORCH[_onnx] = getattr(torch, _name)

TORCH_TO_ONNX: dict[torch.dtype, int] = {v: k for k, v in ONNX_TO_TORCH.items()}

# the ONNX element types of real floating-point values (a model's weights and activations
# in float; the 8-bit float types are quantized data, not floats a converter writes)
ONNX_FLOAT_TYPES = frozenset({TP.FLOAT, TP.FLOAT16, TP.BFLOAT16, TP.DOUBLE})


def onnx_to_torch_dtype(elem_type: int) -> torch.dtype:
    try:
        return ONNX_TO_TORCH[elem_type]
    except KeyError:
        name = TP.DataType.Name(elem_type) if elem_type in TP.DataType.values() else elem_type
        raise TypeError(f"ONNX element type {name} has no torch dtype") from None


def torch_to_onnx_dtype(dtype: torch.dtype) -> int:
    try:
        return TORCH_TO_ONNX[dtype]
    except KeyError:
        raise TypeError(f"torch dtype {dtype} has no ONNX element type") from None


def onnx_to_np_dtype(elem_type: int) -> np.dtype:
    """numpy dtype of an ONNX element type (ml_dtypes for bfloat16 and float8)."""
    return onnx.helper.tensor_dtype_to_np_dtype(elem_type)


_NP_TO_ONNX: dict = {}


def np_to_onnx_dtype(dtype: np.dtype) -> int:
    elem = _NP_TO_ONNX.get(dtype)
    if elem is None:
        elem = _NP_TO_ONNX[dtype] = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    return elem


def dtype_name(dtype) -> str:
    """A short dtype name shared by both sides: 'float32', 'int64', 'bfloat16', ..."""
    if isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    if isinstance(dtype, int):
        return str(onnx_to_torch_dtype(dtype)).replace("torch.", "")
    return np.dtype(dtype).name
