"""ONNX protos (tensors, sparse tensors, attributes) as the values the kernels take."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from ..convert import to_torch
from ..dtypes import ONNX_TO_TORCH
from .lowbit import ONNX_TO_LOWBIT

AP = onnx.AttributeProto

# Element types torch has that onnx_sbs_nb.dtypes does not map (yet).
EXTRA_ONNX_TO_TORCH: dict[int, torch.dtype] = {}
if hasattr(torch, "float8_e8m0fnu"):
    EXTRA_ONNX_TO_TORCH[onnx.TensorProto.FLOAT8E8M0] = torch.float8_e8m0fnu
# sub-byte types, held one element per byte under torch's storage-only dtypes (lowbit.py)
EXTRA_ONNX_TO_TORCH.update(ONNX_TO_LOWBIT)


def torch_dtype(elem_type: int) -> torch.dtype:
    """The torch dtype of an ONNX element type (TypeError when torch has none)."""
    dtype = ONNX_TO_TORCH.get(elem_type) or EXTRA_ONNX_TO_TORCH.get(elem_type)
    if dtype is None:
        name = onnx.TensorProto.DataType.Name(elem_type)
        raise TypeError(f"ONNX element type {name} has no torch dtype")
    return dtype


def string_array(proto: onnx.TensorProto) -> np.ndarray:
    """A STRING TensorProto as a numpy object array of str (torch has no string dtype)."""
    a = numpy_helper.to_array(proto)
    return np.vectorize(_decoded, otypes=[object])(a) if a.size else a.astype(object)


def _decoded(v: object) -> str:
    return v.decode("utf-8") if isinstance(v, bytes) else str(v)


def tensor_from_proto(proto: onnx.TensorProto, base_dir: str = "") -> torch.Tensor:
    """A CPU tensor holding the value of a TensorProto (external data resolved by onnx)."""
    if proto.data_type == onnx.TensorProto.STRING:
        raise TypeError(f"string tensor {proto.name!r} is not supported by the torch evaluator")
    if proto.data_type not in ONNX_TO_TORCH and proto.data_type not in EXTRA_ONNX_TO_TORCH:
        name = onnx.TensorProto.DataType.Name(proto.data_type)
        raise TypeError(f"tensor {proto.name!r} has element type {name}, which torch lacks")
    return to_torch(numpy_helper.to_array(proto, base_dir))


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
        if att.t.data_type == onnx.TensorProto.STRING:
            # a kernel attribute (LabelEncoder's keys_tensor): kernels take string
            # tensors as numpy object arrays of str
            return string_array(att.t)
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
