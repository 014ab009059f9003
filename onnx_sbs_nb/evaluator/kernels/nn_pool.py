"""Pooling: MaxPool, AveragePool, LpPool, their Global variants, MaxUnpool, MaxRoiPool, RoiAlign."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..registry import op
from ._nn_common import spatial_attrs

_MAX = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _pool_geometry(in_shape, kernel, strides, dilations, pads, auto_pad, ceil_mode):
    """Output shape and (begin, end) pads of the padded input every window fits in.

    Follows the ONNX spec: with ceil_mode a last window is dropped when it would start
    in the end padding; ``end`` may exceed the declared pad (extra room for ceil_mode),
    the ``declared`` list keeps the pads that count as padding for count_include_pad.
    """
    n = len(in_shape)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [(in_shape[i] - 1) // strides[i] + 1 for i in range(n)]
        tot = [
            max(0, (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_shape[i])
            for i in range(n)
        ]
        if auto_pad == "SAME_UPPER":
            pads = [t // 2 for t in tot] + [t - t // 2 for t in tot]
        else:
            pads = [t - t // 2 for t in tot] + [t // 2 for t in tot]
    else:
        # VALID is NOTSET without pads (with ceil_mode too, as onnxruntime computes it)
        pads = list(pads) if pads and auto_pad != "VALID" else [0] * (2 * n)
        out = []
        for i in range(n):
            span = in_shape[i] + pads[i] + pads[i + n] - (kernel[i] - 1) * dilations[i] - 1
            if ceil_mode:
                o = -(-span // strides[i]) + 1
                if (o - 1) * strides[i] >= in_shape[i] + pads[i]:
                    o -= 1
            else:
                o = span // strides[i] + 1
            out.append(o)
    ends = []
    for i in range(n):
        need = (out[i] - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1
        ends.append(need - in_shape[i] - pads[i])
    return out, pads[:n], ends, pads[n:]


def _fpad(begins, ends):
    p: list[int] = []
    for i in reversed(range(len(begins))):
        p += [begins[i], ends[i]]
    return p


def _attrs(x, kernel_shape, strides, dilations):
    n = x.dim() - 2
    if n not in _MAX:
        raise NotImplementedError(f"pooling with {n} spatial dimensions")
    return spatial_attrs(x, kernel_shape, strides, dilations)


def _torch_padding(auto_pad, pads, kernel, dilations, n) -> list[int] | None:
    """The symmetric padding torch's pooling takes, when the ONNX pads are expressible."""
    if auto_pad not in ("NOTSET", "", None):
        return None if auto_pad != "VALID" else [0] * n
    p = list(pads) if pads else [0] * (2 * n)
    if p[:n] != p[n:]:
        return None
    # torch requires pad <= half the (dilated) kernel
    if any(2 * p[i] > (kernel[i] - 1) * dilations[i] + 1 for i in range(n)):
        return None
    return p[:n]


def _lowest(dtype):
    if dtype.is_floating_point:
        return float("-inf")
    return torch.iinfo(dtype).min


def _max_pool(
    x, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides, with_indices
):
    n, kernel, strides, dilations = _attrs(x, kernel_shape, strides, dilations)
    fast = _torch_padding(auto_pad, pads, kernel, dilations, n)
    if fast is not None and not with_indices:
        # torch's ceil_mode drops a last window starting in the padding, as ONNX does
        return _MAX[n](x, kernel, strides, fast, dilations, bool(ceil_mode))
    in_shape = list(x.shape[2:])
    out, begins, ends, _ = _pool_geometry(
        in_shape, kernel, strides, dilations, pads, auto_pad, ceil_mode
    )
    xp = x
    fp = _fpad(begins, ends)
    if any(fp):
        xp = F.pad(x, fp, value=_lowest(x.dtype))
    fn = _MAX[n]
    if not with_indices:
        return fn(xp, kernel, strides, 0, dilations)
    y, idx = fn(xp, kernel, strides, 0, dilations, return_indices=True)
    # torch indexes the padded plane; ONNX wants the flat index in the unpadded tensor
    pshape = list(xp.shape[2:])
    coords = []
    rem = idx
    for i in reversed(range(n)):
        coords.append(rem % pshape[i] - begins[i])
        rem = rem // pshape[i]
    coords = coords[::-1]
    flat = torch.zeros_like(idx)
    order = range(n) if storage_order == 0 else reversed(range(n))
    for i in order:
        flat = flat * in_shape[i] + coords[i]
    plane = math.prod(in_shape)
    nc = torch.arange(x.shape[0] * x.shape[1], device=x.device, dtype=torch.int64)
    flat = flat + (nc * plane).reshape(x.shape[0], x.shape[1], *([1] * n))
    return y, flat


