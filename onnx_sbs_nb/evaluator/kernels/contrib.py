"""onnxruntime's fused and contrib ops, the ones its transformer optimizer (bert, gpt2,
unet) and fused exports emit: skip and simplified layer normalizations, the GELU family,
NhwcConv, GroupNorm, RotaryEmbedding and EmbedLayerNormalization.

Most live in the ``com.microsoft`` domain; ``SimplifiedLayerNormalization`` and the
pre-17 ``LayerNormalization`` are registered by onnxruntime in the default domain, from
opset 1, so they are here too.

Where onnxruntime has a CPU kernel, these follow it rather than the letter of
``ContribOperators.md`` when the two differ: the engine falls back to this evaluator
when onnxruntime cannot run a node, and the fallback has to agree with the kernel it
stands in for. Half precision inputs are computed in float32 and rounded once, as
onnxruntime's CPU kernels do.

NhwcConv, GroupNorm, SkipGroupNorm, BiasSplitGelu, BiasAdd and GemmFastGelu have no CPU
kernel in onnxruntime (CUDA only): they compute their definition, NhwcConv with the
weight channels-last as the unet fusion writes it. The attentions are in
``contrib_attention``.

Not covered (raises NotImplementedError): RotaryEmbedding's ``is_packed_batching``,
GroupNorm activations other than none and SiLU, SkipGroupNorm with ``channels_last=0``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..registry import op
from .nn_attention import rotary_embedding as _onnx_rotary
from .nn_conv import conv as _conv

MS = "com.microsoft"
_HALF = (torch.float16, torch.bfloat16)


def _wants(ctx: Any, k: int) -> bool:
    """Whether the node consumes its k-th output (ctx None: called directly, assume yes)."""
    return ctx is None or (len(ctx.node.output) > k and bool(ctx.node.output[k]))


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if x.dtype in _HALF else x.dtype


# onnxruntime's U type, of the saved mean and inverse deviation: float32 whatever the
# input's type, double included
_STAT = torch.float32


# -- layer normalizations ---------------------------------------------------------------------


def _skip_sum(x, skip, bias):
    s = x.to(_compute_dtype(x)) + skip.to(_compute_dtype(x))
    if bias is not None:
        s = s + bias.to(s.dtype)
    return s


@op("SkipLayerNormalization", domain=MS, context=True)
def skip_layer_norm(x, skip, gamma, beta=None, bias=None, epsilon=1e-12, ctx=None):
    s = _skip_sum(x, skip, bias)
    mean = s.mean(-1, keepdim=True)
    d = s - mean
    inv = torch.rsqrt((d * d).mean(-1, keepdim=True) + epsilon)
    y = d * inv * gamma.to(s.dtype)
    if beta is not None:
        y = y + beta.to(s.dtype)
    return (
        y.to(x.dtype),
        mean.to(_STAT) if _wants(ctx, 1) else None,
        inv.to(_STAT) if _wants(ctx, 2) else None,
        s.to(x.dtype) if _wants(ctx, 3) else None,
    )


@op("SkipSimplifiedLayerNormalization", domain=MS, context=True)
def skip_simplified_layer_norm(x, skip, gamma, bias=None, epsilon=1e-12, ctx=None):
    s = _skip_sum(x, skip, bias)
    inv = torch.rsqrt((s * s).mean(-1, keepdim=True) + epsilon)
    y = s * inv * gamma.to(s.dtype)
    return (
        y.to(x.dtype),
        # an RMS norm has no mean: onnxruntime writes zeros there
        torch.zeros(inv.shape, dtype=_STAT, device=x.device) if _wants(ctx, 1) else None,
        inv.to(_STAT) if _wants(ctx, 2) else None,
        s.to(x.dtype) if _wants(ctx, 3) else None,
    )


def _norm_axes(x: torch.Tensor, axis: int) -> list[int]:
    return list(range(axis % x.dim(), x.dim()))


@op("SimplifiedLayerNormalization", since=1, context=True)
def simplified_layer_norm(x, scale, axis=-1, epsilon=1e-5, stash_type=1, ctx=None):
    xc = x.to(_compute_dtype(x))
    inv = torch.rsqrt((xc * xc).mean(_norm_axes(x, axis), keepdim=True) + epsilon)
    y = (xc * inv).to(x.dtype) * scale
    return y, inv.to(_STAT) if _wants(ctx, 1) else None


@op("LayerNormalization", since=1, context=True)
def layer_norm_contrib(x, scale, b=None, axis=-1, epsilon=1e-5, stash_type=1, ctx=None):
    """onnxruntime's LayerNormalization before ONNX had one (opset 17): the same op."""
    axes = _norm_axes(x, axis)
    xc = x.to(_compute_dtype(x))
    mean = xc.mean(axes, keepdim=True)
    d = xc - mean
    inv = torch.rsqrt((d * d).mean(axes, keepdim=True) + epsilon)
    y = (d * inv).to(x.dtype) * scale
    if b is not None:
        y = y + b
    return (
        y,
        mean.to(_STAT) if _wants(ctx, 1) else None,
        inv.to(_STAT) if _wants(ctx, 2) else None,
    )


