"""Gather/Scatter family, Compress, NonZero, OneHot, ReverseSequence, TopK, Unique (ai.onnx)."""

from __future__ import annotations

import math
import warnings

import torch

from ..inline import HELPERS
from ..registry import op
from ._helpers import WIDE_UNSIGNED, as_ints, norm_axis


def _fix_neg(idx: torch.Tensor, dim) -> torch.Tensor:
    idx = idx.to(torch.int64)
    return torch.where(idx < 0, idx + dim, idx)


@op("Gather", since=1, host_inputs=(1,), placement="follow")
def gather(x, indices, axis=0):
    # torch's advanced indexing has ONNX Gather's semantics: the index shape replaces
    # the axis, negative indices count from the end, out-of-range ones raise
    if axis == 0:
        return x[indices]
    return x[(slice(None),) * norm_axis(axis, x.dim()) + (indices,)]


@op("GatherElements", since=11)
def gather_elements(x, indices, axis=0):
    axis = norm_axis(axis, x.dim())
    return torch.gather(x, axis, _fix_neg(indices, x.shape[axis]))


def _dims(shape, like: torch.Tensor) -> torch.Tensor:
    # built on the host and copied without waiting for the device queue
    return torch.tensor(list(shape), dtype=torch.int64).to(like.device, non_blocking=True)


def _nd_index(x: torch.Tensor, indices: torch.Tensor, batch_dims: int):
    """(flattened data, index tuple, result shape prefix) for GatherND/ScatterND."""
    k = indices.shape[-1]
    batch = list(x.shape[:batch_dims])
    nb = math.prod(batch)
    xr = x.reshape(nb, *x.shape[batch_dims:])
    idx = indices.to(torch.int64).reshape(nb, -1, k)
    idx = torch.where(idx < 0, idx + _dims(x.shape[batch_dims : batch_dims + k], idx), idx)
    bidx = torch.arange(nb, device=idx.device).reshape(nb, 1).expand(nb, idx.shape[1])
    return xr, (bidx, *idx.unbind(-1)), k


@op("GatherND", since=11)
def gather_nd(x, indices, batch_dims=0):
    if batch_dims == 0:
        # one advanced indexing, without the batch bookkeeping below (a tenth of the cost)
        return HELPERS["_gather_nd0"](x, indices)
    xr, index, k = _nd_index(x, indices, batch_dims)
    out = xr[index]
    return out.reshape((*indices.shape[:-1], *x.shape[batch_dims + k :]))


_SCATTER_REDUCE = {"add": "sum", "mul": "prod", "max": "amax", "min": "amin"}


@op("Scatter", since=9)
@op("ScatterElements", since=11)
def scatter_elements(x, indices, updates, axis=0, reduction="none"):
    axis = norm_axis(axis, x.dim())
    idx = _fix_neg(indices, x.shape[axis])
    dtype = x.dtype
    if dtype in WIDE_UNSIGNED:
        x, updates = x.to(torch.int64), updates.to(torch.int64)
    if reduction == "none":
        res = x.scatter(axis, idx, updates)
    else:
        res = x.scatter_reduce(axis, idx, updates, _SCATTER_REDUCE[reduction], include_self=True)
    return res.to(dtype)


@op("ScatterND", since=11)
def scatter_nd(x, indices, updates, reduction="none"):
    k = indices.shape[-1]
    out = x.clone()
    idx = indices.to(torch.int64).reshape(-1, k)
    idx = torch.where(idx < 0, idx + _dims(x.shape[:k], idx), idx)
    upd = updates.reshape(-1, *x.shape[k:])
    index = tuple(idx.unbind(-1))
    if reduction == "none":
        out[index] = upd
    elif reduction == "add":
        out.index_put_(index, upd, accumulate=True)
    elif k:
        # the indexed dims flattened into one: a single index_reduce_ applies every update,
        # duplicates included, on the device and without reading the indices on the host
        lin = idx[:, 0]
        for j in range(1, k):
            lin = lin * x.shape[j] + idx[:, j]
        how = {"mul": "prod", "max": "amax", "min": "amin"}[reduction]
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", "index_reduce", UserWarning)  # "in beta"
            out.view(-1, *x.shape[k:]).index_reduce_(0, lin, upd, how, include_self=True)
    else:
        combine = {"mul": torch.mul, "max": torch.maximum, "min": torch.minimum}[reduction]
        for i in range(idx.shape[0]):
            out = combine(out, upd[i])
    return out


