"""Resizing and sampling: Resize, Upsample, GridSample, AffineGrid, CenterCropPad.

Resize is separable: each resized axis is interpolated on its own, with the neighbour
indices and weights the ONNX reference computes (edge-clamped taps, exclude_outside,
antialiased filters). The common exporter patterns go to ``F.interpolate``, which gives
the same values.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ..registry import op
from ._nn_common import register_versions

_TORCH_LINEAR = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _source_coords(mode, out_idx, scale, in_len, out_len, roi):
    """Input coordinate of each output index along one axis, and the extrapolation mask
    for tf_crop_and_resize. float32 like onnxruntime: float64 rounds some coordinates
    that land on integers to the other side of floor/round."""
    out_w = scale * in_len
    y = out_idx
    extra = None
    if mode == "align_corners":
        # the spec (and onnxruntime, and torch) divide by the integer resized length; the
        # ONNX reference uses the fractional scale * length and disagrees with all three
        x = torch.zeros_like(y) if out_len == 1 else y * (in_len - 1) / (out_len - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        r0, r1 = roi
        if out_w == 1:
            x = torch.full_like(y, (r1 - r0) * (in_len - 1) / 2)
        else:
            x = y * (r1 - r0) * (in_len - 1) / (out_w - 1)
        x = x + r0 * (in_len - 1)
        extra = (x < 0) | (x > in_len - 1)
    elif mode == "pytorch_half_pixel":
        # the spec and onnxruntime map a length-1 output to 0 (the reference to -0.5)
        x = torch.zeros_like(y) if out_len == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "tf_half_pixel_for_nn":  # opsets 11 to 13
        x = (y + 0.5) / scale
    elif mode == "half_pixel_symmetric":
        adjustment = out_len / out_w
        offset = in_len / 2 * (1 - adjustment)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r}")
    return x, extra


def _nearest_index(x, nearest_mode, scale):
    if nearest_mode == "round_prefer_floor":
        return torch.ceil(x - 0.5)
    if nearest_mode == "round_prefer_ceil":
        return torch.floor(x + 0.5)
    if nearest_mode == "floor":
        return torch.floor(x)
    if nearest_mode == "ceil":
        return torch.ceil(x)
    if nearest_mode == "simple":  # opset 10 / Upsample (onnxruntime's rule)
        return torch.ceil(x) if scale < 1 else torch.floor(x)
    raise ValueError(f"Resize: unknown nearest_mode {nearest_mode!r}")


def _cubic(d, a):
    d = d.abs()
    d2, d3 = d * d, d * d * d
    near = (a + 2) * d3 - (a + 3) * d2 + 1
    far = a * d3 - 5 * a * d2 + 8 * a * d - 4 * a
    return torch.where(d <= 1, near, torch.where(d < 2, far, torch.zeros_like(d)))


def _taps(mode, ratio, scale, antialias, a):
    """Weights (out, n) of the n neighbours, as the reference's coefficient functions."""
    r = ratio.unsqueeze(1)
    if mode == "linear":
        if not antialias:
            return torch.cat([1 - r, r], 1)
        s = min(scale, 1.0)
        start = math.floor(-1 / s) + 1
        k = torch.arange(start, start + 2 - 2 * start, dtype=r.dtype, device=r.device)
        c = (1 - ((k - r) * s).abs()).clamp(0, 1)
        return c / c.sum(1, keepdim=True)
    if not antialias:
        return torch.cat([_cubic(r + 1, a), _cubic(r, a), _cubic(1 - r, a), _cubic(2 - r, a)], 1)
    s = min(scale, 1.0)
    start = math.floor(-2 / s) + 1
    k = torch.arange(start, 2 - start, dtype=r.dtype, device=r.device)
    c = _cubic(s * (k - r), a)
    return c / c.sum(1, keepdim=True)


class _Method(NamedTuple):
    """How Resize computes each output: the attributes every axis shares."""

    mode: str
    ctm: str  # coordinate_transformation_mode
    nearest_mode: str
    a: float  # cubic_coeff_a
    exclude_outside: int
    antialias: int


