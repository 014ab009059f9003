"""Cast and CastLike (ai.onnx), with the float8 saturation rules."""

from __future__ import annotations

import onnx
import torch

from ..lowbit import LOWBIT_DTYPES, decode
from ..lowbit import cast as cast_lowbit
from ..protos import torch_dtype
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


_E8M0 = getattr(torch, "float8_e8m0fnu", None)


def _to_e8m0(x: torch.Tensor, saturate: int, round_mode: str) -> torch.Tensor:
    """Float to the exponent-only float8e8m0 (ONNX's bit-level rule, sign dropped)."""
    bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    exponent = (bits >> 23) & 0xFF
    special = exponent == 0xFF  # NaN and infinities
    if round_mode == "nearest":
        guard, rnd = (bits & 0x400000) > 0, (bits & 0x200000) > 0
        sticky, lsb = (bits & 0x1FFFFF) > 0, exponent > 0
        up = guard & (rnd | sticky | lsb)
    elif round_mode == "up":
        up = (bits & 0x7FFFFF) > 0
    elif round_mode == "down":
        up = torch.zeros_like(special)
    else:
        raise ValueError(f"Cast: unsupported round_mode {round_mode!r}")
    up = up & ~special
    if saturate:
        up = up & (exponent != 0xFE)
    out = torch.where(special, 0xFF, exponent + up.to(torch.int64))
    return out.to(torch.uint8).view(_E8M0)


def cast_tensor(
    x: torch.Tensor, dtype: torch.dtype, saturate: int = 1, round_mode: str = "up"
) -> torch.Tensor:
    if x.dtype == dtype:
        return x
    if x.dtype in LOWBIT_DTYPES:
        # every sub-byte value is exact in float32
        return cast_tensor(decode(x), dtype, saturate, round_mode)
    if dtype in LOWBIT_DTYPES:
        return cast_lowbit(x, dtype)
    if dtype == _E8M0 and _E8M0 is not None:
        return _to_e8m0(x, saturate, round_mode)
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
    if (x.dtype in _F8 or x.dtype == _E8M0) and dtype != torch.float32:
        return x.to(torch.float32).to(dtype)
    if dtype == torch.bool and x.is_floating_point():
        return x != 0
    return x.to(dtype)


@op("Cast", since=1, placement="follow")
def cast_v1(x, to):
    # opset 1 names the type as a string ("FLOAT"), later opsets by its enum value
    elem = onnx.TensorProto.DataType.Value(to.upper()) if isinstance(to, str) else to
    return cast_tensor(x, torch_dtype(elem))


@op("Cast", since=6, placement="follow")
def cast(x, to, saturate=1, round_mode="up"):
    return cast_tensor(x, torch_dtype(to), saturate, round_mode)


@op("CastLike", since=15, placement="follow")
def cast_like(x, like, saturate=1, round_mode="up"):
    return cast_tensor(x, like.dtype, saturate, round_mode)