@op("MaxPool", since=1)
def max_pool_1(x, auto_pad="NOTSET", kernel_shape=(), pads=None, strides=None):
    return _max_pool(x, auto_pad, 0, None, kernel_shape, pads, 0, strides, False)


@op("MaxPool", since=8, context=True)
def max_pool_8(
    x,
    auto_pad="NOTSET",
    ceil_mode=0,
    dilations=None,
    kernel_shape=(),
    pads=None,
    storage_order=0,
    strides=None,
    ctx=None,
):
    # Indices cost several extra ops: only computed when the node asks for them
    want = ctx is None or (len(ctx.node.output) > 1 and bool(ctx.node.output[1]))
    return _max_pool(
        x, auto_pad, ceil_mode, dilations, kernel_shape, pads, storage_order, strides, want
    )


def _window_sum(xp, kernel, strides, dilations):
    n = xp.dim() - 2
    if all(d == 1 for d in dilations):
        return _AVG[n](xp, kernel, strides, 0) * math.prod(kernel)
    c = xp.shape[1]
    w = torch.ones((c, 1, *kernel), dtype=xp.dtype, device=xp.device)
    return _CONV[n](xp, w, None, strides, 0, dilations, c)


def _avg_pool(x, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides):
    n, kernel, strides, dilations = _attrs(x, kernel_shape, strides, dilations)
    fast = _torch_padding(auto_pad, pads, kernel, dilations, n)
    if fast is not None and all(d == 1 for d in dilations):
        # torch's divisor counts declared pads (count_include_pad) but never the room
        # ceil_mode adds, as ONNX does
        return _AVG[n](x, kernel, strides, fast, bool(ceil_mode), bool(count_include_pad))
    in_shape = list(x.shape[2:])
    out, begins, ends, declared_ends = _pool_geometry(
        in_shape, kernel, strides, dilations, pads, auto_pad, ceil_mode
    )
    fp = _fpad(begins, ends)
    xp = F.pad(x, fp) if any(fp) else x
    total = _window_sum(xp, kernel, strides, dilations)
    ones = torch.ones((1, 1, *in_shape), dtype=x.dtype, device=x.device)
    if count_include_pad:
        # declared pads count, the room added for ceil_mode does not
        ones = F.pad(ones, _fpad(begins, declared_ends), value=1.0)
        extra = [e - d for e, d in zip(ends, declared_ends)]
        ones = F.pad(ones, _fpad([0] * n, extra))
    else:
        ones = F.pad(ones, fp)
    count = _window_sum(ones, kernel, strides, dilations)
    return total / count


@op("AveragePool", since=1)
def average_pool_1(x, auto_pad="NOTSET", kernel_shape=(), pads=None, strides=None):
    return _avg_pool(x, auto_pad, 0, 0, None, kernel_shape, pads, strides)


@op("AveragePool", since=7)
def average_pool_7(
    x,
    auto_pad="NOTSET",
    ceil_mode=0,
    count_include_pad=0,
    dilations=None,
    kernel_shape=(),
    pads=None,
    strides=None,
):
    return _avg_pool(
        x, auto_pad, ceil_mode, count_include_pad, dilations, kernel_shape, pads, strides
    )


def _lp_pool(x, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides):
    n, kernel, strides, dilations = _attrs(x, kernel_shape, strides, dilations)
    out, begins, ends, _ = _pool_geometry(
        list(x.shape[2:]), kernel, strides, dilations, pads, auto_pad, ceil_mode
    )
    fp = _fpad(begins, ends)
    xp = x.abs().pow(p)
    if any(fp):
        xp = F.pad(xp, fp)
    return _window_sum(xp, kernel, strides, dilations).pow(1.0 / p)