def _resize_axis(data, axis, scale, out_len, method: _Method, roi, extrapolation_value):
    mode, ctm, nearest_mode, a, exclude_outside, antialias = method
    in_len = data.shape[axis]
    dev = data.device
    y = torch.arange(out_len, dtype=torch.float32, device=dev)
    x, extra = _source_coords(ctm, y, scale, in_len, out_len, roi)
    if mode == "nearest":
        idx = _nearest_index(x, nearest_mode, scale).long().clamp(0, in_len - 1)
        res = data.index_select(axis, idx)
    else:
        xi = torch.floor(x)
        ratio = torch.where(x == xi, torch.ones_like(x), x - xi)
        w = _taps(mode, ratio, scale, antialias, a)
        n = w.shape[1]
        pad = -(-n // 2)
        xp = x + pad
        p = torch.floor(xp)
        frac = xp - p
        if n % 2 == 0:
            off = torch.where(frac == 0, -(n // 2), -(n // 2) + 1)
        else:
            base = -((n - 1) // 2)
            off = torch.where(frac <= 0.5, base, base + 1)
        nb = (p.long() + off).unsqueeze(1) + torch.arange(n, device=dev).unsqueeze(0) - pad
        if exclude_outside:
            w = torch.where((nb < 0) | (nb >= in_len), torch.zeros_like(w), w)
            tot = w.sum(1, keepdim=True)
            w = w / torch.where(tot == 0, torch.ones_like(tot), tot)
        g = data.index_select(axis, nb.clamp(0, in_len - 1).reshape(-1))
        shape = list(data.shape)
        shape[axis : axis + 1] = [out_len, n]
        g = g.reshape(shape)
        wshape = [1] * len(shape)
        wshape[axis], wshape[axis + 1] = out_len, n
        res = (g * w.to(g.dtype).reshape(wshape)).sum(axis + 1)
    if extra is not None:  # no test of extra.any(): it would wait for the device
        mshape = [1] * data.dim()
        mshape[axis] = out_len
        res = torch.where(
            extra.reshape(mshape),
            torch.tensor(extrapolation_value, dtype=res.dtype, device=dev),
            res,
        )
    return res


def _as_list(t) -> list | None:
    if t is None:
        return None
    v = t.tolist() if isinstance(t, torch.Tensor) else list(t)
    return v if len(v) else None


def resize(
    x,
    roi=None,
    scales=None,
    sizes=None,
    *,
    antialias=0,
    axes=None,
    coordinate_transformation_mode="half_pixel",
    cubic_coeff_a=-0.75,
    exclude_outside=0,
    extrapolation_value=0.0,
    keep_aspect_ratio_policy="stretch",
    mode="nearest",
    nearest_mode="round_prefer_floor",
):
    """Resize with every attribute of opset 19 (older opsets map onto it)."""
    r = x.dim()
    axes = [a % r for a in axes] if axes else list(range(r))
    roi_l = _as_list(roi)
    scales_l = _as_list(scales)
    sizes_l = _as_list(sizes)
    if scales_l is not None and sizes_l is not None:
        raise ValueError("Resize: only one of scales and sizes may be given")
    if scales_l is None and sizes_l is None:
        raise ValueError("Resize: one of scales and sizes must be given")
    full_roi = None
    if roi_l is not None:
        full_roi = [0.0] * r + [1.0] * r
        k = len(axes)
        if len(roi_l) == 2 * k:
            for i, d in enumerate(axes):
                full_roi[d], full_roi[r + d] = roi_l[i], roi_l[k + i]
    scale = [1.0] * r
    out = list(x.shape)
    if sizes_l is not None:
        sizes_l = [int(v) for v in sizes_l]
        for i, d in enumerate(axes):
            out[d] = sizes_l[i]
            scale[d] = sizes_l[i] / x.shape[d]
        if keep_aspect_ratio_policy != "stretch":
            sel = [scale[d] for d in axes]
            if keep_aspect_ratio_policy == "not_larger":
                s = min(sel)
            elif keep_aspect_ratio_policy == "not_smaller":
                s = max(sel)
            else:
                raise ValueError(
                    f"Resize: unknown keep_aspect_ratio_policy {keep_aspect_ratio_policy!r}"
                )
            for d in axes:
                scale[d] = s
                out[d] = int(s * x.shape[d] + 0.5)
    else:
        for i, d in enumerate(axes):
            scale[d] = float(scales_l[i])
            out[d] = int(scale[d] * x.shape[d])
    moved = [
        d
        for d in range(r)
        if not (
            math.isclose(scale[d], 1.0)
            and out[d] == x.shape[d]
            and (
                full_roi is None
                or (math.isclose(full_roi[d], 0.0) and math.isclose(full_roi[r + d], 1.0))
            )
        )
    ]
    if not moved:
        return x
    method = _Method(
        mode,
        coordinate_transformation_mode,
        nearest_mode,
        cubic_coeff_a,
        exclude_outside,
        antialias,
    )
    fast = _fast_path(x, moved, scale, out, method, sizes_l is not None)
    if fast is not None:
        return fast
    data = x
    if not x.dtype.is_floating_point and mode != "nearest":
        data = x.to(torch.float32)
    elif x.dtype in (torch.float16, torch.bfloat16) and mode != "nearest":
        data = x.to(torch.float32)
    for d in moved:
        data = _resize_axis(
            data,
            d,
            scale[d],
            out[d],
            method,
            None if full_roi is None else (full_roi[d], full_roi[r + d]),
            extrapolation_value,
        )
    if data.dtype != x.dtype:
        if not x.dtype.is_floating_point:
            info = torch.iinfo(x.dtype)
            data = data.round().clamp(info.min, info.max)
        data = data.to(x.dtype)
    return data


def _fast_path(x, moved, scale, out, method: _Method, by_sizes):
    """F.interpolate for the patterns it computes exactly like ONNX (spatial axes only)."""
    mode, ctm, nearest_mode, a, exclude_outside, antialias = method
    n = x.dim() - 2
    if not (1 <= n <= 3) or not x.dtype.is_floating_point or antialias or exclude_outside:
        return None
    if any(d < 2 for d in moved) or ctm == "tf_crop_and_resize":
        return None
    spatial = out[2:]
    if by_sizes:
        kw = {"size": spatial}
    else:
        kw = {"scale_factor": scale[2:], "recompute_scale_factor": False}
    if mode == "nearest" and ctm == "asymmetric" and nearest_mode == "floor":
        return F.interpolate(x, mode="nearest", **kw)
    if (
        mode == "linear"
        and ctm in ("half_pixel", "align_corners")
        or (mode == "linear" and ctm == "pytorch_half_pixel" and all(o > 1 for o in spatial))
    ):
        return F.interpolate(x, mode=_TORCH_LINEAR[n], align_corners=ctm == "align_corners", **kw)
    if mode == "cubic" and n == 2 and a == -0.75 and ctm in ("half_pixel", "align_corners"):
        return F.interpolate(x, mode="bicubic", align_corners=ctm == "align_corners", **kw)
    return None


@op("Resize", since=10, host_inputs=(1, 2, 3))
@op("Upsample", since=9, host_inputs=(1,))
def resize_10(x, scales, mode="nearest"):
    """Resize-10 and Upsample: asymmetric coordinates, nearest pixel rounded down."""
    return resize(
        x,
        None,
        scales,
        None,
        mode=mode,
        coordinate_transformation_mode="asymmetric",
        nearest_mode="simple",
    )


@op("Upsample", since=7)
def upsample_7(x, mode="nearest", scales=()):
    return resize_10(x, list(scales), mode)


def _resize_11(x, roi=None, scales=None, sizes=None, **attrs):
    """Resize-11 on: an empty scales or sizes input counts as absent."""
    if scales is not None and scales.numel() == 0:
        scales = None
    if sizes is not None and sizes.numel() == 0:
        sizes = None
    return resize(x, roi, scales, sizes, **attrs)


# opset 18 added antialias, axes and keep_aspect_ratio_policy
_RESIZE_11_ATTRS = (
    "coordinate_transformation_mode",
    "cubic_coeff_a",
    "exclude_outside",
    "extrapolation_value",
    "mode",
    "nearest_mode",
)
register_versions(
    "Resize",
    _resize_11,
    {
        11: _RESIZE_11_ATTRS,
        18: (*_RESIZE_11_ATTRS, "antialias", "axes", "keep_aspect_ratio_policy"),
    },
    host_inputs=(1, 2, 3),
)


_GRID_MODES = {
    "linear": "bilinear",
    "bilinear": "bilinear",
    "nearest": "nearest",
    "cubic": "bicubic",
    "bicubic": "bicubic",
}


def _grid_sample(x, grid, align_corners, mode, padding_mode):
    tmode = _GRID_MODES.get(mode)
    if tmode is None:
        raise ValueError(f"GridSample: unknown mode {mode!r}")
    n = x.dim() - 2
    if n == 1:
        # a 1-D sample is a 2-D one on a single row
        g = torch.stack([grid[..., 0], torch.zeros_like(grid[..., 0])], -1).unsqueeze(1)
        return F.grid_sample(x.unsqueeze(2), g, tmode, padding_mode, bool(align_corners)).squeeze(2)
    if n == 3 and tmode == "bicubic":
        raise NotImplementedError("GridSample: cubic mode on 3-D volumes is not implemented")
    if n not in (2, 3):
        raise NotImplementedError(f"GridSample with {n} spatial dimensions")
    return F.grid_sample(x, grid.to(x.dtype), tmode, padding_mode, bool(align_corners))


@op("GridSample", since=16)
def grid_sample_16(x, grid, align_corners=0, mode="bilinear", padding_mode="zeros"):
    return _grid_sample(x, grid, align_corners, mode, padding_mode)


@op("GridSample", since=20)
def grid_sample_20(x, grid, align_corners=0, mode="linear", padding_mode="zeros"):
    return _grid_sample(x, grid, align_corners, mode, padding_mode)


@op("AffineGrid", since=20, host_inputs=(1,))
def affine_grid(theta, size, align_corners=0):
    return F.affine_grid(theta, [int(v) for v in size.tolist()], align_corners=bool(align_corners))


@op("CenterCropPad", since=18, host_inputs=(1,))
def center_crop_pad(x, shape, axes=None):
    r = x.dim()
    axes = [a % r for a in axes] if axes else list(range(r))
    target = dict(zip(axes, (int(v) for v in shape.tolist())))
    first = min(axes) if axes else r
    pads: list[int] = []
    for d in reversed(range(first, r)):
        t = target.get(d, x.shape[d])
        diff = t - x.shape[d]
        begin = diff // 2 if diff >= 0 else -((-diff) // 2)
        pads += [begin, diff - begin]
    return F.pad(x, pads) if any(pads) else x
