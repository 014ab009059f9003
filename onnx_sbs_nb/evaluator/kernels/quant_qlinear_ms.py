"""onnxruntime's element-wise quantized ops (``com.microsoft``), the ones
``quantize_static(quant_format=QOperator)`` writes: QLinearAdd, QLinearMul,
QLinearSigmoid, QLinearLeakyRelu, QLinearSoftmax, QLinearConcat, QLinearWhere.

Inputs and outputs are uint8 or int8 codes, with float32 scales and zero points of the
codes' type (a missing zero point is 0).  Each kernel follows onnxruntime's CPU kernel
(MLAS, x86) step by step in float32, since the quantized result depends on where it
rounds:

- QLinearAdd: ``c = a * (sa/sc) + (b * (sb/sc) + (zc - (sa/sc) * za - (sb/sc) * zb))``
  with fused multiply-adds (emulated in float64, where the products of two float32 are
  exact);
- QLinearMul: ``c = ((a - za) * (b - zb)) * (sa * sb / sc) + zc``;
- QLinearSigmoid, QLinearLeakyRelu, QLinearConcat, QLinearWhere: a table of the 256
  codes, each dequantized, transformed and quantized again in float32 (Concat and Where
  copy an input whose scale and zero point are the output's);
- QLinearSoftmax: onnxruntime's table of exponentials shifted by the row's maximum code,
  summed in float32 and divided, with its rounding.

The result is rounded half to even and saturated to the codes' type.
"""

from __future__ import annotations

import math

import torch

from ..registry import op
from ._helpers import norm_axis

MS = "com.microsoft"
F32, F64 = torch.float32, torch.float64


def _scalar(t: torch.Tensor | None, dtype: torch.dtype = F32) -> torch.Tensor:
    if t is None:
        return torch.zeros((), dtype=dtype)
    return t.reshape(-1)[0].to(dtype)


