"""Linear quantization: QuantizeLinear, DequantizeLinear, DynamicQuantizeLinear,
QLinearConv, QLinearMatMul.

Integer types torch has (uint8, int8, uint16, int16, int32), float8 types, and the
sub-byte types (int4, uint4, int2, uint2, float4e2m1: decoded to float32 to compute,
evaluator/lowbit.py) are supported.
"""

from __future__ import annotations

import torch

from ...dtypes import onnx_to_torch_dtype
from ..lowbit import FLOAT4, LOWBIT_DTYPES, decode, encode
from ..registry import op
from ._nn_common import register_versions
from .nn_conv import conv as conv_kernel
from .nn_conv import weight_minus_zero_point

_INT_RANGES = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.int16: (-32768, 32767),
    torch.int32: (-(2**31), 2**31 - 1),
}
if hasattr(torch, "uint16"):
    _INT_RANGES[torch.uint16] = (0, 65535)

_FLOAT8 = {
    getattr(torch, n): float(torch.finfo(getattr(torch, n)).max)
    for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz")
    if hasattr(torch, n)
}


def _broadcast_param(v: torch.Tensor, x: torch.Tensor, axis: int, block_size: int) -> torch.Tensor:
    """Reshapes a scale / zero point so it broadcasts against x (per tensor, axis, block)."""
    if v.dim() == 0 or v.numel() == 1:
        return v.reshape(())
    axis = axis % x.dim()
    if not block_size:
        shape = [1] * x.dim()
        shape[axis] = v.numel()
        return v.reshape(shape)
    v = v.repeat_interleave(block_size, dim=axis)
    if v.shape[axis] != x.shape[axis]:
        v = v.narrow(axis, 0, x.shape[axis])
    return v


def _work_dtype(*ts: torch.Tensor) -> torch.dtype:
    dt = torch.float32
    for t in ts:
        if t.dtype == torch.float64:
            dt = torch.float64
    return dt


def saturate_to(v: torch.Tensor, dtype: torch.dtype, saturate: bool = True) -> torch.Tensor:
    """Rounds half to even and saturates to an integer type, or casts to a float8 type."""
    if dtype in LOWBIT_DTYPES:
        return encode(v, dtype, saturate)
    if dtype in _INT_RANGES:
        lo, hi = _INT_RANGES[dtype]
        return v.clamp(lo, hi).to(dtype)
    if dtype in _FLOAT8:
        if saturate:
            m = _FLOAT8[dtype]
            v = v.clamp(-m, m)
        return v.to(dtype)
    raise TypeError(f"{dtype} is not a quantized type the torch evaluator supports")


def _values(t: torch.Tensor) -> torch.Tensor:
    """A tensor torch computes with: sub-byte values decoded to float32 (exact)."""
    return decode(t) if t.dtype in LOWBIT_DTYPES else t


def _quantize(
    x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0, precision=0, saturate=1
):
    if y_zero_point is not None:
        out_dt = y_zero_point.dtype
    elif output_dtype:
        out_dt = onnx_to_torch_dtype(output_dtype)
    else:
        out_dt = torch.uint8
    wdt = onnx_to_torch_dtype(precision) if precision else _work_dtype(x, y_scale)
    s = _broadcast_param(y_scale, x, axis, block_size).to(wdt)
    v = x.to(wdt) / s
    if out_dt in _FLOAT8 or out_dt == FLOAT4:
        # the zero point of float8 and float4 types is zero by definition
        return saturate_to(v, out_dt, bool(saturate))
    v = torch.round(v)
    if y_zero_point is not None:
        v = v + _broadcast_param(_values(y_zero_point), x, axis, block_size).to(wdt)
    return saturate_to(v, out_dt)


