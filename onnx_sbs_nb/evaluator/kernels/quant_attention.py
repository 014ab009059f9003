"""onnxruntime's QAttention (``com.microsoft``): what ``quantize_dynamic`` makes of the
Attention node onnxruntime's transformer optimizer fuses in a BERT encoder.

The Q, K, V projection is an integer GEMM of the uint8 input and the int8/uint8 weights
(minus their zero points), turned to float32 as onnxruntime's output processor does:
``float(acc) * (input_scale * weight_scale) + bias`` (a weight scale may be per
column).  The attention itself is then the contrib Attention's (contrib_attention.py),
fed the projected values with an identity weight, which leaves them exact.
"""

from __future__ import annotations

import torch

from ..registry import op
from .contrib_attention import attention_ms
from .quant_qgemm import _accumulate

MS = "com.microsoft"
F32 = torch.float32


@op("QAttention", domain=MS, context=True)
def qattention(
    x,
    weight,
    bias,
    input_scale,
    weight_scale,
    mask_index=None,
    input_zero_point=None,
    weight_zero_point=None,
    past=None,
    *,
    num_heads,
    do_rotary=0,
    mask_filter_value=-10000.0,
    past_present_share_buffer=0,
    scale=None,
    unidirectional=0,
    ctx=None,
):
    acc = _accumulate(x, input_zero_point, weight, weight_zero_point)
    multiplier = input_scale.to(F32).reshape(()) * weight_scale.to(F32)
    qkv = acc.to(F32) * multiplier + bias.to(F32)
    identity = torch.eye(qkv.shape[-1], dtype=F32, device=qkv.device)
    return attention_ms(
        qkv,
        identity,
        None,
        mask_index,
        past,
        num_heads=num_heads,
        do_rotary=do_rotary,
        mask_filter_value=mask_filter_value,
        past_present_share_buffer=past_present_share_buffer,
        scale=scale,
        unidirectional=unidirectional,
        ctx=ctx,
    )
