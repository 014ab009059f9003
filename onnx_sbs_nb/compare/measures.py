"""The measures beyond max abs/rel error: cosine similarity, SNR, L2 relative error,
quantiles of |diff| and the ulp distance, from what one comparison pass collects.

``diff.compare`` gathers four sums (of e², g², e·g and d², in double), the largest ulp
distance and two pairs of order statistics of |d| in the same pass as its other metrics
(the C module's, numpy's or torch's); the functions here turn them into the measures, so
that every path gives the same numbers from the same formulas.

Definitions, with ``e`` the torch value, ``g`` the ONNX value, ``d = e - g`` computed in
the comparison's working precision (float32 for float types of 32 bits or fewer, float64
for float64, as ``err_abs``), over the positions where both sides are finite:

- ``err_cos``: cosine similarity Σe·g / sqrt(Σe² Σg²), in [-1, 1]; 1.0 when both sides
  are all zero (identical), 0.0 when exactly one is (nothing in common).
- ``err_snr``: signal-to-noise ratio 10·log10(Σe² / Σd²) in dB; +inf when d is all zero
  (identical, all-zero values included), -inf when e is all zero and d is not.
- ``err_l2``: relative L2 error sqrt(Σd² / Σe²); 0.0 when d is all zero, +inf when e is
  all zero and d is not.
- ``err_p50`` / ``err_p99``: the median and 99th percentile of |d| over all positions
  (0 where both sides hold the same NaN/inf, +inf where they disagree), linearly
  interpolated between order statistics as ``numpy.quantile``'s default method does.
- ``err_ulp``: the largest distance in units in the last place, in the dtype the ONNX
  value has (the torch value rounded to it first when the dtypes differ): the distance of
  the two values' bits read as ordered integers, so -0.0 and 0.0 are 0 apart and the
  distance across zero counts every float in between.  None for integers, booleans and
  complex values.
- Where NaN/inf disagree (``err_nan > 0``) the value is infinitely wrong, as ``err_abs``
  says: ``err_cos`` is NaN (undefined), ``err_snr`` -inf, ``err_l2`` and ``err_ulp`` +inf.
- An empty value is identical to its twin: 1.0, +inf, 0.0, 0.0, 0.0, 0.0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import torch

QUANTILES = (0.5, 0.99)
MEASURE_FIELDS = ("err_cos", "err_snr", "err_l2", "err_p50", "err_p99", "err_ulp")
# the values of a pair with no difference
IDENTICAL = (1.0, math.inf, 0.0, 0.0, 0.0, 0.0)
# cosine, SNR and L2 where NaN/inf disagree
NONFINITE = (math.nan, -math.inf, math.inf)
# below this many elements numpy's partition is the cheaper selection
_SMALL = 4096
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_SINT = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def from_sums(ee: float, gg: float, eg: float, dd: float) -> tuple[float, float, float]:
    """(cosine, SNR in dB, relative L2) from Σe², Σg², Σe·g and Σd²."""
    if ee > 0 and gg > 0:
        cos = eg / math.sqrt(ee * gg) if ee * gg > 0 else eg / (math.sqrt(ee) * math.sqrt(gg))
        cos = min(1.0, max(-1.0, cos))
    else:
        cos = 1.0 if ee == gg == 0 else 0.0
    if dd == 0:
        return cos, math.inf, 0.0
    if ee == 0:
        return cos, -math.inf, math.inf
    ratio = ee / dd  # 0 when the difference overflowed (an infinite |d| of finite values)
    snr = 10.0 * math.log10(ratio) if ratio > 0 else -math.inf if ratio == 0 else math.nan
    return cos, snr, math.sqrt(dd / ee)


def sums_overflow(ee: float, gg: float, dd: float) -> bool:
    """Whether the double sums lost the values (squares beyond 1e308 or under 1e-308):
    only float64 values that large or small; they are then summed scaled."""
    # spelled out, not all() over a generator: asked once per differing pair
    if not (math.isfinite(ee) and math.isfinite(gg) and math.isfinite(dd)):
        return True
    return 0 < min(ee, gg) < 1e-290


def scaled_sums(e: np.ndarray, g: np.ndarray, d: np.ndarray) -> tuple[float, float, float, float]:
    """The four sums of finite float64 values scaled by their largest magnitude (the
    measures are ratios: the scale cancels)."""
    scale = float(max(np.abs(e).max(initial=0.0), np.abs(g).max(initial=0.0)))
    if not scale or not math.isfinite(scale):
        scale = 1.0
    es, gs, ds = e / scale, g / scale, d / scale
    return float(es @ es), float(gs @ gs), float(es @ gs), float(ds @ ds)


def numpy_sums(e: np.ndarray, g: np.ndarray, d: np.ndarray) -> tuple[float, float, float, float]:
    """Σe², Σg², Σe·g, Σd² of real arrays (NaN/inf already zeroed), in double."""
    e64 = e.astype(np.float64, copy=False).reshape(-1)
    g64 = g.astype(np.float64, copy=False).reshape(-1)
    d64 = d.astype(np.float64, copy=False).reshape(-1)
    sums = float(e64 @ e64), float(g64 @ g64), float(e64 @ g64), float(d64 @ d64)
    if sums_overflow(sums[0], sums[1], sums[3]):
        return scaled_sums(e64, g64, d64)
    return sums


def complex_sums(e: np.ndarray, g: np.ndarray, d: np.ndarray) -> tuple[float, float, float, float]:
    """The sums of complex values: |e|², |g|², Re(e·conj g), |d|² (the real inner product
    of the values as pairs of reals)."""
    e, g, d = e.reshape(-1), g.reshape(-1), d.reshape(-1)
    return (
        float(np.vdot(e, e).real),
        float(np.vdot(g, g).real),
        float(np.vdot(g, e).real),
        float(np.vdot(d, d).real),
    )


def ranks(n: int) -> tuple[tuple[int, ...], tuple[tuple[int, int, float], ...]]:
    """The order statistics the quantiles of ``n`` values need (ascending, distinct) and,
    per quantile, (index of the lower one, of the upper one, weight of the upper one)."""
    wanted: list[int] = []
    plan = []
    for q in QUANTILES:
        v = q * (n - 1)
        lo = math.floor(v)
        hi = min(lo + 1, n - 1)
        plan.append((lo, hi, v - lo))
        wanted += [lo, hi]
    order = tuple(sorted(set(wanted)))
    where = {r: k for k, r in enumerate(order)}
    return order, tuple((where[lo], where[hi], t) for lo, hi, t in plan)


def quantiles(stats: Iterable[float], plan: tuple[tuple[int, int, float], ...]) -> list[float]:
    """The quantiles from the order statistics ``ranks`` asked for, interpolated as
    ``numpy.quantile``'s linear method (an infinite bound gives +inf)."""
    values = list(stats)
    out = []
    for lo, hi, t in plan:
        a, b = values[lo], values[hi]
        if t == 0 or a == b:
            out.append(a)
        elif math.isinf(b):
            out.append(math.inf)
        else:
            diff = b - a
            out.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out


