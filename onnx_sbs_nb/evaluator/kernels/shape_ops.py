"""Shape manipulation (ai.onnx): Shape, Reshape, Squeeze, Concat, Split, Slice, Pad, ..."""

from __future__ import annotations

import math

import torch

from ..inline import HELPERS
from ..registry import op
from ._helpers import WIDE_UNSIGNED, as_ints, norm_axis


@op("Shape", since=1, placement="host")
def shape(x, start=0, end=None):
    dims = list(x.shape)
    # The slice clamps like Python's, which is the ONNX rule for out-of-range start/end.
    return torch.tensor(dims[start:end], dtype=torch.int64)


@op("Size", since=1, placement="host")
def size(x):
    return torch.tensor(x.numel(), dtype=torch.int64)


def _reshape(x, dims: list[int], allowzero: int) -> torch.Tensor:
    if not allowzero:
        dims = [x.shape[i] if d == 0 else d for i, d in enumerate(dims)]
    return x.reshape(dims)


@op("Reshape", since=1, placement="follow")
def reshape_attr(x, shape=None):
    return _reshape(x, list(shape or []), 0)


@op("Reshape", since=5, int_inputs=(1,), placement="follow")
def reshape(x, shape, allowzero=0):
    return _reshape(x, as_ints(shape), allowzero)


@op("Flatten", since=1, placement="follow")
def flatten(x, axis=1):
    axis = norm_axis(axis, x.dim())
    outer = math.prod(x.shape[:axis])
    inner = math.prod(x.shape[axis:])
    return x.reshape(outer, inner)


def _squeeze(x, axes: list[int]):
    if len(axes) == 1:
        a = axes[0]
        if x.shape[a] != 1:
            raise ValueError(f"Squeeze: dimension {a} of shape {tuple(x.shape)} is not 1")
        return x.squeeze(a)
    if not axes:
        return x.reshape([d for d in x.shape if d != 1])
    axes = sorted({norm_axis(a, x.dim()) for a in axes})
    for a in axes:
        if x.shape[a] != 1:
            raise ValueError(f"Squeeze: dimension {a} of shape {tuple(x.shape)} is not 1")
    return x.reshape([d for i, d in enumerate(x.shape) if i not in axes])


def _unsqueeze(x, axes: list[int]):
    if len(axes) == 1:
        return x.unsqueeze(axes[0])
    rank = x.dim() + len(axes)
    axes = sorted(norm_axis(a, rank) for a in axes)
    dims = list(x.shape)
    for a in axes:
        dims.insert(a, 1)
    return x.reshape(dims)


@op("Squeeze", since=1, placement="follow")
def squeeze_attr(x, axes=None):
    return _squeeze(x, list(axes or []))


@op("Squeeze", since=13, int_inputs=(1,), placement="follow")
def squeeze(x, axes=None):
    return _squeeze(x, as_ints(axes))


@op("Unsqueeze", since=1, placement="follow")
def unsqueeze_attr(x, axes=None):
    return _unsqueeze(x, list(axes or []))


@op("Unsqueeze", since=13, int_inputs=(1,), placement="follow")
def unsqueeze(x, axes):
    return _unsqueeze(x, as_ints(axes))


@op("Transpose", since=1, placement="follow")
def transpose(x, perm=None):
    if perm is None:
        perm = list(range(x.dim()))[::-1]
    return x.permute(perm)


@op("Concat", since=1, placement="follow")
def concat(*xs, axis=1):
    xs = [x for x in xs if x is not None]
    if xs[0].dtype in WIDE_UNSIGNED:
        return torch.cat([x.to(torch.int64) for x in xs], dim=axis).to(xs[0].dtype)
    return torch.cat(xs, dim=axis)