# -- GELU family ------------------------------------------------------------------------------


def _gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    return F.gelu(x.to(_compute_dtype(x)), approximate=approximate).to(x.dtype)


@op("Gelu", domain=MS)
def gelu_ms(x):
    return _gelu(x)


@op("BiasGelu", domain=MS)
def bias_gelu(a, b):
    return _gelu(a + b)


@op("FastGelu", domain=MS)
def fast_gelu(x, bias=None):
    return _gelu(x if bias is None else x + bias, "tanh")


@op("QuickGelu", domain=MS)
def quick_gelu(x, alpha=1.702):
    xc = x.to(_compute_dtype(x))
    return (xc * torch.sigmoid(alpha * xc)).to(x.dtype)


@op("BiasSplitGelu", domain=MS)
def bias_split_gelu(x, bias):
    left, right = (x + bias).chunk(2, -1)
    return left * _gelu(right)


@op("BiasAdd", domain=MS)
def bias_add(x, bias, skip):
    return x + bias + skip


@op("GemmFastGelu", domain=MS)
def gemm_fast_gelu(x, w, bias=None):
    return fast_gelu(torch.matmul(x, w), bias)


# -- channels-last convolution and group norm ---------------------------------------------------


@op("NhwcConv", domain=MS)
def nhwc_conv(
    x,
    w,
    b=None,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    """Both X and W channels-last: X (N, H, W, C), W (M, kH, kW, C / group), as the unet
    fusion writes them (it transposes the weight with perm (0, 2, 3, 1))."""
    last = x.dim() - 1
    to_first = [0, last, *range(1, last)]
    y = _conv(
        x.permute(to_first),
        w.permute(to_first),
        b,
        auto_pad=auto_pad,
        dilations=dilations,
        group=group,
        kernel_shape=kernel_shape,
        pads=pads,
        strides=strides,
    )
    return y.permute(0, *range(2, y.dim()), 1).contiguous()


def _group_norm_any(x, gamma, beta, groups, epsilon, activation, channels_last):
    if activation not in (0, 1):
        raise NotImplementedError(f"GroupNorm: activation {activation} (0: none, 1: SiLU)")
    if channels_last:
        x = x.permute(0, x.dim() - 1, *range(1, x.dim() - 1))
    cdt = _compute_dtype(x)
    y = F.group_norm(x.to(cdt), groups, gamma.to(cdt), beta.to(cdt), epsilon)
    if activation == 1:
        y = F.silu(y)
    y = y.to(x.dtype)
    if channels_last:
        y = y.permute(0, *range(2, y.dim()), 1).contiguous()
    return y


@op("GroupNorm", domain=MS)
def group_norm_ms(x, gamma, beta, *, activation, groups, channels_last=1, epsilon=1e-5):
    return _group_norm_any(x, gamma, beta, groups, epsilon, activation, channels_last)


@op("SkipGroupNorm", domain=MS, context=True)
def skip_group_norm(
    x, gamma, beta, skip, bias=None, *, activation, groups, channels_last=1, epsilon=1e-5, ctx=None
):
    if not channels_last:
        raise NotImplementedError("SkipGroupNorm: channels_last=0 (onnxruntime has NHWC only)")
    # skip is (N, H, W, C), (N, 1, 1, C) or (N, C): the last two broadcast over H and W
    if skip.dim() == 2:
        skip = skip.reshape(skip.shape[0], *([1] * (x.dim() - 2)), skip.shape[1])
    s = x + skip
    if bias is not None:
        s = s + bias
    y = _group_norm_any(s, gamma, beta, groups, epsilon, activation, 1)
    return y, s if _wants(ctx, 1) else None


# -- rotary embedding ----------------------------------------------------------------------------


@op("RotaryEmbedding", domain=MS)
def rotary_embedding_ms(
    x,
    position_ids,
    cos_cache,
    sin_cache,
    interleaved=0,
    is_packed_batching=0,
    num_heads=0,
    rotary_embedding_dim=0,
    scale=1.0,
):
    """The contrib op: 3-D (batch, seq, hidden) or 4-D (batch, heads, seq, head) input;
    ``position_ids`` is (batch, seq), or (1,) for every row starting at that position.
    ``scale`` is accepted and unused, as in onnxruntime's CPU kernel."""
    if is_packed_batching:
        raise NotImplementedError("RotaryEmbedding: is_packed_batching=1")
    if rotary_embedding_dim and not num_heads:
        # onnxruntime refuses it whatever the input's rank
        raise ValueError("RotaryEmbedding: rotary_embedding_dim needs num_heads")
    if x.dim() == 4:
        seq = x.shape[2]
    else:
        seq = x.shape[1]
        if not num_heads:
            # the head size is twice the caches' last dimension without partial rotation
            num_heads = x.shape[2] // (2 * cos_cache.shape[-1])
    pos = position_ids.long()
    if pos.numel() == 1:
        pos = pos.reshape(1, 1) + torch.arange(seq, device=pos.device).reshape(1, seq)
        pos = pos.expand(x.shape[0], seq)
    cdt = _compute_dtype(x)
    y = _onnx_rotary(
        x.to(cdt),
        cos_cache.to(cdt),
        sin_cache.to(cdt),
        pos,
        interleaved=interleaved,
        num_heads=num_heads,
        rotary_embedding_dim=rotary_embedding_dim,
    )
    return y.to(x.dtype)


# -- embeddings ------------------------------------------------------------------------------------


@op("EmbedLayerNormalization", domain=MS, context=True)
def embed_layer_norm(
    input_ids,
    segment_ids,
    word_embedding,
    position_embedding,
    segment_embedding=None,
    gamma=None,
    beta=None,
    mask=None,
    position_ids=None,
    epsilon=1e-12,
    mask_index_type=1,
    ctx=None,
):
    """The bert fusion's embeddings: word + position (+ segment) embeddings, layer norm,
    and each sequence's count of ones in the mask as mask index (a count, as onnxruntime's
    CPU kernel computes it, not the position of the first zero the spec text names)."""
    seq = input_ids.shape[1]
    if position_ids is None:
        position_ids = torch.arange(seq, device=input_ids.device).reshape(1, seq)
    e = word_embedding[input_ids.long()] + position_embedding[position_ids.long()]
    if segment_ids is not None and segment_embedding is not None:
        e = e + segment_embedding[segment_ids.long()]
    cdt = _compute_dtype(e)
    y = F.layer_norm(e.to(cdt), e.shape[-1:], gamma.to(cdt), beta.to(cdt), epsilon).to(e.dtype)
    index = None
    if _wants(ctx, 1):
        if mask is None:  # onnxruntime writes zeros then
            index = torch.zeros(input_ids.shape[0], dtype=torch.int32, device=y.device)
        else:
            index = (mask != 0).sum(1).to(torch.int32)
    return y, index, e if _wants(ctx, 2) else None
