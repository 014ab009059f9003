"""Cast and CastLike (ai.onnx), with the float8 saturation rules."""

from __future__ import annotations

import torch

from ...dtypes import onnx_to_torch_dtype
from ..registry import op

# Largest finite value of each float8 type, and the magnitude above which a value
# rounds past it (max + half an ulp) when the cast does not saturate.
_F8: dict[torch.dtype, tuple[float, float]] = {}
for _name, _max, _limit in (
    ("float8_e4m3fn", 448.0, 464.0),
    ("float8_e4m3fnuz", 240.0, 248.0),
    ("float8_e5m2", 57344.0, 61440.0),
    ("float8_e5m2fnuz", 57344.0, 61440.0),
):
    if hasattr(torch, _name):
        _F8[getattr(torch, _name)] = (_max, _limit)


def cast_tensor(x: torch.Tensor, dtype: torch.dtype, saturate: int = 1) -> torch.Tensor:
    if x.dtype == dtype:
        return x
    if dtype in _F8 and x.dtype not in _F8:
        fmax, limit = _F8[dtype]
        xf = x.to(torch.float32)
        if saturate:
            return xf.clamp(-fmax, fmax).to(dtype)
        y = xf.clamp(-fmax, fmax).to(dtype)
        overflow = xf.abs() > limit
        if dtype == getattr(torch, "float8_e5m2", None):
            # e5m2 has infinities: overflow goes to +-inf
            inf = torch.where(xf > 0, float("inf"), float("-inf")).to(dtype)
            return torch.where(overflow, inf, y)
        return torch.where(overflow | torch.isinf(xf), float("nan"), y.to(torch.float32)).to(dtype)
    if x.dtype in _F8 and dtype != torch.float32:
        return x.to(torch.float32).to(dtype)
    if dtype == torch.bool and x.is_floating_point():
        return x != 0
    return x.to(dtype)


@op("Cast", since=1)
def cast(x, to, saturate=1, round_mode="up"):
    return cast_tensor(x, onnx_to_torch_dtype(to), saturate)


@op("CastLike", since=15)
def cast_like(x, like, saturate=1, round_mode="up"):
    return cast_tensor(x, like.dtype, saturate)