def _dequantize(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    wdt = _work_dtype(x_scale)
    v = _values(x).to(wdt)
    if x_zero_point is not None and x.dtype not in _FLOAT8 and x.dtype != FLOAT4:
        v = v - _broadcast_param(_values(x_zero_point), x, axis, block_size).to(wdt)
    v = v * _broadcast_param(x_scale, x, axis, block_size).to(wdt)
    out = onnx_to_torch_dtype(output_dtype) if output_dtype else x_scale.dtype
    return v.to(out)


# the versions differ only in the attributes they accept, each defaulting to the older
# behaviour: saturate came with opset 19, block_size and output_dtype with 21, precision
# with 23
register_versions(
    "QuantizeLinear",
    _quantize,
    {
        10: ("axis",),
        19: ("axis", "saturate"),
        21: ("axis", "block_size", "output_dtype", "saturate"),
        23: ("axis", "block_size", "output_dtype", "precision", "saturate"),
    },
)
register_versions(
    "DequantizeLinear",
    _dequantize,
    {
        10: ("axis",),
        21: ("axis", "block_size"),
        23: ("axis", "block_size", "output_dtype"),
    },
)


@op("DynamicQuantizeLinear", since=11)
def dynamic_quantize_linear(x):
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    rmin = torch.minimum(x.min(), zero) if x.numel() else zero
    rmax = torch.maximum(x.max(), zero) if x.numel() else zero
    # an input of zeros only has no range: onnxruntime gives the scale 1 (the spec's
    # formula gives 0, the ONNX reference 1/255); its codes and zero point are 0 anyway
    scale = torch.where(rmax == rmin, torch.ones_like(rmax), (rmax - rmin) / 255)
    zp = torch.round((0 - rmin) / scale).clamp(0, 255)
    y = (torch.round(x / scale) + zp).clamp(0, 255)
    return y.to(torch.uint8), scale, zp.to(torch.uint8)


def _per_row(s: torch.Tensor, rank: int) -> torch.Tensor:
    # a 1-D scale of a QLinearMatMul's left operand is per row
    return s.reshape(-1, 1) if s.dim() == 1 and s.numel() > 1 else s


@op("QLinearMatMul", since=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    # float64 keeps every int32 accumulator exact
    af = a.to(torch.float64) - _per_row(a_zero_point, a.dim()).to(torch.float64)
    bf = b.to(torch.float64) - b_zero_point.to(torch.float64)
    acc = torch.matmul(af, bf)
    sa = _per_row(a_scale, a.dim()).to(torch.float32)
    scale = sa * b_scale.to(torch.float32) / y_scale.to(torch.float32)
    return _requantize(acc, scale, y_zero_point)


def _requantize(acc: torch.Tensor, scale: torch.Tensor, y_zero_point: torch.Tensor) -> torch.Tensor:
    """An exact accumulator rescaled and quantized to y_zero_point's type as onnxruntime's
    MlasRequantizeOutput does: the int32 accumulator to float32, times the float32
    multiplier (a_scale * b_scale / y_scale, computed in float32), rounded half to even.
    A float8 output (opset 21) is the rescaled value cast with saturation: its zero
    point is 0 and it has no integer grid to round to."""
    v = acc.to(torch.float32) * scale.to(torch.float32)
    if y_zero_point.dtype in _FLOAT8:
        return saturate_to(v, y_zero_point.dtype)
    v = torch.round(v).to(torch.float64)
    return saturate_to(v + y_zero_point.to(torch.float64), y_zero_point.dtype)


@op("QLinearConv", since=10)
def qlinear_conv(
    x,
    x_scale,
    x_zero_point,
    w,
    w_scale,
    w_zero_point,
    y_scale,
    y_zero_point,
    b=None,
    **conv_attrs,
):
    xf = x.to(torch.float64) - x_zero_point.to(torch.float64)
    acc = conv_kernel(xf, weight_minus_zero_point(w, w_zero_point), None, **conv_attrs)
    if b is not None:
        acc = acc + b.to(torch.float64).reshape(1, -1, *([1] * (x.dim() - 2)))
    ws = w_scale.to(torch.float32)
    if ws.numel() > 1:
        ws = ws.reshape(1, -1, *([1] * (x.dim() - 2)))
    scale = x_scale.to(torch.float32) * ws / y_scale.to(torch.float32)
    return _requantize(acc, scale, y_zero_point)
