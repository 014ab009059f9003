"""onnxruntime's contrib attentions (com.microsoft): Attention (bert and gpt2 fusions),
MultiHeadAttention and GroupQueryAttention, as its CPU kernels compute them.

Masks follow onnxruntime, not -inf: the score of a key that ``mask_index`` or
``key_padding_mask`` hides is ``mask_filter_value`` (default -10000) plus the scaled
product, that of a key the causal mask hides the lowest float plus it, and
``attention_bias`` is added on top; so a row whose keys
are all padding averages every key, as onnxruntime's does. GroupQueryAttention leaves
the hidden keys out of its softmax altogether.

Not covered, each raising NotImplementedError that names it rather than computing
something else: Attention's 4-D (Megatron) mask and ``(3 * batch + 2)`` mask index, its
``do_rotary`` and ``past_present_share_buffer``; MultiHeadAttention's packed QKV / KV
inputs with a bias, its ``qk`` output, ``past_sequence_length`` and
``cache_indirection`` (beam search buffers); GroupQueryAttention's quantized KV cache,
``query_seqlens``, ``sliding_window_cache``, Q/K RMS norm weights and ``qk_output``.
Packed MultiHeadAttention inputs, which onnxruntime's CPU kernel refuses, are computed as
the same attention unpacked. Half precision inputs compute in float32 and round once.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ..registry import op
from .nn_attention import rotary_embedding as _rotary

MS = "com.microsoft"


def _wants(ctx: Any, k: int) -> bool:
    return ctx is None or (len(ctx.node.output) > k and bool(ctx.node.output[k]))


def _heads(x: torch.Tensor, n: int) -> torch.Tensor:
    """(B, S, N * H) -> (B, N, S, H)."""
    b, s, d = x.shape
    if d % n:
        raise ValueError(f"hidden size {d} is not a multiple of {n} heads")
    return x.reshape(b, s, n, d // n).transpose(1, 2)


def _merge(y: torch.Tensor) -> torch.Tensor:
    """(B, N, S, H) -> (B, S, N * H)."""
    b, n, s, h = y.shape
    return y.transpose(1, 2).reshape(b, s, n * h)


def _key_mask(
    mask: torch.Tensor | None, batch: int, q_len: int, total: int, name: str, device
) -> torch.Tensor | None:
    """Which keys a mask index / key padding mask hides: bool (B, S, T), True = hidden."""
    if mask is None:
        return None
    j = torch.arange(total, device=device)
    if mask.dim() == 1:
        n = mask.shape[0]
        m = mask.to(device).long()
        if n == batch:  # right padding: the valid length of each sequence
            hidden = j.reshape(1, -1) >= m.reshape(-1, 1)
        elif n == 2 * batch:  # left padding too: end positions, then start positions
            end, start = m[:batch].reshape(-1, 1), m[batch:].reshape(-1, 1)
            hidden = (j.reshape(1, -1) >= end) | (j.reshape(1, -1) < start)
        else:
            raise NotImplementedError(
                f"{name} of shape ({n},): only (batch,) and (2 * batch,) are covered"
                " ((3 * batch + 2,) is a CUDA-only format)"
            )
        return hidden.reshape(batch, 1, total).expand(batch, q_len, total)
    if mask.dim() == 2:
        if mask.shape[1] != total:
            raise ValueError(f"{name} has {mask.shape[1]} keys, the attention {total}")
        return (mask.to(device) <= 0).reshape(batch, 1, total).expand(batch, q_len, total)
    if mask.dim() == 3:
        return mask.to(device) <= 0
    raise NotImplementedError(f"{name} of rank {mask.dim()} (the Megatron 4-D mask)")


def _ort_bias(
    batch: int,
    q_len: int,
    total: int,
    hidden: torch.Tensor | None,
    causal: bool,
    mask_filter_value: float,
    attention_bias: torch.Tensor | None,
    device,
    past: int,
) -> torch.Tensor:
    """The additive (B or 1, 1 or N, S, T) float32 term onnxruntime adds to the scores.

    The causal mask lets query i see keys up to ``past + i``, and the last query every
    key, as onnxruntime does: with more keys than that (cross attention) query i sees the
    first ones, the last query all of them."""
    m = torch.zeros((batch if hidden is not None else 1, q_len, total), device=device)
    if hidden is not None:
        m = m.masked_fill(hidden, mask_filter_value)
    if causal:
        i = torch.arange(q_len, device=device).reshape(-1, 1)
        j = torch.arange(total, device=device).reshape(1, -1)
        # onnxruntime leaves the last query row unmasked: the same thing when there are
        # past + S keys, all the keys in cross attention
        m = m.masked_fill((j > i + past) & (i < q_len - 1), torch.finfo(torch.float32).min)
    m = m.unsqueeze(1)
    if attention_bias is not None:
        m = m + attention_bias.to(device, torch.float32)
    return m


def _attend(q, k, v, bias, scale: float | None) -> torch.Tensor:
    """softmax(scale * q k' + bias) v in float32; q (B, N, S, H), k / v (B, N, T, H)."""
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale + bias
    return torch.matmul(torch.softmax(scores, -1), v.float())


# -- Attention ---------------------------------------------------------------------------------


@op("Attention", domain=MS, context=True)
def attention_ms(
    x,
    weights,
    bias=None,
    mask_index=None,
    past=None,
    attention_bias=None,
    past_sequence_length=None,
    *,
    num_heads,
    do_rotary=0,
    mask_filter_value=-10000.0,
    past_present_share_buffer=0,
    qkv_hidden_sizes=None,
    rotary_embedding_dim=0,
    scale=None,
    unidirectional=0,
    ctx=None,
):
    if do_rotary:
        raise NotImplementedError("Attention: do_rotary=1")
    if past_present_share_buffer:
        raise NotImplementedError("Attention: past_present_share_buffer=1")
    total_w = weights.shape[1]
    sizes = list(qkv_hidden_sizes) if qkv_hidden_sizes else [total_w // 3] * 3
    if sum(sizes) != total_w:
        raise ValueError(f"Attention: qkv_hidden_sizes {sizes} do not add up to {total_w}")
    qkv = torch.matmul(x, weights)
    if bias is not None:
        qkv = qkv + bias
    q, k, v = (_heads(t, num_heads) for t in qkv.split(sizes, -1))
    if past is not None:
        k = torch.cat([past[0].to(k.dtype), k], 2)
        v = torch.cat([past[1].to(v.dtype), v], 2)
    batch, q_len, total = x.shape[0], x.shape[1], k.shape[2]
    hidden = _key_mask(mask_index, batch, q_len, total, "Attention: mask_index", x.device)
    b = _ort_bias(
        batch,
        q_len,
        total,
        hidden,
        bool(unidirectional),
        mask_filter_value,
        attention_bias,
        x.device,
        past.shape[3] if past is not None else 0,
    )
    y = _merge(_attend(q, k, v, b, scale)).to(x.dtype)
    return y, torch.stack([k, v]) if _wants(ctx, 1) else None


# -- MultiHeadAttention ------------------------------------------------------------------------


@op("MultiHeadAttention", domain=MS, context=True)
def multi_head_attention_ms(
    query,
    key=None,
    value=None,
    bias=None,
    key_padding_mask=None,
    attention_bias=None,
    past_key=None,
    past_value=None,
    past_sequence_length=None,
    cache_indirection=None,
    *,
    num_heads,
    mask_filter_value=-10000.0,
    scale=None,
    unidirectional=0,
    ctx=None,
):
    if query.dim() == 5 or (key is not None and key.dim() == 5):
        # onnxruntime's CPU kernel has neither packed form: the engine's fallback runs them
        if bias is not None:
            raise NotImplementedError("MultiHeadAttention: bias with packed QKV / KV inputs")
        if query.dim() == 5:  # (B, L, N, 3, H)
            query, key, value = (t.flatten(2) for t in query.unbind(3))
        else:  # (B, L, N, 2, H)
            key, value = (t.flatten(2) for t in key.unbind(3))
    if query.dim() != 3 or key is None or key.dim() not in (3, 4):
        raise ValueError("MultiHeadAttention: query must be 3-D and key given (3-D or 4-D)")
    if past_sequence_length is not None or cache_indirection is not None:
        raise NotImplementedError(
            "MultiHeadAttention: past_sequence_length / cache_indirection (shared buffers)"
        )
    if _wants(ctx, 3):
        raise NotImplementedError("MultiHeadAttention: the qk output")
    dq = query.shape[2]
    if bias is not None:
        bq, bk, bv = bias.split([dq, dq, bias.shape[0] - 2 * dq])
        query = query + bq
    q = _heads(query, num_heads)
    if key.dim() == 4:
        # keys and values already projected and split into heads (cross attention reusing
        # the encoder's): no bias to add, no past to prepend
        k, v = key, value
    else:
        if bias is not None:
            key, value = key + bk, value + bv
        k, v = _heads(key, num_heads), _heads(value, num_heads)
        if past_key is not None:
            k = torch.cat([past_key.to(k.dtype), k], 2)
            v = torch.cat([past_value.to(v.dtype), v], 2)
    past_len = past_key.shape[2] if past_key is not None and key.dim() == 3 else 0
    batch, q_len, total = query.shape[0], query.shape[1], k.shape[2]
    hidden = _key_mask(
        key_padding_mask, batch, q_len, total, "MultiHeadAttention: key_padding_mask", q.device
    )
    b = _ort_bias(
        batch,
        q_len,
        total,
        hidden,
        bool(unidirectional),
        mask_filter_value,
        attention_bias,
        q.device,
        past_len,
    )
    y = _merge(_attend(q, k, v, b, scale)).to(query.dtype)
    return (
        y,
        k if _wants(ctx, 1) else None,
        v if _wants(ctx, 2) else None,
        None,
    )


# -- GroupQueryAttention ----------------------------------------------------------------------


def _gqa_present(k, v, past_key, past_value, past_h, q_len, present_len):
    """The present key and value caches: each sequence's past keys, then its new ones."""
    batch, kv_num_heads, _, head = k.shape
    shape = (batch, kv_num_heads, present_len, head)
    pk = torch.zeros(shape, dtype=k.dtype, device=k.device)
    pv = torch.zeros(shape, dtype=v.dtype, device=v.device)
    for b in range(batch):
        p = int(past_h[b])
        if p:
            pk[b, :, :p] = past_key[b, :, :p]
            pv[b, :, :p] = past_value[b, :, :p]
        n = min(q_len, present_len - p)
        pk[b, :, p : p + n] = k[b, :, :n]
        pv[b, :, p : p + n] = v[b, :, :n]
    return pk, pv


def _gqa_softmax(scores, head_sink, smooth_softmax):
    """The attention probabilities; with a head sink (or smooth_softmax) one more logit
    per head in the denominator only: head_sink's, or 0."""
    if head_sink is None and smooth_softmax != 1:
        return torch.softmax(scores, -1)
    batch, num_heads, q_len = scores.shape[:3]
    sink = (
        head_sink.to(scores.device, torch.float32)
        if head_sink is not None
        else torch.zeros(num_heads, device=scores.device)
    )
    sink = sink.reshape(1, -1, 1, 1).expand(batch, num_heads, q_len, 1)
    return torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]


# seqlens_k and total_sequence_length size the cache: read on the host
@op("GroupQueryAttention", domain=MS, context=True, host_inputs=(5, 6))
def group_query_attention_ms(
    query,
    key=None,
    value=None,
    past_key=None,
    past_value=None,
    seqlens_k=None,
    total_sequence_length=None,
    cos_cache=None,
    sin_cache=None,
    position_ids=None,
    attention_bias=None,
    head_sink=None,
    k_scale=None,
    v_scale=None,
    q_norm_weight=None,
    k_norm_weight=None,
    query_seqlens=None,
    *,
    num_heads,
    kv_num_heads,
    causal=1,
    do_rotary=0,
    k_norm_epsilon=None,
    q_norm_epsilon=None,
    qk_norm_epsilon=1e-6,
    k_quant_type="NONE",
    v_quant_type="NONE",
    kv_cache_bit_width=0,
    local_window_size=-1,
    qk_output=0,
    rotary_interleaved=0,
    scale=None,
    sliding_window_cache=0,
    smooth_softmax=-1,
    softcap=0.0,
    ctx=None,
):
    unsupported = {
        "a quantized KV cache": k_quant_type != "NONE"
        or v_quant_type != "NONE"
        or kv_cache_bit_width
        or k_scale is not None
        or v_scale is not None,
        "query_seqlens": query_seqlens is not None,
        "sliding_window_cache=1": bool(sliding_window_cache),
        "q_norm_weight / k_norm_weight": q_norm_weight is not None or k_norm_weight is not None,
        "qk_output": bool(qk_output) or _wants(ctx, 3),
    }
    missing = [k for k, v in unsupported.items() if v]
    if missing:
        raise NotImplementedError(f"GroupQueryAttention: {', '.join(missing)}")
    if (past_key is not None and past_key.dtype != query.dtype) or seqlens_k is None:
        raise NotImplementedError(
            "GroupQueryAttention: past cache of another type, or no seqlens_k"
        )
    dev = query.device
    batch, q_len = query.shape[:2]
    if key is None:  # packed: (B, S, N * H + 2 * Nkv * H)
        head = query.shape[2] // (num_heads + 2 * kv_num_heads)
        query, key, value = query.split(
            [num_heads * head, kv_num_heads * head, kv_num_heads * head], -1
        )
    q, k, v = _heads(query, num_heads), _heads(key, kv_num_heads), _heads(value, kv_num_heads)
    head = q.shape[-1]
    # keys each sequence holds after this step, and before it: read on the host (the cache
    # is laid out from them), then copied once to the device for the masks
    lens_h = seqlens_k.cpu().long().reshape(-1) + 1
    total_max = int(total_sequence_length.reshape(-1)[0])
    first_prompt = past_key is None or (q_len > 1 and q_len == total_max)
    past_h = torch.zeros_like(lens_h) if first_prompt else lens_h - q_len
    lens, past_lens = lens_h.to(dev), past_h.to(dev)
    if do_rotary:
        steps = torch.arange(q_len, device=dev).reshape(1, -1)
        if position_ids is None:
            pos = past_lens.reshape(-1, 1) + steps
        elif first_prompt:
            # onnxruntime reads only the first position id then, for every sequence
            pos = (position_ids.reshape(-1)[:1].to(dev).long() + steps).expand(batch, q_len)
        else:
            pos = position_ids.to(dev).long()
        rot = dict(interleaved=rotary_interleaved, num_heads=0)
        cdt = torch.float32
        q = _rotary(q.to(cdt), cos_cache.to(cdt), sin_cache.to(cdt), pos, **rot).to(query.dtype)
        k = _rotary(k.to(cdt), cos_cache.to(cdt), sin_cache.to(cdt), pos, **rot).to(key.dtype)
    buffer = past_key.shape[2] if past_key is not None else 0
    present_len = max(total_max, buffer, int(lens_h.max()))
    pk, pv = _gqa_present(k, v, past_key, past_value, past_h, q_len, present_len)
    # which keys each query sees: those the sequence holds, up to its own position when
    # causal, and no further back than the window
    j = torch.arange(present_len, device=dev).reshape(1, 1, -1)
    qpos = past_lens.reshape(-1, 1, 1) + torch.arange(q_len, device=dev).reshape(1, -1, 1)
    seen = j < lens.reshape(-1, 1, 1)
    if causal:
        seen = seen & (j <= qpos)
        if local_window_size >= 0:
            seen = seen & (j > qpos - local_window_size)
    if scale is None or scale == 0.0:
        scale = 1.0 / math.sqrt(head)
    group = num_heads // kv_num_heads
    kk = pk.float().repeat_interleave(group, 1)
    vv = pv.float().repeat_interleave(group, 1)
    scores = torch.matmul(q.float(), kk.transpose(-1, -2)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if attention_bias is not None:
        scores = scores + attention_bias.to(dev, torch.float32)[..., :present_len]
    scores = scores.masked_fill(~seen.unsqueeze(1), float("-inf"))
    probs = _gqa_softmax(scores, head_sink, smooth_softmax)
    y = _merge(torch.matmul(probs, vv)).to(query.dtype)
    return y, pk if _wants(ctx, 1) else None, pv if _wants(ctx, 2) else None, None
