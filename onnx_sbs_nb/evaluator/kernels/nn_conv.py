"""Convolutions: Conv, ConvTranspose, ConvInteger, DeformConv, Col2Im."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..registry import op
from ._nn_common import spatial_attrs

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_CONV_T = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def same_pads(in_shape, kernel, strides, dilations, auto_pad: str) -> list[int]:
    """ONNX pads [b1..bn, e1..en] for auto_pad SAME_UPPER / SAME_LOWER / VALID."""
    n = len(in_shape)
    if auto_pad == "VALID":
        return [0] * (2 * n)
    begins, ends = [], []
    for i in range(n):
        out = -(-in_shape[i] // strides[i])
        total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - in_shape[i])
        small, big = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else big)
        ends.append(big if auto_pad == "SAME_UPPER" else small)
    return begins + ends


def resolve_pads(auto_pad, pads, in_shape, kernel, strides, dilations) -> list[int]:
    n = len(in_shape)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER", "VALID"):
        return same_pads(in_shape, kernel, strides, dilations, auto_pad)
    return list(pads) if pads else [0] * (2 * n)


def torch_pad_arg(pads: list[int]) -> tuple[list[int], list[int] | None]:
    """Splits ONNX pads into a symmetric torch ``padding`` and an explicit F.pad list."""
    n = len(pads) // 2
    if pads[:n] == pads[n:]:
        return pads[:n], None
    fpad: list[int] = []
    for i in reversed(range(n)):
        fpad += [pads[i], pads[i + n]]
    return [0] * n, fpad


def conv_nd(x, w, b, pads, strides, dilations, group):
    n = x.dim() - 2
    if n not in _CONV:
        raise NotImplementedError(f"Conv with {n} spatial dimensions")
    padding, fpad = torch_pad_arg(pads)
    if fpad is not None:
        x = F.pad(x, fpad)
    return _CONV[n](x, w, b, stride=strides, padding=padding, dilation=dilations, groups=group)


@op("Conv", since=1)
def conv(
    x,
    w,
    b=None,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    pads=None,
    strides=None,
):
    _, kernel, strides, dilations = spatial_attrs(
        x, kernel_shape or w.shape[2:], strides, dilations
    )
    p = resolve_pads(auto_pad, pads, list(x.shape[2:]), kernel, strides, dilations)
    if b is not None and b.dim() != 1:
        # the M bias values in another shape ([1, M, 1, 1]): read as the reference
        # evaluator and ConvTranspose read them
        b = b.reshape(-1)
    return conv_nd(x, w, b, p, strides, dilations, group)


@op("ConvTranspose", since=1)
def conv_transpose(
    x,
    w,
    b=None,
    auto_pad="NOTSET",
    dilations=None,
    group=1,
    kernel_shape=None,
    output_padding=None,
    output_shape=None,
    pads=None,
    strides=None,
):
    n, kernel, strides, dilations = spatial_attrs(
        x, kernel_shape or w.shape[2:], strides, dilations
    )
    if n not in _CONV_T:
        raise NotImplementedError(f"ConvTranspose with {n} spatial dimensions")
    opad = list(output_padding) if output_padding else [0] * n
    in_shape = list(x.shape[2:])
    full = [strides[i] * (in_shape[i] - 1) + (kernel[i] - 1) * dilations[i] + 1 for i in range(n)]
    if output_shape or (not pads and auto_pad in ("SAME_UPPER", "SAME_LOWER")):
        # onnxruntime's rule: pads from the total padding the output shape implies
        # (never negative without an explicit output_shape), SAME_UPPER putting the odd
        # one at the end and every other mode at the beginning
        if output_shape:
            target = list(output_shape)[-n:]
            total = [full[i] + opad[i] - target[i] for i in range(n)]
        else:
            total = [max(0, full[i] + opad[i] - in_shape[i] * strides[i]) for i in range(n)]
        if auto_pad == "SAME_UPPER":
            begins = [t // 2 for t in total]
        else:
            begins = [t - t // 2 for t in total]
        ends = [total[i] - begins[i] for i in range(n)]
    else:
        p = list(pads) if pads else [0] * (2 * n)
        begins, ends = p[:n], p[n:]
    y = _CONV_T[n](
        x, w, None, stride=strides, padding=0, output_padding=0, groups=group, dilation=dilations
    )
    # F.pad with negative amounts crops: removes pads and appends output_padding in one call
    fpad: list[int] = []
    for i in reversed(range(n)):
        fpad += [-begins[i], opad[i] - ends[i]]
    if any(fpad):
        y = F.pad(y, fpad)
    if b is not None:
        y = y + b.reshape(1, -1, *([1] * n))
    return y


def weight_minus_zero_point(w: torch.Tensor, zero_point: torch.Tensor | None) -> torch.Tensor:
    """w - zero point in float64; a zero point of several values is per output channel."""
    wf = w.to(torch.float64)
    if zero_point is None:
        return wf
    wz = zero_point.to(torch.float64)
    if wz.numel() > 1:
        wz = wz.reshape(-1, *([1] * (w.dim() - 1)))
    return wf - wz


@op("ConvInteger", since=10)
def conv_integer(x, w, x_zero_point=None, w_zero_point=None, **conv_attrs):
    # float64 holds every int32 accumulator of realistic sizes exactly, and conv has no
    # integer kernels in torch
    xf = x.to(torch.float64)
    if x_zero_point is not None:
        xf = xf - x_zero_point.to(torch.float64)
    wf = weight_minus_zero_point(w, w_zero_point)
    return conv(xf, wf, None, **conv_attrs).round().to(torch.int32)


@op("DeformConv", since=19)
def deform_conv(
    x,
    w,
    offset,
    b=None,
    mask=None,
    dilations=None,
    group=1,
    kernel_shape=None,
    offset_group=1,
    pads=None,
    strides=None,
):
    if x.dim() != 4:
        raise NotImplementedError("DeformConv is implemented for 2-D inputs only")
    N, C, H, W = x.shape
    oc = w.shape[0]
    kh, kw = list(kernel_shape) if kernel_shape else list(w.shape[2:])
    sh, sw = list(strides) if strides else [1, 1]
    dh, dw = list(dilations) if dilations else [1, 1]
    p = list(pads) if pads else [0, 0, 0, 0]
    oh, ow = offset.shape[2:]
    G = offset_group
    dev, dt = x.device, x.dtype
    off = offset.reshape(N, G, kh, kw, 2, oh, ow)
    base_y = (torch.arange(oh, device=dev, dtype=dt) * sh - p[0]).reshape(1, 1, 1, 1, oh, 1)
    base_x = (torch.arange(ow, device=dev, dtype=dt) * sw - p[1]).reshape(1, 1, 1, 1, 1, ow)
    ky = (torch.arange(kh, device=dev, dtype=dt) * dh).reshape(1, 1, kh, 1, 1, 1)
    kx = (torch.arange(kw, device=dev, dtype=dt) * dw).reshape(1, 1, 1, kw, 1, 1)
    py = base_y + ky + off[:, :, :, :, 0]
    px = base_x + kx + off[:, :, :, :, 1]
    sampled = _bilinear_zero(
        x.reshape(N * G, C // G, H, W), py.reshape(N * G, -1), px.reshape(N * G, -1)
    )
    sampled = sampled.reshape(N, G, C // G, kh, kw, oh, ow)
    if mask is not None:
        sampled = sampled * mask.reshape(N, G, 1, kh, kw, oh, ow)
    cols = sampled.reshape(N, group, (C // group) * kh * kw, oh * ow)
    wg = w.reshape(group, oc // group, -1)
    y = torch.einsum("gok,ngkl->ngol", wg, cols).reshape(N, oc, oh, ow)
    if b is not None:
        y = y + b.reshape(1, -1, 1, 1)
    return y


def _bilinear_zero(img, py, px):
    """Samples img (B, C, H, W) at float positions (B, P) with zeros outside."""
    B, C, H, W = img.shape
    y0 = torch.floor(py)
    x0 = torch.floor(px)
    out = torch.zeros(B, C, py.shape[1], dtype=img.dtype, device=img.device)
    flat = img.reshape(B, C, H * W)
    for dy in (0, 1):
        for dx in (0, 1):
            yy = y0 + dy
            xx = x0 + dx
            wgt = (1 - (py - yy).abs()) * (1 - (px - xx).abs())
            valid = (yy >= 0) & (yy <= H - 1) & (xx >= 0) & (xx <= W - 1)
            idx = (yy.clamp(0, H - 1) * W + xx.clamp(0, W - 1)).long()
            vals = torch.gather(flat, 2, idx.unsqueeze(1).expand(B, C, -1))
            out = out + vals * (wgt * valid).unsqueeze(1)
    return out


@op("Col2Im", since=18, host_inputs=(1, 2))
def col2im(x, image_shape, block_shape, dilations=None, pads=None, strides=None):
    img = [int(v) for v in image_shape.tolist()]
    blk = [int(v) for v in block_shape.tolist()]
    n = len(img)
    dil = list(dilations) if dilations else [1] * n
    p = list(pads) if pads else [0] * (2 * n)
    st = list(strides) if strides else [1] * n
    N, CK, L = x.shape
    K = math.prod(blk)
    C = CK // K
    nblocks = [
        (img[i] + p[i] + p[i + n] - dil[i] * (blk[i] - 1) - 1) // st[i] + 1 for i in range(n)
    ]
    if math.prod(nblocks) != L:
        raise ValueError(f"Col2Im: input has {L} blocks, the attributes imply {nblocks}")
    dev = x.device
    # position of every (kernel offset, block) pair in the image, per dimension
    target = torch.zeros((K, L), dtype=torch.int64, device=dev)
    valid = torch.ones((K, L), dtype=torch.bool, device=dev)
    kgrid = torch.stack(
        torch.meshgrid(*[torch.arange(b, device=dev) for b in blk], indexing="ij"), 0
    ).reshape(n, K, 1)
    bgrid = torch.stack(
        torch.meshgrid(*[torch.arange(b, device=dev) for b in nblocks], indexing="ij"), 0
    ).reshape(n, 1, L)
    for i in range(n):
        pos = bgrid[i] * st[i] - p[i] + kgrid[i] * dil[i]
        valid &= (pos >= 0) & (pos < img[i])
        target = target * img[i] + pos.clamp(0, img[i] - 1)
    cols = x.reshape(N, C, K * L) * valid.reshape(1, 1, -1)
    out = torch.zeros((N, C, math.prod(img)), dtype=x.dtype, device=dev)
    out.index_add_(2, target.reshape(-1), cols)
    return out.reshape(N, C, *img)


@op("CausalConvWithState", since=27)
def causal_conv_with_state(x, w, b=None, past_state=None, activation="none"):
    if activation not in ("none", "silu", "swish"):
        raise ValueError(f"CausalConvWithState: unknown activation {activation!r}")
    k = w.shape[2]
    if past_state is None:
        past_state = torch.zeros((x.shape[0], x.shape[1], k - 1), dtype=x.dtype, device=x.device)
    padded = torch.cat([past_state, x], 2)
    y = F.conv1d(padded, w, b, groups=x.shape[1])
    if activation != "none":
        y = F.silu(y.float()).to(x.dtype)
    return y, padded[:, :, padded.shape[2] - (k - 1) :]
