"""Random generators: RandomNormal(Like), RandomUniform(Like), Bernoulli, Multinomial.

Shapes and dtypes follow the spec; values cannot match another runtime's generator.
A ``seed`` attribute gives reproducible values within this evaluator.
"""

from __future__ import annotations

import torch

from ...dtypes import onnx_to_torch_dtype
from ..registry import op


def _generator(seed, device) -> torch.Generator | None:
    if seed is None:
        return None
    g = torch.Generator(device=device)
    # ONNX seeds are floats; keep their bits' worth of distinction
    g.manual_seed(int(seed * 1000003) & 0xFFFFFFFFFFFF)
    return g


def _device(ctx, *ts):
    if ctx is not None:
        return ctx.default_device(*ts)
    for t in ts:
        if isinstance(t, torch.Tensor):
            return t.device
    return torch.device("cpu")


def _normal(shape, dtype, mean, scale, seed, device):
    # sample in float32/float64: half types have no CPU generator in some builds
    work = torch.float64 if dtype == torch.float64 else torch.float32
    v = torch.randn(shape, dtype=work, device=device, generator=_generator(seed, device))
    return (v * scale + mean).to(dtype)


def _uniform(shape, dtype, low, high, seed, device):
    work = torch.float64 if dtype == torch.float64 else torch.float32
    v = torch.rand(shape, dtype=work, device=device, generator=_generator(seed, device))
    return (v * (high - low) + low).to(dtype)


@op("RandomNormal", since=1, context=True)
def random_normal(dtype=1, mean=0.0, scale=1.0, seed=None, shape=(), ctx=None):
    return _normal(list(shape), onnx_to_torch_dtype(dtype), mean, scale, seed, _device(ctx))


@op("RandomUniform", since=1, context=True)
def random_uniform(dtype=1, high=1.0, low=0.0, seed=None, shape=(), ctx=None):
    return _uniform(list(shape), onnx_to_torch_dtype(dtype), low, high, seed, _device(ctx))


@op("RandomNormalLike", since=1, context=True)
def random_normal_like(x, dtype=None, mean=0.0, scale=1.0, seed=None, ctx=None):
    dt = x.dtype if dtype is None else onnx_to_torch_dtype(dtype)
    return _normal(list(x.shape), dt, mean, scale, seed, _device(ctx, x))


@op("RandomUniformLike", since=1, context=True)
def random_uniform_like(x, dtype=None, high=1.0, low=0.0, seed=None, ctx=None):
    dt = x.dtype if dtype is None else onnx_to_torch_dtype(dtype)
    return _uniform(list(x.shape), dt, low, high, seed, _device(ctx, x))


@op("Bernoulli", since=15)
def bernoulli(x, dtype=None, seed=None):
    dt = x.dtype if dtype is None else onnx_to_torch_dtype(dtype)
    p = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return torch.bernoulli(p, generator=_generator(seed, x.device)).to(dt)


@op("Multinomial", since=7)
def multinomial(x, dtype=6, sample_size=1, seed=None):
    # input rows are unnormalised log-probabilities
    probs = torch.softmax(x.to(torch.float64 if x.dtype == torch.float64 else torch.float32), -1)
    s = torch.multinomial(
        probs, sample_size, replacement=True, generator=_generator(seed, x.device)
    )
    return s.to(onnx_to_torch_dtype(dtype))