def numpy_ranks(blocks: Callable[[], Iterable[np.ndarray]], n: int, order: tuple[int, ...]):
    """The order statistics at ``order`` of non-negative floats (inf allowed, no NaN)
    given as blocks (``blocks()`` yields them, and is called again for a second pass):
    a partition of small values; for large ones a histogram of the top 16 bits of each
    value's bits (non-negative floats order as their bits do), then a partition of the
    few values in the bins that hold the ranks, as the C module does."""
    if n <= _SMALL:
        keys = np.concatenate([b.reshape(-1) for b in blocks()])
        part = np.partition(keys, order)
        return [float(part[r]) for r in order]
    hist = None
    shift = None
    for b in blocks():
        bits = b.reshape(-1).view(_UINT[b.dtype.itemsize])
        shift = bits.dtype.itemsize * 8 - 16
        h = np.bincount((bits >> shift).astype(np.intp), minlength=1 << 16)
        hist = h if hist is None else hist + h
    cum = np.cumsum(hist)
    bins = [int(np.searchsorted(cum, r, side="right")) for r in order]
    found = []
    gathered: dict[int, np.ndarray] = {}
    for r, b in zip(order, bins, strict=True):
        if b not in gathered:
            parts = []
            for block in blocks():
                flat = block.reshape(-1)
                bits = flat.view(_UINT[flat.dtype.itemsize])
                parts.append(flat[(bits >> shift) == b])
            gathered[b] = np.concatenate(parts)
        before = int(cum[b - 1]) if b else 0
        found.append(float(np.partition(gathered[b], r - before)[r - before]))
    return found


