"""Moving values between torch and the form a node runner wants (numpy or torch)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper


def to_numpy(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        t = v.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if t.dtype == torch.bfloat16:
            import ml_dtypes

            return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        if t.is_conj() or t.is_neg():
            t = t.resolve_conj().resolve_neg()
        return t.numpy()
    if isinstance(v, list | tuple):
        return [to_numpy(x) for x in v]
    if isinstance(v, bool | int | float):
        return np.asarray(v)
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        return np.asarray(v.node.hint if hasattr(v.node, "hint") else int(v))
    return v


def to_torch(v: Any, device: torch.device | str | None = None) -> Any:
    if isinstance(v, torch.Tensor):
        return v if device is None else v.to(device)
    if isinstance(v, np.ndarray | np.generic):
        a = np.asarray(v)
        if not a.flags.writeable:  # torch tensors are writable views: never alias read-only data
            a = a.copy()
        if a.dtype.name == "bfloat16":
            t = torch.from_numpy(np.ascontiguousarray(a).view(np.int16)).view(torch.bfloat16)
        else:
            t = torch.from_numpy(a)
        return t if device is None else t.to(device)
    if isinstance(v, list | tuple):
        return [to_torch(x, device) for x in v]
    if isinstance(v, bool | int | float):
        return torch.tensor(v, device=device)
    return v


def convert(v: Any, kind: str, device: torch.device | str | None = None) -> Any:
    """``v`` in the form of a runner: kind 'numpy' or 'torch'."""
    return to_numpy(v) if kind == "numpy" else to_torch(v, device)


def initializer_value(init: onnx.TensorProto, kind: str, device: Any = None) -> Any:
    arr = numpy_helper.to_array(init)
    return arr if kind == "numpy" else to_torch(arr, device)


def device_of(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return str(v.device)
    return "cpu"
