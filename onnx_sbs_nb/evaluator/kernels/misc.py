"""Softmax/LogSoftmax/Hardmax (with the 2-D coercion of opsets < 13) and Dropout (ai.onnx)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ..registry import op
from ._helpers import norm_axis


def _coerced(fn, x: torch.Tensor, axis: int) -> torch.Tensor:
    """Opsets < 13 flatten the input to 2-D at ``axis`` and normalise each row."""
    if x.dim() == 0:
        return fn(x.reshape(1, 1), 1).reshape(())
    axis = norm_axis(axis, x.dim())
    rows = math.prod(x.shape[:axis])
    return fn(x.reshape(rows, -1), 1).reshape(x.shape)


def _hardmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    idx = torch.argmax(x, dim=dim, keepdim=True)
    return torch.zeros_like(x).scatter(dim, idx, 1)


for _name, _fn in (
    ("Softmax", lambda x, d: torch.softmax(x, d)),
    ("LogSoftmax", lambda x, d: torch.log_softmax(x, d)),
    ("Hardmax", _hardmax),
):

    def _old(x, axis=1, _fn=_fn):
        return _coerced(_fn, x, axis)

    def _new(x, axis=-1, _fn=_fn):
        if x.dim() == 0:
            return _fn(x.reshape(1), 0).reshape(())
        return _fn(x, axis)

    _old.__name__ = _new.__name__ = _name.lower()
    op(_name, since=1)(_old)
    op(_name, since=13)(_new)


def _keep_mask(x: torch.Tensor, ratio: float, seed) -> torch.Tensor:
    """The kept positions. The spec leaves the draws free; with a ``seed`` they are those
    of the ONNX reference (numpy's legacy generator seeded with it, uniform >= ratio), so a
    seeded training-mode Dropout gives the values other runtimes' tests expect."""
    if seed is None:
        return torch.rand(x.shape, device=x.device) >= ratio
    draws = np.random.RandomState(int(seed)).uniform(0.0, 1.0, tuple(x.shape))
    return torch.from_numpy(draws >= ratio).to(x.device)


def _dropout(x, ratio: float, training: bool, with_mask_bool: bool, seed=None):
    if not training or ratio == 0:
        mask = torch.ones(x.shape, dtype=torch.bool, device=x.device)
        return x, mask if with_mask_bool else mask.to(x.dtype)
    keep = _keep_mask(x, ratio, seed)
    y = torch.where(keep, x / (1 - ratio), torch.zeros((), dtype=x.dtype, device=x.device))
    return y, keep if with_mask_bool else keep.to(x.dtype)


@op("Dropout", since=1)
def dropout_v1(x, is_test=0, ratio=0.5):
    return _dropout(x, ratio, False, False)


@op("Dropout", since=7)
def dropout_v7(x, ratio=0.5):
    return _dropout(x, ratio, False, False)


@op("Dropout", since=10)
def dropout_v10(x, ratio=0.5):
    return _dropout(x, ratio, False, True)


@op("Dropout", since=12, host_inputs=(1, 2))
def dropout(x, ratio=None, training_mode=None, seed=None):
    r = float(ratio.item()) if ratio is not None else 0.5
    training = bool(training_mode.item()) if training_mode is not None else False
    return _dropout(x, r, training, True, seed)


@op("BitCast", since=26)
def bitcast(x, to):
    from ...dtypes import onnx_to_torch_dtype

    dtype = onnx_to_torch_dtype(to)
    if dtype.itemsize != x.dtype.itemsize:
        raise ValueError(f"BitCast: {x.dtype} and {dtype} have different bit widths")
    # torch views between these widths are bit-exact reinterpretations (little endian)
    return x.contiguous().view(dtype)


@op("SwiGLU", since=28)
def swiglu(a, b, alpha=1.0):
    return a * torch.sigmoid(alpha * a) * b


@op("TensorScatter", since=24)
def tensor_scatter(past_cache, update, write_indices=None, mode="linear", axis=-2):
    axis = norm_axis(axis, past_cache.dim())
    batch, seq, max_seq = update.shape[0], update.shape[axis], past_cache.shape[axis]
    start = (
        write_indices.to(torch.int64).reshape(batch, 1)
        if write_indices is not None
        else torch.zeros((batch, 1), dtype=torch.int64)
    ).to(update.device, non_blocking=True)
    pos = start + torch.arange(seq, device=update.device).reshape(1, seq)
    if mode == "circular":
        pos = pos.remainder(max_seq)
    view = [1] * update.dim()
    view[0], view[axis] = batch, seq
    if axis == 0:
        view[0] = seq
        pos = pos[0]
    index = pos.reshape(view).expand(update.shape)
    return past_cache.scatter(axis, index, update)