@op("LpPool", since=1)
def lp_pool_1(x, auto_pad="NOTSET", kernel_shape=(), p=2.0, pads=None, strides=None):
    return _lp_pool(x, auto_pad, 0, None, kernel_shape, p, pads, strides)


@op("LpPool", since=18)
def lp_pool_18(
    x, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape=(), p=2, pads=None, strides=None
):
    return _lp_pool(x, auto_pad, ceil_mode, dilations, kernel_shape, p, pads, strides)


def _spatial(x):
    return tuple(range(2, x.dim()))


@op("GlobalAveragePool", since=1)
def global_average_pool(x):
    return x.mean(dim=_spatial(x), keepdim=True)


@op("GlobalMaxPool", since=1)
def global_max_pool(x):
    return x.amax(dim=_spatial(x), keepdim=True)


@op("GlobalLpPool", since=1)
def global_lp_pool_1(x, p=2.0):
    return x.abs().pow(p).sum(dim=_spatial(x), keepdim=True).pow(1.0 / p)


@op("GlobalLpPool", since=2)
def global_lp_pool(x, p=2):
    return x.abs().pow(p).sum(dim=_spatial(x), keepdim=True).pow(1.0 / p)


@op("MaxUnpool", since=9, host_inputs=(2,))
def max_unpool(x, indices, output_shape=None, kernel_shape=(), pads=None, strides=None):
    n = x.dim() - 2
    kernel = list(kernel_shape)
    strides = list(strides) if strides else [1] * n
    pads = list(pads) if pads else [0] * (2 * n)
    inferred = [x.shape[0], x.shape[1]] + [
        (x.shape[i + 2] - 1) * strides[i] - pads[i] - pads[i + n] + kernel[i] for i in range(n)
    ]
    flat = torch.zeros(math.prod(inferred), dtype=x.dtype, device=x.device)
    flat[indices.reshape(-1).to(torch.int64)] = x.reshape(-1)
    y = flat.reshape(inferred)
    if output_shape is None:
        return y
    shape = [int(v) for v in output_shape.tolist()]
    # the values keep their place in the inferred layout; extra room goes at the end
    return F.pad(y, _fpad([0] * n, [shape[i + 2] - inferred[i + 2] for i in range(n)]))


def _round_half_away(v: float) -> int:
    # C's round(), as onnxruntime uses (Python's round() goes to even)
    return int(math.copysign(math.floor(abs(v) + 0.5), v))


@op("MaxRoiPool", since=1)
def max_roi_pool(x, rois, pooled_shape=(), spatial_scale=1.0):
    ph, pw = pooled_shape
    H, W = x.shape[2:]
    out = torch.zeros((rois.shape[0], x.shape[1], ph, pw), dtype=x.dtype, device=x.device)
    # scaled in float32 as onnxruntime does: 5 * 0.9f is 4.5 there, 4.4999998 in float64
    scaled = (rois[:, 1:5].to(torch.float32) * spatial_scale).tolist()
    for r, (roi, box) in enumerate(zip(rois.tolist(), scaled)):
        b = int(roi[0])
        x1, y1, x2, y2 = (_round_half_away(v) for v in box)
        rh, rw = max(y2 - y1 + 1, 1), max(x2 - x1 + 1, 1)
        for i in range(ph):
            hs = min(max(math.floor(i * rh / ph) + y1, 0), H)
            he = min(max(math.ceil((i + 1) * rh / ph) + y1, 0), H)
            for j in range(pw):
                ws = min(max(math.floor(j * rw / pw) + x1, 0), W)
                we = min(max(math.ceil((j + 1) * rw / pw) + x1, 0), W)
                if he > hs and we > ws:
                    out[r, :, i, j] = x[b, :, hs:he, ws:we].amax(dim=(1, 2))
    return out