def _split(x, split: list[int] | None, axis: int, n_outputs: int, num_outputs=None):
    axis = norm_axis(axis, x.dim())
    dim = x.shape[axis]
    if not split:
        n = num_outputs or n_outputs
        if num_outputs:
            chunk = -(-dim // n)
            split = [min(chunk, dim - i * chunk) for i in range(n)]
            split = [s for s in split if s > 0] if sum(split) == dim else split
        else:
            if dim % n:
                raise ValueError(f"Split: dimension {dim} is not divisible into {n} outputs")
            split = [dim // n] * n
    return tuple(torch.split(x, split, dim=axis))


@op("Split", since=1, context=True, int_inputs=(1,))
def split_v1(x, split_in=None, axis=0, split=None, ctx=None):
    sizes = as_ints(split_in) if split_in is not None else list(split or [])
    return _split(x, sizes, axis, len(ctx.node.output))


@op("Split", since=2, context=True)
def split_attr(x, axis=0, split=None, ctx=None):
    return _split(x, list(split or []), axis, len(ctx.node.output))


@op("Split", since=13, context=True, int_inputs=(1,))
def split_input(x, split=None, axis=0, num_outputs=None, ctx=None):
    return _split(
        x,
        as_ints(split) if split is not None else None,
        axis,
        len(ctx.node.output),
        num_outputs,
    )


def slice_axis(x, axis: int, start: int, end: int, step: int) -> torch.Tensor:
    """x[start:end:step] along one axis, with ONNX (numpy) clamping, negative steps too."""
    dim = x.shape[axis]
    if step == 0:
        raise ValueError("Slice: step cannot be 0")
    start, end, step = slice(start, end, step).indices(dim)
    if step > 0:
        idx = [slice(None)] * axis + [slice(start, end, step)]
        return x[tuple(idx)]
    index = torch.arange(start, end, step, device=x.device)
    return x.index_select(axis, index)


def _slice(x, starts, ends, axes, steps):
    rank = x.dim()
    if len(starts) == 1 and (not steps or steps[0] == 1) and rank:
        # the common case (one axis, step 1) as one narrow: a third of the indexing cost
        a = axes[0] if axes else 0
        a = a + rank if a < 0 else a
        s, e, _ = slice(starts[0], ends[0]).indices(x.shape[a])
        return x.narrow(a, s, max(e - s, 0))
    if not axes:
        axes = list(range(len(starts)))
    if not steps:
        steps = [1] * len(starts)
    if all(st > 0 for st in steps):
        # one indexing call: Python slices clamp exactly like ONNX Slice
        index = [slice(None)] * rank
        for s, e, a, st in zip(starts, ends, axes, steps):
            a = a + rank if a < 0 else a
            # clamped here: torch warns about (and truncates) INT64_MAX-like bounds
            index[a] = slice(*slice(s, e, st).indices(x.shape[a]))
        return x[tuple(index)]
    for s, e, a, st in zip(starts, ends, axes, steps):
        x = slice_axis(x, norm_axis(a, rank), s, e, st)
    return x


@op("Slice", since=1, placement="follow")
def slice_attr(x, starts=None, ends=None, axes=None):
    return _slice(x, list(starts), list(ends), list(axes or []), None)


@op("Slice", since=10, int_inputs=(1, 2, 3, 4), placement="follow")
def slice_(x, starts, ends, axes=None, steps=None):
    return _slice(x, as_ints(starts), as_ints(ends), as_ints(axes), as_ints(steps))


@op("Expand", since=8, int_inputs=(1,), placement="follow")
def expand(x, shape):
    return HELPERS["_expand"](x, as_ints(shape))


@op("Tile", since=1, int_inputs=(1, 2), placement="follow")
def tile_v1(x, tiles, axis):
    # opset 1: repeat ``tiles`` times along one ``axis`` (both given as inputs)
    repeats = [1] * x.dim()
    repeats[norm_axis(as_ints(axis)[0], x.dim())] = as_ints(tiles)[0]
    return x.repeat(repeats)


@op("Tile", since=6, int_inputs=(1,), placement="follow")
def tile(x, repeats):
    return x.repeat(as_ints(repeats)) if x.dim() else x.clone()


@op("Range", since=11, host_inputs=(0, 1, 2), placement="follow")
def range_(start, limit, delta):
    dtype = start.dtype
    s, lim, d = start.item(), limit.item(), delta.item()
    n = max(math.ceil((lim - s) / d), 0)
    if dtype.is_floating_point:
        return start + torch.arange(n, dtype=dtype, device=start.device) * delta
    return torch.arange(s, s + n * d, d, dtype=dtype, device=start.device)[:n]


# Range-27: float16 and bfloat16 ranges computed in float (stash_type 1, the default)
# or double (11), then rounded once
_RANGE_STASH = {1: torch.float32, 11: torch.float64}


@op("Range", since=27, host_inputs=(0, 1, 2), placement="follow")
def range_27(start, limit, delta, stash_type=1):
    dtype = start.dtype
    if dtype not in (torch.float16, torch.bfloat16):
        return range_(start, limit, delta)
    stash = _RANGE_STASH.get(stash_type)
    if stash is None:
        raise ValueError(f"Range: stash_type must be 1 (float) or 11 (double), not {stash_type}")
    return range_(start.to(stash), limit.to(stash), delta.to(stash)).to(dtype)


@op("ConstantOfShape", since=9, context=True, int_inputs=(0,))
def constant_of_shape(shape, value=None, ctx=None):
    dims = as_ints(shape)
    dev = ctx.default_device()
    if value is None:
        return torch.zeros(dims, dtype=torch.float32, device=dev)
    return torch.full(dims, value.reshape(-1)[0].item(), dtype=value.dtype, device=dev)


@op("Constant", since=1)
def constant(
    value=None,
    sparse_value=None,
    value_float=None,
    value_floats=None,
    value_int=None,
    value_ints=None,
):
    # The compiler folds Constant nodes; this runs for custom overrides and tests only.
    for v in (value, sparse_value):
        if v is not None:
            return v
    for v, dtype in (
        (value_float, torch.float32),
        (value_floats, torch.float32),
        (value_int, torch.int64),
        (value_ints, torch.int64),
    ):
        if v is not None:
            return torch.tensor(v, dtype=dtype)
    raise ValueError("Constant node without a value attribute")


def _pad_index(n: int, before: int, after: int, mode: str, device) -> torch.Tensor:
    idx = torch.arange(-before, n + after, device=device)
    if mode == "edge":
        return idx.clamp(0, n - 1)
    if mode == "wrap":
        return idx.remainder(n)
    # reflect: mirror around the first and last elements without repeating them
    if n == 1:
        return torch.zeros_like(idx)
    period = 2 * (n - 1)
    m = idx.remainder(period)
    return torch.where(m >= n, period - m, m)


def _pad(x, pads: list[int], mode: str, value, axes: list[int] | None):
    rank = x.dim()
    axes = [norm_axis(a, rank) for a in axes] if axes else list(range(rank))
    k = len(axes)
    begins, ends = pads[:k], pads[k:]
    if mode == "constant":
        torch_pads = [0] * (2 * rank)
        for a, b, e in zip(axes, begins, ends):
            torch_pads[2 * (rank - 1 - a)] = b
            torch_pads[2 * (rank - 1 - a) + 1] = e
        if value is None:
            fill = 0
        else:
            fill = value.item() if isinstance(value, torch.Tensor) else value
        if x.dtype == torch.bool:
            fill = bool(fill)
        elif not x.is_floating_point():
            fill = int(fill)
        return torch.nn.functional.pad(x, torch_pads, mode="constant", value=fill)
    for a, b, e in zip(axes, begins, ends):
        if b == 0 and e == 0:
            continue
        x = x.index_select(a, _pad_index(x.shape[a], b, e, mode, x.device))
    return x


@op("Pad", since=1)
def pad_v1(x, mode="constant", paddings=None, value=0.0):
    return _pad(x, list(paddings), mode, value, None)


@op("Pad", since=2)
def pad_attr(x, mode="constant", pads=None, value=0.0):
    return _pad(x, list(pads), mode, value, None)


@op("Pad", since=11, int_inputs=(1, 3), host_inputs=(2,))
def pad(x, pads, constant_value=None, axes=None, mode="constant"):
    return _pad(x, as_ints(pads), mode, constant_value, as_ints(axes) if axes is not None else None)


@op("Trilu", since=14, host_inputs=(1,))
def trilu(x, k=None, upper=1):
    kk = int(k.item()) if k is not None else 0
    if x.dtype == torch.bool:
        return (torch.triu if upper else torch.tril)(x.to(torch.uint8), kk).to(torch.bool)
    return torch.triu(x, kk) if upper else torch.tril(x, kk)


@op("DepthToSpace", since=1)
def depth_to_space(x, blocksize, mode="DCR"):
    b, c, h, w = x.shape
    bs = blocksize
    if mode == "DCR":
        t = x.reshape(b, bs, bs, c // (bs * bs), h, w).permute(0, 3, 4, 1, 5, 2)
    else:
        t = x.reshape(b, c // (bs * bs), bs, bs, h, w).permute(0, 1, 4, 2, 5, 3)
    return t.reshape(b, c // (bs * bs), h * bs, w * bs)


@op("SpaceToDepth", since=1)
def space_to_depth(x, blocksize, mode="DCR"):
    b, c, h, w = x.shape
    bs = blocksize
    t = x.reshape(b, c, h // bs, bs, w // bs, bs)
    t = t.permute(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.permute(0, 1, 3, 5, 2, 4)
    return t.reshape(b, c * bs * bs, h // bs, w // bs)


@op("EyeLike", since=9)
def eye_like(x, dtype=None, k=0):
    from ...dtypes import onnx_to_torch_dtype

    out_dtype = onnx_to_torch_dtype(dtype) if dtype is not None else x.dtype
    n, m = x.shape
    ones = torch.ones((n, m), dtype=torch.uint8, device=x.device)
    return torch.triu(torch.tril(ones, k), k).to(out_dtype)
