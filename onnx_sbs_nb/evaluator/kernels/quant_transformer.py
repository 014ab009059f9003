"""onnxruntime's quantized transformer ops (``com.microsoft``): QAttention and
QEmbedLayerNormalization, what ``quantize_dynamic`` makes of the Attention and
EmbedLayerNormalization nodes onnxruntime's transformer optimizer fuses in a BERT
encoder.

QAttention: the Q, K, V projection is an integer GEMM of the uint8 input and the int8/uint8 weights
(minus their zero points), turned to float32 as onnxruntime's output processor does:
``float(acc) * (input_scale * weight_scale) + bias`` (a weight scale may be per
column).  The attention itself is then the contrib Attention's (contrib_attention.py),
fed the projected values with an identity weight, which leaves them exact.

QEmbedLayerNormalization: the uint8 tables (word, position, segment embeddings, gamma,
beta) dequantized per tensor, ``(code - zero_point) * scale`` in float32, then the
contrib EmbedLayerNormalization (contrib.py).
"""

from __future__ import annotations

import torch

from ..registry import op
from .contrib import embed_layer_norm
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


def _dequantized(q: torch.Tensor | None, scale, zero_point) -> torch.Tensor | None:
    if q is None:
        return None
    zp = zero_point.to(torch.int32).reshape(()) if zero_point is not None else 0
    return (q.to(torch.int32) - zp).to(F32) * scale.to(F32).reshape(())


@op("QEmbedLayerNormalization", domain=MS, context=True)
def qembed_layer_normalization(
    input_ids,
    segment_ids,
    word_embedding_quant,
    position_embedding_quant,
    segment_embedding,
    gamma_quant,
    beta_quant,
    mask,
    word_embedding_scale,
    position_embedding_scale,
    segment_embedding_scale,
    gamma_scale,
    beta_scale,
    word_embedding_zero_point,
    position_embedding_zero_point,
    segment_embedding_zero_point,
    gamma_zero_point,
    beta_zero_point,
    *,
    epsilon=1e-12,
    ctx=None,
):
    y, index, _ = embed_layer_norm(
        input_ids,
        segment_ids,
        _dequantized(word_embedding_quant, word_embedding_scale, word_embedding_zero_point),
        _dequantized(
            position_embedding_quant, position_embedding_scale, position_embedding_zero_point
        ),
        _dequantized(segment_embedding, segment_embedding_scale, segment_embedding_zero_point),
        _dequantized(gamma_quant, gamma_scale, gamma_zero_point),
        _dequantized(beta_quant, beta_scale, beta_zero_point),
        mask,
        epsilon=epsilon,
        ctx=ctx,
    )
    return y, index