@op("Compress", since=9)
def compress(x, condition, axis=None):
    cond = condition.to(torch.bool).reshape(-1)
    if axis is None:
        flat = x.reshape(-1)
        return flat[: cond.shape[0]][cond[: flat.shape[0]]]
    axis = norm_axis(axis, x.dim())
    n = min(cond.shape[0], x.shape[axis])
    sel = torch.nonzero(cond[:n]).reshape(-1)
    return x.index_select(axis, sel)


@op("NonZero", since=9)
def nonzero(x):
    if x.dim() == 0:
        return torch.zeros((0, int(bool(x.item()))), dtype=torch.int64, device=x.device)
    return torch.nonzero(x).transpose(0, 1).contiguous()


@op("OneHot", since=9, host_inputs=(1,))
def one_hot(indices, depth, values, axis=-1):
    d = int(as_ints(depth)[0]) if depth.numel() == 1 else int(depth.reshape(-1)[0].item())
    idx = indices.to(torch.int64)
    idx = torch.where(idx < 0, idx + d, idx)
    valid = (idx >= 0) & (idx < d)
    oh = torch.nn.functional.one_hot(torch.where(valid, idx, 0), d).to(torch.bool)
    oh = oh & valid.unsqueeze(-1)
    rank = indices.dim() + 1
    axis = norm_axis(axis, rank)
    oh = oh.movedim(-1, axis)
    off, on = values[0], values[1]
    return torch.where(oh, on, off)


@op("ReverseSequence", since=10, host_inputs=(1,))
def reverse_sequence(x, sequence_lens, batch_axis=1, time_axis=0):
    out = x.clone()
    for b, n in enumerate(sequence_lens.tolist()):
        src = x.select(batch_axis, b)
        t_axis = time_axis if time_axis < batch_axis else time_axis - 1
        rev = torch.flip(src.narrow(t_axis, 0, n), [t_axis])
        out.select(batch_axis, b).narrow(t_axis, 0, n).copy_(rev)
    return out


def _topk(x, k: int, axis: int, largest: int, sorted_: int):
    axis = norm_axis(axis, x.dim())
    xs = x.to(torch.int64) if x.dtype in WIDE_UNSIGNED else x
    # A stable sort keeps the lower index first among equal values, as ONNX requires.
    vals, idx = torch.sort(xs, dim=axis, descending=bool(largest), stable=True)
    vals = vals.narrow(axis, 0, k).to(x.dtype)
    return vals, idx.narrow(axis, 0, k)


@op("TopK", since=1)
def topk_v1(x, axis=-1, k=1):
    return _topk(x, k, axis, 1, 1)


@op("TopK", since=10, int_inputs=(1,))
def topk(x, k, axis=-1, largest=1, sorted=1):  # noqa: A002
    return _topk(x, as_ints(k)[0], axis, largest, sorted)


@op("Unique", since=11)
def unique(x, axis=None, sorted=1):  # noqa: A002
    if axis is None:
        flat = x.reshape(-1)
        y, inverse, counts = torch.unique(
            flat, sorted=True, return_inverse=True, return_counts=True
        )
        n = flat.shape[0]
    else:
        axis = norm_axis(axis, x.dim())
        y, inverse, counts = torch.unique(
            x, sorted=True, return_inverse=True, return_counts=True, dim=axis
        )
        n = x.shape[axis]
    positions = torch.arange(n, device=x.device)
    first = torch.full((counts.shape[0],), n, dtype=torch.int64, device=x.device)
    first = first.scatter_reduce(0, inverse.reshape(-1), positions, "amin")
    if not sorted:
        order = torch.argsort(first)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(order.shape[0], device=x.device)
        y = y[order] if axis is None else y.index_select(axis, order)
        inverse, counts, first = rank[inverse], counts[order], first[order]
    return y, first.to(torch.int64), inverse.reshape(-1).to(torch.int64), counts.to(torch.int64)
