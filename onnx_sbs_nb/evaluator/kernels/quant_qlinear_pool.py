"""onnxruntime's quantized average poolings (``com.microsoft``), the ones
``quantize_static(quant_format=QOperator)`` writes for AveragePool and
GlobalAveragePool: QLinearAveragePool and QLinearGlobalAveragePool, following its CPU
kernels:

- QLinearAveragePool dequantizes to float32 (``x_scale * (x - x_zero_point)``), pools as
  AveragePool does, and quantizes with ``round(y / y_scale + y_zero_point)``;
- QLinearGlobalAveragePool sums the codes exactly (minus the zero point times the image
  size) and rescales the sum once by ``x_scale / (y_scale * image_size)`` in float32
  (MLAS).

Both take ``channels_last`` (NHWC); a missing zero point is 0.  Results are rounded half
to even and saturated to the codes' type.
"""

from __future__ import annotations

import math

import torch

from ..registry import op
from .nn_pool import _avg_pool
from .quant_qlinear_ms import saturate_codes

MS = "com.microsoft"
F32 = torch.float32


def _scalar(t: torch.Tensor | None) -> torch.Tensor:
    return torch.zeros((), dtype=F32) if t is None else t.reshape(-1)[0].to(F32)


def _to_nchw(x: torch.Tensor, channels_last: int) -> torch.Tensor:
    return x.movedim(-1, 1) if channels_last else x


def _from_nchw(y: torch.Tensor, channels_last: int) -> torch.Tensor:
    return y.movedim(1, -1) if channels_last else y


@op("QLinearAveragePool", domain=MS)
def qlinear_average_pool(
    x,
    x_scale,
    x_zero_point,
    y_scale,
    y_zero_point=None,
    *,
    auto_pad="NOTSET",
    ceil_mode=0,
    channels_last=0,
    count_include_pad=0,
    kernel_shape=(),
    pads=None,
    strides=None,
):
    xf = _scalar(x_scale) * (x.to(torch.int32) - _scalar(x_zero_point).to(torch.int32)).to(F32)
    pooled = _avg_pool(
        _to_nchw(xf, channels_last),
        auto_pad,
        ceil_mode,
        count_include_pad,
        None,
        kernel_shape,
        pads,
        strides,
    )
    y = pooled / _scalar(y_scale) + _scalar(y_zero_point)
    return saturate_codes(_from_nchw(y, channels_last), x.dtype)


@op("QLinearGlobalAveragePool", domain=MS)
def qlinear_global_average_pool(
    x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, channels_last=0
):
    xc = _to_nchw(x, channels_last).to(torch.int64)
    spatial = tuple(range(2, xc.dim()))
    image_size = math.prod(xc.shape[2:])
    zp = int(_scalar(x_zero_point))
    acc = xc.sum(dim=spatial, keepdim=True) - zp * image_size
    scale = _scalar(x_scale) / (_scalar(y_scale) * float(image_size))
    y = torch.round(acc.to(F32) * scale) + _scalar(y_zero_point)
    return saturate_codes(_from_nchw(y, channels_last), x.dtype)
