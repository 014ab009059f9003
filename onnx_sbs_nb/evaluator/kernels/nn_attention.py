"""Attention (opsets 23-25) and RotaryEmbedding (opset 23)."""

from __future__ import annotations

import math
from typing import Any

import torch

from ...dtypes import onnx_to_torch_dtype
from ..registry import op
from ._nn_common import register_versions

_NEG_INF = float("-inf")


def _split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, s, h = x.shape
    return x.reshape(b, s, heads, h // heads).transpose(1, 2)


def _additive(allowed: torch.Tensor, dtype: torch.dtype, device) -> torch.Tensor:
    """An additive mask: 0 where allowed, -inf elsewhere."""
    zero = torch.zeros((), dtype=dtype, device=device)
    return torch.where(allowed, zero, torch.full((), _NEG_INF, dtype=dtype, device=device))


def _query_minus_key(base, offset, device) -> torch.Tensor:
    """i + offset - j for query i and key j: (q, kv), or (batch, 1, q, kv) for an offset
    per batch."""
    q, kv = base.shape[-2:]
    i = torch.arange(q, device=device).reshape(q, 1)
    j = torch.arange(kv, device=device).reshape(1, kv)
    if isinstance(offset, torch.Tensor):
        return (i + offset.reshape(-1, 1, 1).to(device) - j).unsqueeze(1)
    return i + int(offset) - j


def _causal_bias(base, offset, dtype, device):
    """base + (0 where key j <= query i + offset, -inf elsewhere); offset scalar or (batch,)."""
    return base + _additive(_query_minus_key(base, offset, device) >= 0, dtype, device)


def _window_bias(base, left, right, offset, dtype, device):
    diff = _query_minus_key(base, offset, device)
    allowed = torch.ones_like(diff, dtype=torch.bool)
    if left >= 0:
        allowed &= diff <= left
    if right >= 0:
        allowed &= -diff <= right
    return base + _additive(allowed, dtype, device)


def attention(
    q,
    k,
    v,
    attn_mask=None,
    past_key=None,
    past_value=None,
    nonpad_kv_seqlen=None,
    *,
    is_causal=0,
    kv_num_heads=None,
    q_num_heads=None,
    qk_matmul_output_mode=0,
    scale=None,
    softcap=0.0,
    softmax_precision=None,
    left_window_size=-1,
    right_window_size=-1,
):
    """The ONNX Attention function (the reference's computation, with torch)."""
    if (past_key is None) != (past_value is None):
        raise ValueError("Attention: past_key and past_value must be given together")
    rank3 = q.dim() == 3
    if rank3:
        if q_num_heads is None or kv_num_heads is None:
            raise ValueError("Attention: 3-D inputs need q_num_heads and kv_num_heads")
        q = _split_heads(q, q_num_heads)
        k = _split_heads(k, kv_num_heads)
        v = _split_heads(v, kv_num_heads)
    out_dt, dev = q.dtype, q.device
    if scale is None:
        scale = 1 / math.sqrt(q.shape[3])
    root = math.sqrt(scale)
    if past_key is not None:
        k = torch.cat([past_key, k], 2)
        v = torch.cat([past_value, v], 2)
    present_key, present_value = k, v
    if out_dt in (torch.float16, torch.bfloat16):
        # half precision computes in float32 and rounds once, as fused attention kernels
        # (onnxruntime's, torch's) accumulate
        q, k, v = q.float(), k.float(), v.float()
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            attn_mask = attn_mask.float()
    dt = q.dtype
    lq, lkv = q.shape[2], k.shape[2]
    bias = torch.zeros((lq, lkv), dtype=dt, device=dev)
    if attn_mask is not None:
        pad = lkv - attn_mask.shape[-1]
        if pad > 0:
            fill = False if attn_mask.dtype == torch.bool else _NEG_INF
            attn_mask = torch.nn.functional.pad(attn_mask, (0, pad), value=fill)
        if attn_mask.dtype == torch.bool:
            attn_mask = _additive(attn_mask, dt, dev)
    windowed = left_window_size >= 0 or right_window_size >= 0
    external = past_key is None and nonpad_kv_seqlen is not None
    offset = (
        (nonpad_kv_seqlen.reshape(-1).to(dev) - lq)
        if external
        else (past_key.shape[2] if past_key is not None else 0)
    )
    if is_causal:
        base = bias if attn_mask is None else attn_mask.to(dt)
        if windowed:
            base = bias + base
        bias = _causal_bias(base, offset, dt, dev)
    elif attn_mask is not None:
        bias = bias + attn_mask.to(dt)
    if windowed:
        bias = _window_bias(
            torch.zeros((lq, lkv), dtype=dt, device=dev) + bias,
            left_window_size,
            right_window_size,
            offset,
            dt,
            dev,
        )
    if nonpad_kv_seqlen is not None:
        keep = torch.arange(lkv, device=dev) < nonpad_kv_seqlen.to(dev).reshape(-1, 1)
        bias = bias + _additive(keep, dt, dev).reshape(-1, 1, 1, lkv)
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        if hq % hk:
            raise ValueError(f"Attention: {hq} query heads are not a multiple of {hk} key heads")
        k = k.repeat_interleave(hq // hk, 1)
        v = v.repeat_interleave(hq // hk, 1)
    qk = torch.matmul(q * root, (k * root).transpose(-1, -2))
    if softcap and softcap > 0:
        qk = torch.tanh(qk / softcap) * softcap
    with_bias = qk + bias
    qk_out = with_bias if qk_matmul_output_mode == 2 else qk
    sm_in = with_bias
    if softmax_precision:
        sm_in = sm_in.to(onnx_to_torch_dtype(softmax_precision))
    row_max = sm_in.amax(-1, keepdim=True)
    safe = torch.where(torch.isneginf(row_max), torch.zeros_like(row_max), row_max)
    e = torch.exp(sm_in - safe)
    s = e.sum(-1, keepdim=True)
    probs = e / torch.where(s == 0, torch.ones_like(s), s)
    all_masked = torch.isneginf(bias.amax(-1, keepdim=True))
    probs = torch.where(all_masked, torch.zeros_like(probs), probs)
    if qk_matmul_output_mode == 3:
        qk_out = probs
    probs = probs.to(dt)
    y = torch.matmul(probs, v)
    if rank3:
        y = y.transpose(1, 2).reshape(y.shape[0], y.shape[2], -1)
    return y.to(out_dt), present_key, present_value, qk_out.to(out_dt)


def _attention_25(q: torch.Tensor, *inputs: torch.Tensor | None, **attrs: Any) -> tuple:
    if q.dim() == 4 and (
        attrs.get("q_num_heads") is not None or attrs.get("kv_num_heads") is not None
    ):
        raise ValueError("Attention: q_num_heads and kv_num_heads must not be set for 4-D inputs")
    return attention(q, *inputs, **attrs)


# opset 24 added the input nonpad_kv_seqlen, opset 25 the sliding window (and the rule
# that 4-D inputs take no head counts)
_ATTENTION_ATTRS = (
    "is_causal",
    "kv_num_heads",
    "q_num_heads",
    "qk_matmul_output_mode",
    "scale",
    "softcap",
    "softmax_precision",
)
register_versions(
    "Attention", attention, {23: _ATTENTION_ATTRS, 24: _ATTENTION_ATTRS}, max_inputs={23: 6}
)
register_versions(
    "Attention",
    _attention_25,
    {25: (*_ATTENTION_ATTRS, "left_window_size", "right_window_size")},
)


@op("RotaryEmbedding", since=23)
def rotary_embedding(
    x, cos_cache, sin_cache, position_ids=None, interleaved=0, num_heads=0, rotary_embedding_dim=0
):
    shape = x.shape
    if x.dim() == 4:
        x = x.transpose(1, 2)  # (batch, seq, heads, head)
    else:
        if not num_heads:
            raise ValueError("RotaryEmbedding: 3-D input needs num_heads")
        x = x.reshape(shape[0], shape[1], num_heads, shape[2] // num_heads)
    rd = rotary_embedding_dim or x.shape[3]
    rot, rest = x[..., :rd], x[..., rd:]
    if position_ids is not None:
        cos_cache = cos_cache[position_ids.long()]
        sin_cache = sin_cache[position_ids.long()]
    if cos_cache.shape[-1] != rd // 2 or sin_cache.shape[-1] != rd // 2:
        raise ValueError(f"RotaryEmbedding: caches' last dimension must be {rd // 2}")
    cos = cos_cache.unsqueeze(2)
    sin = sin_cache.unsqueeze(2)
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    else:
        x1, x2 = rot.chunk(2, -1)
    real = cos * x1 - sin * x2
    imag = sin * x1 + cos * x2
    if interleaved:
        rot = torch.stack([real, imag], -1).reshape(rot.shape)
    else:
        rot = torch.cat([real, imag], -1)
    out = torch.cat([rot, rest], -1).to(x.dtype)
    if len(shape) == 3:
        return out.reshape(shape)
    return out.transpose(1, 2)


def _heads_4d(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, hd = x.shape
    if hd % heads:
        raise ValueError(f"last dimension {hd} is not a multiple of {heads} heads")
    return x.reshape(b, t, heads, hd // heads).transpose(1, 2)


@op("LinearAttention", since=27)
def linear_attention(
    query,
    key,
    value,
    past_state=None,
    decay=None,
    beta=None,
    chunk_size=64,
    kv_num_heads=None,
    q_num_heads=None,
    scale=0.0,
    update_rule="gated_delta",
):
    """The recurrent form (chunk_size only tunes chunked implementations)."""
    if update_rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ValueError(f"LinearAttention: unknown update_rule {update_rule!r}")
    if not q_num_heads or not kv_num_heads or q_num_heads % kv_num_heads:
        raise ValueError("LinearAttention: q_num_heads must be a positive multiple of kv_num_heads")
    gating = update_rule in ("gated", "gated_delta")
    delta = update_rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise ValueError(f"LinearAttention: update_rule {update_rule!r} and decay/beta disagree")
    f32 = torch.float32
    b, t, _ = query.shape
    dk = query.shape[-1] // q_num_heads
    dv = value.shape[-1] // kv_num_heads
    group = q_num_heads // kv_num_heads
    q4 = _heads_4d(query, q_num_heads).to(f32)
    k4 = _heads_4d(key, kv_num_heads).to(f32)
    v4 = _heads_4d(value, kv_num_heads).to(f32)
    if decay is not None:
        if decay.shape[-1] == kv_num_heads:
            decay4 = decay.reshape(b, t, kv_num_heads, 1).transpose(1, 2).to(f32)
        else:
            decay4 = _heads_4d(decay, kv_num_heads).to(f32)
    if beta is not None:
        beta4 = beta.reshape(b, t, beta.shape[-1], 1).transpose(1, 2).to(f32)
    if past_state is not None:
        state_dtype = past_state.dtype
        state = past_state.to(f32)
    else:
        state_dtype = query.dtype
        state = torch.zeros((b, kv_num_heads, dk, dv), dtype=f32, device=query.device)
    sc = 1.0 / math.sqrt(dk) if not scale else float(scale)
    outs = []
    for i in range(t):
        k_t, v_t = k4[:, :, i], v4[:, :, i]
        if gating:
            state = state * torch.exp(decay4[:, :, i]).unsqueeze(-1)
        if delta:
            retrieved = torch.einsum("bhdm,bhd->bhm", state, k_t)
            v_t = beta4[:, :, i] * (v_t - retrieved)
        state = state + k_t.unsqueeze(-1) * v_t.unsqueeze(-2)
        read = state if group == 1 else state.repeat_interleave(group, 1)
        outs.append(sc * torch.einsum("bhd,bhdm->bhm", q4[:, :, i], read))
    out = torch.stack(outs, 2) if outs else q4.new_zeros((b, q_num_heads, 0, dv))
    out = out.transpose(1, 2).reshape(b, t, q_num_heads * dv).to(query.dtype)
    return out, state.to(state_dtype)


@op("FlexAttention", since=1, domain="ai.onnx.preview", context=True)
def flex_attention(
    q, k, v, prob_mod=None, scale=None, score_mod=None, softmax_precision=None, ctx=None
):
    """Attention whose scores and probabilities pass through optional subgraphs."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("FlexAttention: Q, K and V must be rank 4")
    hq, hk = q.shape[1], k.shape[1]
    if hq != hk:
        if hq % hk:
            raise ValueError(f"FlexAttention: {hq} query heads are not a multiple of {hk}")
        k = k.repeat_interleave(hq // hk, 1)
        v = v.repeat_interleave(hq // hk, 1)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[3])
    root = torch.tensor(math.sqrt(scale), dtype=torch.float32).to(q.dtype)
    scores = torch.matmul(q * root.to(q.device), (k * root.to(q.device)).transpose(-1, -2))
    if softmax_precision:
        cdt = onnx_to_torch_dtype(softmax_precision)
    else:
        cdt = torch.float32 if q.dtype.itemsize < 4 else q.dtype
    scores = scores.to(cdt)
    if score_mod is not None:
        scores = _run_mod(ctx, score_mod, scores).to(cdt)
    probs = torch.softmax(scores, -1)
    if prob_mod is not None:
        probs = _run_mod(ctx, prob_mod, probs).to(cdt)
    return torch.matmul(probs, v.to(cdt)).to(v.dtype)


def _run_mod(ctx, graph, value):
    if ctx is None:
        raise ValueError("FlexAttention with score_mod/prob_mod needs the evaluator's context")
    outs = ctx.run_graph(graph, [value])
    if len(outs) != 1:
        raise ValueError("FlexAttention: a modifier graph must have exactly one output")
    return outs[0]
