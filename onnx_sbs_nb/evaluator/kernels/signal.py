"""Signal processing: DFT, STFT, window functions, MelWeightMatrix."""

from __future__ import annotations

import math

import torch

from ...dtypes import onnx_to_torch_dtype
from ..registry import op


def _to_complex(x: torch.Tensor) -> torch.Tensor:
    """[..., 1] real or [..., 2] (real, imag) -> complex tensor without the last axis.

    Computed in double precision like the reference (numpy's FFT): float32 FFTs leave
    rounding noise of the order of the tolerance on near-zero outputs.
    """
    x = x.to(torch.float64)
    if x.shape[-1] == 1:
        return x[..., 0]
    return torch.complex(x[..., 0], x[..., 1])


def _from_complex(c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.stack([c.real, c.imag], -1).to(dtype)


def _dft(x, dft_length, axis, inverse, onesided):
    axis = axis % x.dim()
    if axis == x.dim() - 1:
        raise ValueError("DFT: the axis cannot be the last one (it holds real/imaginary parts)")
    n = None if dft_length is None else int(dft_length)
    if n is None:
        n = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    c = _to_complex(x)
    if inverse:
        if onesided:
            return torch.fft.irfft(c, n=n, dim=axis).unsqueeze(-1).to(x.dtype)
        return _from_complex(torch.fft.ifft(c, n=n, dim=axis), x.dtype)
    r = torch.fft.fft(c, n=n, dim=axis)
    if onesided:
        r = r.narrow(axis, 0, r.shape[axis] // 2 + 1)
    return _from_complex(r, x.dtype)


def _scalar(t) -> int | None:
    if t is None:
        return None
    return int(t.reshape(-1)[0].item()) if isinstance(t, torch.Tensor) else int(t)


@op("DFT", since=17, host_inputs=(1,))
def dft_17(x, dft_length=None, axis=1, inverse=0, onesided=0):
    return _dft(x, _scalar(dft_length), axis, inverse, onesided)


@op("DFT", since=20, host_inputs=(1, 2))
def dft_20(x, dft_length=None, axis=None, inverse=0, onesided=0):
    a = _scalar(axis)
    return _dft(x, _scalar(dft_length), -2 if a is None else a, inverse, onesided)


@op("STFT", since=17, host_inputs=(1, 3))
def stft(signal, frame_step, window=None, frame_length=None, onesided=1):
    step = _scalar(frame_step)
    flen = _scalar(frame_length)
    if flen is None:
        flen = window.shape[0] if window is not None else signal.shape[-2]
    n_frames = 1 + (signal.shape[-2] - flen) // step
    frames = signal.unfold(-2, flen, step)  # (batch, frames, 1|2, flen)
    frames = frames.narrow(-3, 0, n_frames).movedim(-1, -2)  # (batch, frames, flen, 1|2)
    if window is not None:
        frames = frames * window.reshape(-1, 1).to(frames.dtype)
    c = _to_complex(frames)
    r = torch.fft.fft(c, n=flen, dim=-1)
    if onesided:
        r = r.narrow(-1, 0, flen // 2 + 1)
    return _from_complex(r, signal.dtype)


def _device(ctx) -> torch.device | None:
    # generated from host scalars: created where the evaluator computes
    return ctx.device if ctx is not None else None


def _window(size, periodic, output_datatype, fn, ctx):
    n = _scalar(size)
    denom = n if periodic else n - 1
    k = torch.arange(n, dtype=torch.float64, device=_device(ctx))
    return fn(2 * math.pi * k / denom).to(onnx_to_torch_dtype(output_datatype))


@op("HannWindow", since=17, context=True, host_inputs=(0,))
def hann_window(size, output_datatype=1, periodic=1, ctx=None):
    return _window(size, periodic, output_datatype, lambda a: 0.5 - 0.5 * torch.cos(a), ctx)


@op("HammingWindow", since=17, context=True, host_inputs=(0,))
def hamming_window(size, output_datatype=1, periodic=1, ctx=None):
    alpha = 25.0 / 46.0
    return _window(
        size, periodic, output_datatype, lambda a: alpha - (1 - alpha) * torch.cos(a), ctx
    )


@op("BlackmanWindow", since=17, context=True, host_inputs=(0,))
def blackman_window(size, output_datatype=1, periodic=1, ctx=None):
    return _window(
        size,
        periodic,
        output_datatype,
        lambda a: 0.42 - 0.5 * torch.cos(a) + 0.08 * torch.cos(2 * a),
        ctx,
    )


@op("MelWeightMatrix", since=17, context=True, host_inputs=(0, 1, 2, 3, 4))
def mel_weight_matrix(
    num_mel_bins,
    dft_length,
    sample_rate,
    lower_edge_hertz,
    upper_edge_hertz,
    output_datatype=1,
    ctx=None,
):
    nmel = _scalar(num_mel_bins)
    nfft = _scalar(dft_length)
    sr = _scalar(sample_rate)
    lo = float(lower_edge_hertz.reshape(-1)[0])
    hi = float(upper_edge_hertz.reshape(-1)[0])
    n_spec = nfft // 2 + 1
    lo_mel = 2595 * math.log1p(lo / 700) / math.log(10)
    hi_mel = 2595 * math.log1p(hi / 700) / math.log(10)
    step = (hi_mel - lo_mel) / (nmel + 2)
    bins = []
    for i in range(nmel + 2):
        hz = 700 * math.expm1((i * step + lo_mel) / 2595 * math.log(10))
        bins.append(int(((nfft + 1) * hz) // sr))
    out = torch.zeros((n_spec, nmel), dtype=torch.float64)
    for i in range(nmel):
        left, center, right = bins[i], bins[i + 1], bins[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    return out.to(device=_device(ctx), dtype=onnx_to_torch_dtype(output_datatype))