def _fma(x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """float32 fused multiply-add: x * y is exact in float64, one rounding to float32."""
    return (x.to(F64) * y.to(F64) + z.to(F64)).to(F32)


def saturate_codes(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 values rounded half to even and saturated to uint8 / int8."""
    info = torch.iinfo(dtype)
    return torch.round(v).clamp(info.min, info.max).to(dtype)


def _broadcast_last(x: torch.Tensor, other: torch.Tensor) -> bool:
    """Whether x is a scalar in the innermost loop of onnxruntime's broadcast."""
    if x.numel() == 1:
        return True
    return x.dim() > 0 and other.dim() > 0 and x.shape[-1] == 1 and other.shape[-1] != 1


@op("QLinearAdd", domain=MS)
def qlinear_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
    sc = _scalar(c_scale)
    r_ac, r_bc = _scalar(a_scale) / sc, _scalar(b_scale) / sc
    za, zb, zc = (_scalar(z) for z in (a_zero_point, b_zero_point, c_zero_point))
    fixed = zc - _fma(r_ac, za, r_bc * zb)
    af, bf = a.to(F32), b.to(F32)
    if _broadcast_last(a, b):
        c = _fma(bf, r_bc, fixed + af * r_ac)
    elif _broadcast_last(b, a):
        c = _fma(af, r_ac, fixed + bf * r_bc)
    else:
        c = _fma(af, r_ac, _fma(bf, r_bc, fixed))
    return saturate_codes(c, a.dtype)


@op("QLinearMul", domain=MS)
def qlinear_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
    ratio = _scalar(a_scale) * _scalar(b_scale) / _scalar(c_scale)
    za, zb = (_scalar(z, torch.int32) for z in (a_zero_point, b_zero_point))
    prod = (a.to(torch.int32) - za) * (b.to(torch.int32) - zb)
    c = prod.to(F32) * ratio + _scalar(c_zero_point)
    return saturate_codes(c, a.dtype)


def _all_codes(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    info = torch.iinfo(dtype)
    return torch.arange(info.min, info.max + 1, dtype=torch.int32, device=device)


def _lookup(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """table[code] for each code of x (the table starts at the type's minimum)."""
    index = x.to(torch.int64) - torch.iinfo(x.dtype).min
    return table.to(x.device)[index]


def _table(dtype, x_scale, x_zero_point, y_scale, y_zero_point, fn) -> torch.Tensor:
    """onnxruntime's QlinearBuildLookupTable: every code dequantized in float32,
    transformed, then quantized (divided by the scale, rounded, zero point added)."""
    codes = _all_codes(dtype, x_scale.device)
    x = _scalar(x_scale) * (codes - _scalar(x_zero_point, torch.int32)).to(F32)
    y = fn(x) / _scalar(y_scale)
    info = torch.iinfo(dtype)
    zp = _scalar(y_zero_point)
    return (torch.round(y.clamp(info.min - zp, info.max - zp)) + zp).to(dtype)


@op("QLinearSigmoid", domain=MS)
def qlinear_sigmoid(x, x_scale, x_zero_point, y_scale, y_zero_point=None):
    table = _table(x.dtype, x_scale, x_zero_point, y_scale, y_zero_point, torch.sigmoid)
    return _lookup(x, table)


@op("QLinearLeakyRelu", domain=MS)
def qlinear_leaky_relu(x, x_scale, x_zero_point, y_scale, y_zero_point=None, alpha=0.01):
    def leaky(v: torch.Tensor) -> torch.Tensor:
        return torch.where(v >= 0, v, v * alpha)

    table = _table(x.dtype, x_scale, x_zero_point, y_scale, y_zero_point, leaky)
    return _lookup(x, table)


@op("QLinearConcat", domain=MS)
def qlinear_concat(y_scale, y_zero_point, *inputs, axis):
    """inputs: (X, X_scale, X_zero_point) triples; a value whose scale and zero point
    are the output's is copied, the others go through a requantization table."""
    parts = [
        _requantized(*inputs[i : i + 3], y_scale, y_zero_point) for i in range(0, len(inputs), 3)
    ]
    return torch.cat(parts, dim=norm_axis(axis, parts[0].dim()))


def _exp_table(x_scale: float, reduce_len: int) -> torch.Tensor:
    """onnxruntime's QLinearSoftmax table: exp((i - 255 + shift) * x_scale) for the
    index i = 255 - (row max - code), shifted so that a row's sum stays finite."""
    shift = max(0.0, math.log(torch.finfo(F32).max / reduce_len) - 5) / x_scale
    i = torch.arange(256, dtype=F64)
    return torch.exp((i - 255 + shift) * x_scale).to(F32)


@op("QLinearSoftmax", domain=MS)
def qlinear_softmax(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, axis=-1, opset):
    axis = norm_axis(axis, x.dim())
    moved = opset >= 13 and axis != x.dim() - 1
    if moved:
        x = x.movedim(axis, -1)
    rows = x.reshape(-1, x.shape[-1]) if opset >= 13 else x.reshape(math.prod(x.shape[:axis]), -1)
    d = rows.shape[1]
    table = _exp_table(float(_scalar(x_scale)), d).to(x.device)
    r = rows.to(torch.int64)
    vt = table[255 - (r.amax(dim=1, keepdim=True) - r)]
    vsum = _sequential_sum(vt)
    inv = torch.floor(1.0 / _scalar(y_scale))
    q = torch.round(vt * inv / vsum).to(torch.int64) + int(_scalar(y_zero_point, torch.int64))
    info = torch.iinfo(x.dtype)
    y = q.clamp(info.min, info.max).to(x.dtype).reshape(x.shape)
    return y.movedim(-1, axis) if moved else y


def _sequential_sum(v: torch.Tensor) -> torch.Tensor:
    """Row sums added left to right in float32, as the kernel's loop does (torch.sum
    pairs them, and its cumsum accumulates in float64 on CPU)."""
    total = torch.zeros_like(v[:, :1])
    for j in range(v.shape[1]):
        total = total + v[:, j : j + 1]
    return total


def _requantized(x, x_scale, x_zero_point, y_scale, y_zero_point) -> torch.Tensor:
    """x's codes on another scale and zero point: copied when they are the same,
    else through onnxruntime's requantization table."""
    same_scale = bool(_scalar(x_scale) == _scalar(y_scale))
    same_zero = bool(_scalar(x_zero_point, torch.int32) == _scalar(y_zero_point, torch.int32))
    if same_scale and same_zero:
        return x
    return _lookup(x, _table(x.dtype, x_scale, x_zero_point, y_scale, y_zero_point, lambda v: v))


@op("QLinearWhere", domain=MS)
def qlinear_where(
    condition, x, x_scale, x_zero_point, y, y_scale, y_zero_point, z_scale, z_zero_point
):
    xz = _requantized(x, x_scale, x_zero_point, z_scale, z_zero_point)
    yz = _requantized(y, y_scale, y_zero_point, z_scale, z_zero_point)
    return torch.where(condition, xz, yz)
