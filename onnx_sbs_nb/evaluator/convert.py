"""Conversions between ONNX protos, numpy arrays and torch tensors used by the evaluator."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ..dtypes import ONNX_TO_TORCH, np_to_onnx_dtype

AP = onnx.AttributeProto

# numpy has no bfloat16/float8: ml_dtypes arrays go through a same-width integer view.
_VIEW_INT = {1: np.uint8, 2: np.uint16}

# Element types torch has that onnx_sbs_nb.dtypes does not map (yet).
EXTRA_ONNX_TO_TORCH: dict[int, torch.dtype] = {}
if hasattr(torch, "float8_e8m0fnu"):
    EXTRA_ONNX_TO_TORCH[onnx.TensorProto.FLOAT8E8M0] = torch.float8_e8m0fnu


def torch_dtype(elem_type: int) -> torch.dtype:
    """The torch dtype of an ONNX element type (TypeError when torch has none)."""
    dtype = ONNX_TO_TORCH.get(elem_type) or EXTRA_ONNX_TO_TORCH.get(elem_type)
    if dtype is None:
        name = onnx.TensorProto.DataType.Name(elem_type)
        raise TypeError(f"ONNX element type {name} has no torch dtype")
    return dtype


def numpy_to_torch(a: Any) -> Any:
    """A torch tensor sharing memory with ``a`` when possible (ml_dtypes through views)."""
    if isinstance(a, list):
        return [numpy_to_torch(x) for x in a]
    if a is None or isinstance(a, torch.Tensor):
        return a
    a = np.asarray(a)
    if a.dtype == np.object_ or a.dtype.kind in "SU":
        raise TypeError("string tensors are not supported by the torch evaluator")
    if not a.flags.writeable or not a.flags.c_contiguous:
        a = np.array(a, copy=True, order="C")  # (ascontiguousarray makes 0-d arrays 1-d)
    if a.dtype.kind == "V" or a.dtype.type.__module__.startswith("ml_dtypes"):
        elem = np_to_onnx_dtype(a.dtype)
        dtype = ONNX_TO_TORCH.get(elem) or EXTRA_ONNX_TO_TORCH.get(elem)
        if dtype is None:
            raise TypeError(f"numpy dtype {a.dtype} has no torch dtype")
        return torch.from_numpy(a.view(_VIEW_INT[a.dtype.itemsize])).view(dtype)
    return torch.from_numpy(a)


_TORCH_TO_ML: dict[torch.dtype, Any] = {}


def _ml_dtype(dtype: torch.dtype) -> Any:
    if not _TORCH_TO_ML:
        import ml_dtypes

        for name in (
            "bfloat16",
            "float8_e4m3fn",
            "float8_e4m3fnuz",
            "float8_e5m2",
            "float8_e5m2fnuz",
            "float8_e8m0fnu",
        ):
            if hasattr(torch, name) and hasattr(ml_dtypes, name):
                _TORCH_TO_ML[getattr(torch, name)] = getattr(ml_dtypes, name)
    return _TORCH_TO_ML.get(dtype)


def torch_to_numpy(t: Any) -> Any:
    """A numpy array (ml_dtypes for bfloat16/float8) from a tensor; lists stay lists."""
    if isinstance(t, (list, tuple)):
        return [torch_to_numpy(x) for x in t]
    if not isinstance(t, torch.Tensor):
        return t
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    ml = _ml_dtype(t.dtype)
    if ml is not None:
        width = torch.uint8 if t.element_size() == 1 else torch.int16
        return t.contiguous().view(width).numpy().view(ml)
    return t.numpy()


def tensor_from_proto(proto: onnx.TensorProto, base_dir: str = "") -> torch.Tensor:
    """A CPU tensor holding the value of a TensorProto (external data resolved by onnx)."""
    if proto.data_type == onnx.TensorProto.STRING:
        raise TypeError(f"string tensor {proto.name!r} is not supported by the torch evaluator")
    if proto.data_type not in ONNX_TO_TORCH and proto.data_type not in EXTRA_ONNX_TO_TORCH:
        name = onnx.TensorProto.DataType.Name(proto.data_type)
        raise TypeError(f"tensor {proto.name!r} has element type {name}, which torch lacks")
    return numpy_to_torch(numpy_helper.to_array(proto, base_dir))


def sparse_to_dense(sp: onnx.SparseTensorProto) -> torch.Tensor:
    values = tensor_from_proto(sp.values)
    indices = tensor_from_proto(sp.indices).to(torch.int64)
    dims = list(sp.dims)
    dense = torch.zeros(int(np.prod(dims)) if dims else 1, dtype=values.dtype)
    if indices.dim() == 2:
        strides = torch.tensor(
            [int(np.prod(dims[i + 1 :])) for i in range(len(dims))], dtype=torch.int64
        )
        indices = (indices * strides).sum(-1)
    dense[indices.reshape(-1)] = values.reshape(-1)
    return dense.reshape(dims)


def attribute_value(att: onnx.AttributeProto) -> Any:
    """The Python value of an attribute, as the kernel calling convention defines it."""
    t = att.type
    if t == AP.INT:
        return int(att.i)
    if t == AP.FLOAT:
        return float(att.f)
    if t == AP.STRING:
        return att.s.decode("utf-8")
    if t == AP.INTS:
        return [int(i) for i in att.ints]
    if t == AP.FLOATS:
        return [float(f) for f in att.floats]
    if t == AP.STRINGS:
        return [s.decode("utf-8") for s in att.strings]
    if t == AP.TENSOR:
        return tensor_from_proto(att.t)
    if t == AP.GRAPH:
        return att.g
    if t == AP.GRAPHS:
        return list(att.graphs)
    if t == AP.TYPE_PROTO:
        return att.tp
    if t == AP.TYPE_PROTOS:
        return list(att.type_protos)
    if t == AP.SPARSE_TENSOR:
        return sparse_to_dense(att.sparse_tensor)
    if t == AP.TENSORS:
        return [tensor_from_proto(x) for x in att.tensors]
    raise TypeError(f"attribute {att.name!r} has unsupported type {t}")