def _roi_tap(img, flat_idx, weight, dtype):
    """Weighted values of one bilinear corner at every sample point: (C, *weight.shape)."""
    idx = flat_idx.expand(weight.shape).reshape(-1)
    return img[:, idx].reshape(img.shape[0], *weight.shape) * weight.to(dtype)


@op("RoiAlign", since=16, host_inputs=(1, 2))
def roi_align_16(
    x,
    rois,
    batch_indices,
    coordinate_transformation_mode="half_pixel",
    mode="avg",
    output_height=1,
    output_width=1,
    sampling_ratio=0,
    spatial_scale=1.0,
):
    half_pixel = coordinate_transformation_mode == "half_pixel"
    N, C, H, W = x.shape
    out = torch.empty(
        (rois.shape[0], C, output_height, output_width), dtype=x.dtype, device=x.device
    )
    offset = 0.5 if half_pixel else 0.0
    dev, dt = x.device, x.dtype
    for r, (roi, b) in enumerate(zip(rois.tolist(), batch_indices.tolist())):
        sw, sh, ew, eh = (v * spatial_scale - offset for v in roi[:4])
        rw, rh = ew - sw, eh - sh
        if not half_pixel:
            rw, rh = max(rw, 1.0), max(rh, 1.0)
        bh, bw = rh / output_height, rw / output_width
        gh = int(sampling_ratio) if sampling_ratio > 0 else math.ceil(rh / output_height)
        gw = int(sampling_ratio) if sampling_ratio > 0 else math.ceil(rw / output_width)
        count = max(gh * gw, 1)
        ys = (
            sh
            + torch.arange(output_height, device=dev, dtype=torch.float64).reshape(-1, 1) * bh
            + (torch.arange(gh, device=dev, dtype=torch.float64).reshape(1, -1) + 0.5) * bh / gh
        )
        xs = (
            sw
            + torch.arange(output_width, device=dev, dtype=torch.float64).reshape(-1, 1) * bw
            + (torch.arange(gw, device=dev, dtype=torch.float64).reshape(1, -1) + 0.5) * bw / gw
        )
        y = ys.reshape(-1, 1)  # (oh*gh, 1)
        xx = xs.reshape(1, -1)  # (1, ow*gw)
        outside = (y < -1.0) | (y > H) | (xx < -1.0) | (xx > W)
        y = y.clamp(min=0)
        xx = xx.clamp(min=0)
        y_low = y.floor().long()
        x_low = xx.floor().long()
        y_top = y_low >= H - 1
        x_top = x_low >= W - 1
        y_low = torch.where(y_top, H - 1, y_low)
        x_low = torch.where(x_top, W - 1, x_low)
        y = torch.where(y_top, y_low.to(y.dtype), y)
        xx = torch.where(x_top, x_low.to(xx.dtype), xx)
        y_high = torch.where(y_top, y_low, y_low + 1)
        x_high = torch.where(x_top, x_low, x_low + 1)
        ly, lx = y - y_low, xx - x_low
        hy, hx = 1 - ly, 1 - lx
        keep = (~outside).to(torch.float64)
        img = x[b].reshape(C, H * W)
        t = [
            _roi_tap(img, yi * W + xi, wgt * keep, dt)
            for yi, xi, wgt in (
                (y_low, x_low, hy * hx),
                (y_low, x_high, hy * lx),
                (y_high, x_low, ly * hx),
                (y_high, x_high, ly * lx),
            )
        ]
        shape = (C, output_height, gh, output_width, gw)
        if mode == "avg":
            v = (t[0] + t[1] + t[2] + t[3]).reshape(shape)
            out[r] = v.sum(dim=(2, 4)) / count
        else:
            # onnxruntime's max mode: max over samples of the max weighted corner
            v = torch.stack(t).amax(0).reshape(shape)
            out[r] = v.amax(dim=(2, 4))
    return out


@op("RoiAlign", since=10, host_inputs=(1, 2))
def roi_align_10(x, rois, batch_indices, **attrs):
    # opset 16 added coordinate_transformation_mode; before, pixels had no half-pixel shift
    return roi_align_16(
        x, rois, batch_indices, coordinate_transformation_mode="output_half_pixel", **attrs
    )