def abs_diff_keys(e: np.ndarray, g: np.ndarray) -> np.ndarray:
    """|e - g| in the arrays' (common float) precision: 0 where both hold the same NaN or
    infinity, +inf where they disagree."""
    with np.errstate(all="ignore"):
        d = np.abs(np.subtract(e, g))
        bad = ~np.isfinite(d)
        if bad.any():
            same = (e == g) | (np.isnan(e) & np.isnan(g))
            d[bad & same] = 0
            d[bad & ~same] = np.inf
    return d


def _ordered(bits: np.ndarray, width: int) -> np.ndarray:
    """Float bits (as signed ints) read as ordered integers (int64): -0.0 and 0.0 both 0."""
    b = bits.astype(np.int64)
    mag = b & ((1 << (width * 8 - 1)) - 1)
    return np.where(b < 0, -mag, mag)


def numpy_ulp(e: np.ndarray, g: np.ndarray, both: np.ndarray | None) -> float | None:
    """The largest ulp distance in ``g``'s float dtype over the positions ``both`` (all
    when None); None when ``g`` is not a real float array."""
    if g.dtype.kind != "f" or e.dtype.kind not in "fiub":
        return None
    if e.dtype != g.dtype:
        with np.errstate(all="ignore"):
            e = e.astype(g.dtype)
    width = g.dtype.itemsize
    sint = _SINT[width]
    ea = np.ascontiguousarray(e).view(sint).reshape(-1)
    ga = np.ascontiguousarray(g).view(sint).reshape(-1)
    if both is not None:
        both = both.reshape(-1)
        ea, ga = ea[both], ga[both]
    if not ea.size:
        return 0.0
    if width < 8:
        ke, kg = _ordered(ea, width), _ordered(ga, width)
        return float(np.abs(ke - kg).max())
    ke, kg = _ordered(ea, 8), _ordered(ga, 8)
    # the distance of two float64 keys may reach 2**64: in uint64, modularly exact
    hi, lo = np.maximum(ke, kg), np.minimum(ke, kg)
    return float((hi.view(np.uint64) - lo.view(np.uint64)).max())


_TORCH_SINT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def torch_ulp(e: torch.Tensor, g: torch.Tensor, both: torch.Tensor) -> float | None:
    """``numpy_ulp`` for torch tensors (bfloat16 and float8 included)."""
    if not g.is_floating_point() or e.is_complex():
        return None
    if e.dtype != g.dtype:
        e = e.to(g.dtype)
    width = g.element_size()
    ea = e.contiguous().view(_TORCH_SINT[width]).reshape(-1)[both.reshape(-1)]
    ga = g.contiguous().view(_TORCH_SINT[width]).reshape(-1)[both.reshape(-1)]
    if not ea.numel():
        return 0.0
    mask = (1 << (width * 8 - 1)) - 1

    def ordered(b: torch.Tensor) -> torch.Tensor:
        b = b.to(torch.int64)
        mag = b & mask
        return torch.where(b < 0, -mag, mag)

    ke, kg = ordered(ea), ordered(ga)
    if width < 8:
        return float((ke - kg).abs().max())
    hi, lo = torch.maximum(ke, kg), torch.minimum(ke, kg)
    dist = hi - lo  # wraps below zero beyond 2**63 - 1
    return float(torch.where(dist < 0, dist.double() + 2.0**64, dist.double()).max())


def torch_ranks(d: torch.Tensor, order: tuple[int, ...]) -> list[float]:
    """The order statistics at ``order`` of a tensor of non-negative floats."""
    s = d.reshape(-1).sort().values
    return s[list(order)].double().cpu().tolist()


__all__ = [
    "IDENTICAL",
    "MEASURE_FIELDS",
    "NONFINITE",
    "QUANTILES",
    "abs_diff_keys",
    "complex_sums",
    "from_sums",
    "numpy_ranks",
    "numpy_sums",
    "numpy_ulp",
    "quantiles",
    "ranks",
    "scaled_sums",
    "sums_overflow",
    "torch_ranks",
    "torch_ulp",
]
