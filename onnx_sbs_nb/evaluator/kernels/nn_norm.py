"""Normalizations: BatchNormalization, InstanceNormalization, LayerNormalization,
GroupNormalization, LpNormalization, MeanVarianceNormalization, LRN, RMSNormalization."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...dtypes import onnx_to_torch_dtype
from ..registry import op


def _wants(ctx, k: int) -> bool:
    """Whether the node consumes its k-th output (ctx None: called directly, assume yes)."""
    return ctx is None or (len(ctx.node.output) > k and bool(ctx.node.output[k]))


def _channel(v: torch.Tensor, rank: int) -> torch.Tensor:
    return v.reshape(-1, *([1] * (rank - 2)))


def _bn_inference(x, scale, bias, mean, var, epsilon):
    if x.dim() >= 2 and scale.dim() == 1:
        return F.batch_norm(x, mean, var, scale, bias, False, 0.0, epsilon)
    r = x.dim()
    return (x - _channel(mean, r)) / torch.sqrt(_channel(var, r) + epsilon) * _channel(
        scale, r
    ) + _channel(bias, r)


def _bn_stats(x):
    axes = [0, *range(2, x.dim())]
    mean = x.mean(dim=axes)
    var = x.var(dim=axes, unbiased=False)
    return mean, var


@op("BatchNormalization", since=1, context=True)
def batch_norm_1(
    x,
    scale,
    bias,
    mean,
    var,
    epsilon=1e-5,
    is_test=0,
    momentum=0.9,
    spatial=1,
    consumed_inputs=None,
    ctx=None,
):
    if is_test:
        return _bn_inference(x, scale, bias, mean, var, epsilon)
    return _bn_train_legacy(x, scale, bias, mean, var, epsilon, momentum, ctx)


def _bn_train_legacy(x, scale, bias, mean, var, epsilon, momentum, ctx):
    # training statistics only when the node declares the extra outputs
    if ctx is None or not _wants(ctx, 1):
        return _bn_inference(x, scale, bias, mean, var, epsilon)
    sm, sv = _bn_stats(x)
    y = _bn_inference(x, scale, bias, sm, sv, epsilon)
    return (y, mean * momentum + sm * (1 - momentum), var * momentum + sv * (1 - momentum), sm, sv)


@op("BatchNormalization", since=7, context=True)
def batch_norm_7(x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, spatial=1, ctx=None):
    # before opset 14 the mode follows the number of outputs the node declares
    return _bn_train_legacy(x, scale, bias, mean, var, epsilon, momentum, ctx)


@op("BatchNormalization", since=9, context=True)
def batch_norm_9(x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, ctx=None):
    return _bn_train_legacy(x, scale, bias, mean, var, epsilon, momentum, ctx)


@op("BatchNormalization", since=14)
def batch_norm_14(x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, training_mode=0):
    if not training_mode:
        return _bn_inference(x, scale, bias, mean, var, epsilon)
    sm, sv = _bn_stats(x)
    y = _bn_inference(x, scale, bias, sm, sv, epsilon)
    return y, mean * momentum + sm * (1 - momentum), var * momentum + sv * (1 - momentum)


@op("InstanceNormalization", since=1)
def instance_norm(x, scale, b, epsilon=1e-5, consumed_inputs=None):
    return F.instance_norm(x, weight=scale, bias=b, eps=epsilon)


def _stash(x, stash_type):
    """Computation dtype: ``stash_type`` (an ONNX element type) for low-precision inputs."""
    if x.dtype in (torch.float16, torch.bfloat16):
        return onnx_to_torch_dtype(stash_type) if stash_type else torch.float32
    return x.dtype


@op("LayerNormalization", since=17, context=True)
def layer_norm(x, scale, b=None, axis=-1, epsilon=1e-5, stash_type=1, ctx=None):
    axis = axis % x.dim()
    nshape = list(x.shape[axis:])
    cdt = _stash(x, stash_type)
    if (
        not _wants(ctx, 1)
        and not _wants(ctx, 2)
        and list(scale.shape) == nshape
        and (b is None or list(b.shape) == nshape)
        and (cdt == x.dtype or cdt == torch.float32)
    ):
        # torch already accumulates half inputs in float32
        return F.layer_norm(x, nshape, scale, b, epsilon)
    axes = list(range(axis, x.dim()))
    xc = x.to(cdt)
    mean = xc.mean(dim=axes, keepdim=True)
    d = xc - mean
    inv = torch.rsqrt((d * d).mean(dim=axes, keepdim=True) + epsilon)
    y = (d * inv).to(x.dtype) * scale
    if b is not None:
        y = y + b
    return y, mean, inv


@op("GroupNormalization", since=18)
def group_norm_18(x, scale, bias, epsilon=1e-5, num_groups=0):
    # opset 18: scale and bias hold one value per group
    per = x.shape[1] // num_groups
    return _group_norm(
        x, scale.repeat_interleave(per), bias.repeat_interleave(per), epsilon, num_groups, 1
    )


@op("GroupNormalization", since=21)
def group_norm_21(x, scale, bias, epsilon=1e-5, num_groups=0, stash_type=1):
    return _group_norm(x, scale, bias, epsilon, num_groups, stash_type)


def _group_norm(x, scale, bias, epsilon, num_groups, stash_type):
    cdt = _stash(x, stash_type)
    y = F.group_norm(x.to(cdt), num_groups, None, None, epsilon).to(x.dtype)
    r = x.dim()
    return y * _channel(scale, r) + _channel(bias, r)


@op("LpNormalization", since=1)
def lp_norm(x, axis=-1, p=2):
    if p == 1:
        n = x.abs().sum(dim=axis, keepdim=True)
    else:
        n = torch.sqrt((x * x).sum(dim=axis, keepdim=True))
    return torch.where(n == 0, torch.zeros((), dtype=x.dtype, device=x.device), x / n)


@op("MeanVarianceNormalization", since=9)
def mvn(x, axes=(0, 2, 3)):
    axes = list(axes)
    mean = x.mean(dim=axes, keepdim=True)
    std = torch.sqrt((x * x).mean(dim=axes, keepdim=True) - mean * mean)
    return (x - mean) / (std + 1e-9)


@op("LRN", since=1)
def lrn(x, size, alpha=0.0001, beta=0.75, bias=1.0):
    sq = x * x
    front, back = (size - 1) // 2, size - 1 - (size - 1) // 2
    pad = [0, 0] * (x.dim() - 2) + [front, back]
    win = F.pad(sq, pad).unfold(1, size, 1).sum(-1)
    return x / (bias + alpha / size * win) ** beta


@op("RMSNormalization", since=23)
def rms_norm(x, scale, axis=-1, epsilon=1e-5, stash_type=1):
    axis = axis % x.dim()
    cdt = _stash(x, stash_type)
    xc = x.to(cdt)
    ms = (xc * xc).mean(dim=list(range(axis, x.dim())), keepdim=True)
    return (xc * torch.rsqrt(ms + epsilon)).to(x.dtype) * scale
