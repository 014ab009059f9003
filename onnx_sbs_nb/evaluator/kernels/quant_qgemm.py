"""onnxruntime's integer matrix products (``com.microsoft``): QGemm (what
``quantize_static(quant_format=QOperator)`` writes for Gemm), MatMulIntegerToFloat and
DynamicQuantizeMatMul (what its graph optimizer fuses ``quantize_dynamic``'s
DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul into, in a saved optimized model);
and the ``com.microsoft`` QuantizeLinear / DequantizeLinear the QDQ quantizer writes for
16-bit types (``UseQDQContribOps``), which compute as the ai.onnx ones.

The integer products are exact (in float64, as MatMulInteger does); the accumulator then
goes to float32 and is scaled by a float32 multiplier computed in onnxruntime's order,
as its MLAS output processors do, so the quantized outputs round where onnxruntime's do.
"""

from __future__ import annotations

import torch

from ..registry import op
from .quant import _dequantize, _quantize, dynamic_quantize_linear, saturate_to

MS = "com.microsoft"
F32 = torch.float32


def _minus(x: torch.Tensor, zero_point: torch.Tensor | None, axis: int) -> torch.Tensor:
    """x - zero point in float64; a zero point of several values runs along ``axis``."""
    xf = x.to(torch.float64)
    if zero_point is None:
        return xf
    z = zero_point.to(torch.float64)
    if z.numel() > 1:
        shape = [1] * x.dim()
        shape[axis] = z.numel()
        z = z.reshape(shape)
    return xf - z.reshape(()) if z.numel() == 1 else xf - z


def _accumulate(a, a_zero_point, b, b_zero_point) -> torch.Tensor:
    """(A - za) @ (B - zb), exact; a per-column zero point of B runs along its last axis."""
    return torch.matmul(_minus(a, a_zero_point, -2), _minus(b, b_zero_point, -1))


@op("QGemm", domain=MS)
def qgemm(
    a,
    a_scale,
    a_zero_point,
    b,
    b_scale,
    b_zero_point,
    c=None,
    y_scale=None,
    y_zero_point=None,
    *,
    alpha=1.0,
    transA=0,  # noqa: N803
    transB=0,  # noqa: N803
):
    if transA:
        a = a.transpose(0, 1)
    if transB:
        b = b.transpose(0, 1)
    acc = _accumulate(a, a_zero_point, b, b_zero_point)
    if c is not None:
        acc = acc + c.to(torch.float64)  # int32, already on the accumulator's scale
    # ComputeOutputScale: alpha * a_scale * b_scale[i] (/ y_scale), left to right in float32
    scale = torch.tensor(alpha, dtype=F32) * a_scale.to(F32).reshape(()) * b_scale.to(F32)
    if y_scale is None:
        return acc.to(F32) * scale
    scale = scale / y_scale.to(F32).reshape(())
    v = torch.round(acc.to(F32) * scale)
    if y_zero_point is None:
        return saturate_to(v, a.dtype)
    return saturate_to(v.to(torch.float64) + y_zero_point.to(torch.float64), y_zero_point.dtype)


def _to_float(acc: torch.Tensor, multiplier: torch.Tensor, bias: torch.Tensor | None):
    y = acc.to(F32) * multiplier
    return y + bias.to(F32) if bias is not None else y


@op("MatMulIntegerToFloat", domain=MS)
def matmul_integer_to_float(
    a, b, a_scale, b_scale, a_zero_point=None, b_zero_point=None, bias=None
):
    acc = _accumulate(a, a_zero_point, b, b_zero_point)
    return _to_float(acc, a_scale.to(F32) * b_scale.to(F32), bias)


@op("DynamicQuantizeMatMul", domain=MS)
def dynamic_quantize_matmul(a, b, b_scale, b_zero_point=None, bias=None):
    """A quantized to uint8 as DynamicQuantizeLinear does, then MatMulIntegerToFloat."""
    qa, a_scale, a_zero_point = dynamic_quantize_linear(a.to(F32))
    acc = _accumulate(qa, a_zero_point, b, b_zero_point)
    return _to_float(acc, a_scale.to(F32) * b_scale.to(F32), bias)


@op("QuantizeLinear", domain=MS)
def ms_quantize_linear(x, y_scale, y_zero_point=None, *, axis=1, block_size=0):
    if y_zero_point is None:
        y_zero_point = torch.zeros((), dtype=torch.uint8)
    return _quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size)


@op("DequantizeLinear", domain=MS)
def ms_dequantize_linear(x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    return _dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size)
