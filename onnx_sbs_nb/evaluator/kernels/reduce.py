"""Reductions (ai.onnx): Reduce*, ArgMax/ArgMin, CumSum."""

from __future__ import annotations

import math

import torch

from ..registry import op
from ._helpers import WIDE_UNSIGNED, as_ints, norm_axis


def _empty_fill(name: str, x: torch.Tensor) -> float:
    if x.dtype == torch.bool:
        return name in ("ReduceMin", "ReduceProd")
    if name in ("ReduceMax",):
        return -math.inf if x.is_floating_point() else torch.iinfo(x.dtype).min
    if name in ("ReduceMin",):
        return math.inf if x.is_floating_point() else torch.iinfo(x.dtype).max
    if name in ("ReduceLogSum", "ReduceLogSumExp"):
        return -math.inf
    if name == "ReduceProd":
        return 1
    return 0


def _reduce_all_axes(fn, x, axes, keep):
    for a in sorted(axes, reverse=True):
        x = fn(x, a, keep)
    return x


_IMPL = {
    "ReduceSum": lambda x, d, k: torch.sum(x, dim=d, keepdim=k),
    "ReduceMean": lambda x, d, k: torch.mean(x, dim=d, keepdim=k),
    "ReduceMax": lambda x, d, k: torch.amax(x, dim=d, keepdim=k),
    "ReduceMin": lambda x, d, k: torch.amin(x, dim=d, keepdim=k),
    "ReduceProd": lambda x, d, k: _reduce_all_axes(
        lambda t, a, kk: torch.prod(t, dim=a, keepdim=kk), x, d, k
    ),
    "ReduceL1": lambda x, d, k: torch.sum(torch.abs(x), dim=d, keepdim=k),
    "ReduceL2": lambda x, d, k: torch.sqrt(torch.sum(x * x, dim=d, keepdim=k)),
    "ReduceLogSum": lambda x, d, k: torch.log(torch.sum(x, dim=d, keepdim=k)),
    "ReduceLogSumExp": lambda x, d, k: torch.logsumexp(x, dim=d, keepdim=k),
    "ReduceSumSquare": lambda x, d, k: torch.sum(x * x, dim=d, keepdim=k),
}


def reduce(name: str, x: torch.Tensor, axes: list[int], keepdims: int, noop: int):
    if len(axes) == 1 and x.is_floating_point() and x.numel() and name in _SINGLE:
        return _SINGLE[name](x, axes[0], bool(keepdims))
    if not axes:
        if noop:
            return x
        axes = list(range(x.dim()))
    if x.dim() == 0:
        return x.clone()
    axes = sorted({norm_axis(a, x.dim()) for a in axes})
    keep = bool(keepdims)
    dtype = x.dtype
    if x.numel() == 0:
        shape = (
            [1 if i in axes else d for i, d in enumerate(x.shape)]
            if keep
            else [d for i, d in enumerate(x.shape) if i not in axes]
        )
        return torch.full(shape, _empty_fill(name, x), dtype=dtype, device=x.device)
    if dtype in WIDE_UNSIGNED or (dtype == torch.bool and name in ("ReduceMax", "ReduceMin")):
        return _IMPL[name](x.to(torch.int64), axes, keep).to(dtype)
    if not x.is_floating_point() and name in (
        "ReduceMean",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
    ):
        return _IMPL[name](x.to(torch.float64), axes, keep).to(dtype)
    res = _IMPL[name](x, axes, keep)
    return res.to(dtype) if res.dtype != dtype else res


# the frequent case (one axis, float data) without the general path's bookkeeping
_SINGLE = {
    "ReduceSum": lambda x, d, k: torch.sum(x, dim=d, keepdim=k),
    "ReduceMean": lambda x, d, k: torch.mean(x, dim=d, keepdim=k),
    "ReduceMax": lambda x, d, k: torch.amax(x, dim=d, keepdim=k),
    "ReduceMin": lambda x, d, k: torch.amin(x, dim=d, keepdim=k),
}


def _register(name: str, since_input: int) -> None:
    def attr_form(x, axes=None, keepdims=1, noop_with_empty_axes=0):
        return reduce(name, x, list(axes or []), keepdims, noop_with_empty_axes)

    def input_form(x, axes=None, keepdims=1, noop_with_empty_axes=0):
        return reduce(name, x, as_ints(axes), keepdims, noop_with_empty_axes)

    attr_form.__name__ = input_form.__name__ = name.lower()
    placement = "follow" if name in _SHAPE_ARITHMETIC else "device"
    op(name, since=1, placement=placement)(attr_form)
    op(name, since=since_input, int_inputs=(1,), placement=placement)(input_form)


# the reductions shape arithmetic uses (the product of dimensions...): on the host when
# their inputs are
_SHAPE_ARITHMETIC = frozenset(("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"))


for _name in _IMPL:
    _register(_name, 13 if _name == "ReduceSum" else 18)


def _arg(fn, x, axis, keepdims, select_last_index):
    axis = norm_axis(axis, x.dim())
    if x.dtype in WIDE_UNSIGNED or x.dtype == torch.bool:
        x = x.to(torch.int64)
    if select_last_index:
        n = x.shape[axis]
        res = (n - 1) - fn(torch.flip(x, [axis]), dim=axis, keepdim=bool(keepdims))
    else:
        res = fn(x, dim=axis, keepdim=bool(keepdims))
    return res.to(torch.int64)


@op("ArgMax", since=1)
def argmax(x, axis=0, keepdims=1, select_last_index=0):
    return _arg(torch.argmax, x, axis, keepdims, select_last_index)


@op("ArgMin", since=1)
def argmin(x, axis=0, keepdims=1, select_last_index=0):
    return _arg(torch.argmin, x, axis, keepdims, select_last_index)


@op("CumSum", since=11, int_inputs=(1,))
def cumsum(x, axis, exclusive=0, reverse=0):
    a = norm_axis(as_ints(axis)[0], x.dim())
    dtype = x.dtype
    if dtype in WIDE_UNSIGNED:
        x = x.to(torch.int64)
    if reverse:
        x = torch.flip(x, [a])
    y = torch.cumsum(x, dim=a)
    if exclusive:
        y = y - x
    if reverse:
        y = torch.flip(y, [a])
    return y.to(dtype)


@op("CumProd", since=26, int_inputs=(1,))
def cumprod(x, axis, exclusive=0, reverse=0):
    a = norm_axis(as_ints(axis)[0], x.dim())
    if reverse:
        x = torch.flip(x, [a])
    if exclusive:
        pad = torch.ones_like(x.narrow(a, 0, 1))
        y = torch.cumprod(torch.cat([pad, x.narrow(a, 0, x.shape[a] - 1)], dim=a), dim=a)
    else:
        y = torch.cumprod(x, dim=a)
    if reverse:
        y = torch.flip(y, [a])
    return y.to(x.dtype)
