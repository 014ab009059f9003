"""Comparing a torch value with an ONNX value: errors, NaN/Inf disagreement, verdict.

Both sides may be torch tensors (any device) or numpy arrays.  CPU values go through
numpy, which costs about a microsecond per reduction on the small tensors that dominate
a node-by-node run; other devices stay on their device (the ONNX value moves to the
torch value's device, never to a hard-coded one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..native import NATIVE
from . import measures as ms
from .tolerances import default_tolerance
from .value_facts import (
    _INT64_MAX,
    _NATIVE_DIRECT,
    _RELAYOUT,
    _RELAYOUT_NATIVE,
    _as_numpy,
    _as_torch,
    _c_order,
    _dtype_facts,
    _same_bits,
    _same_values,
    largest_magnitude,
    value_dtype_name,
)


@dataclass
class Diff:
    err_abs: float | None = None
    err_rel: float | None = None
    err_nan: float | None = None
    err_h01: float | None = None
    err_h001: float | None = None
    passed: bool | None = None
    shape_mismatch: bool = False
    dtype_mismatch: bool = False
    atol: float | None = None
    rtol: float | None = None
    note: str | None = None
    # the measures of measures.py, from the same pass
    err_cos: float | None = None
    err_snr: float | None = None
    err_l2: float | None = None
    err_p50: float | None = None
    err_p99: float | None = None
    err_ulp: float | None = None
    # what the user's compare function returned besides "passed"
    extra: dict[str, Any] | None = None
    # what decided ``passed`` when not atol/rtol: "the verdict snr>=30", "your compare
    # function f" (verdict_policy.Judge)
    decided: str | None = None
    # the user's compare function raised: the message (the verdict is then False)
    error: str | None = None


def compare(
    expected,
    got,
    atol: float | None = None,
    rtol: float | None = None,
    inherited: str | None = None,
    constant: bool = False,
    judge: Any = None,
) -> Diff:
    """Compares ``got`` (ONNX side) with ``expected`` (torch side).

    ``inherited``: a float dtype whose default tolerance applies when looser than the
    one of the values' own dtype (a float32 value computed from float16 values,
    ``align/precision.py``); the user's ``atol``/``rtol`` still win.
    ``constant``: the values are a weight, copied by the exporter, not computed: the
    default absolute tolerance is capped at ``rtol`` times the weight's largest
    magnitude, so that a weight of 0.02s in bfloat16 (atol 5e-2) is not passed half
    changed; a weight cast to a lower precision still rounds within ``rtol``.

    err_abs: max |got - expected|; infinite where one side is NaN/Inf and the other is
    not the same non-finite value (NaN matches NaN, inf matches inf);
    err_rel: max |got - expected| / (|expected| + atol): bounded near zero, unlike a
    plain relative error, and equal to it where |expected| >> atol;
    err_nan: positions where one side is NaN/Inf and the other is not (or differs);
    err_h01 / err_h001: elements whose difference exceeds 0.1 / 0.01.
    passed: |got - expected| <= atol + rtol * |expected| everywhere and err_nan == 0.
    Integers (and booleans) are compared as integers, exactly, whatever their size.
    err_cos, err_snr, err_l2, err_p50, err_p99, err_ulp: the measures of
    :mod:`onnx_sbs_nb.compare.measures` (their definitions are there), from the same pass.

    ``judge``: a :class:`onnx_sbs_nb.compare.verdict_policy.Judge` (the ``verdict=``,
    ``compare=`` and ``measures=`` options): it may set ``passed`` from the measures or
    from the user's compare function, whose other fields land in ``extra``; with
    ``judge.measures`` False the measures stay None (the C module's loop skips them).
    """
    measures = judge is None or judge.measures
    exp_dtype, d_atol, d_rtol, is_float = _dtype_facts(expected)
    got_dtype = value_dtype_name(got)
    if inherited is not None and is_float:
        i_atol, i_rtol = default_tolerance(inherited)
        d_atol, d_rtol = max(d_atol, i_atol), max(d_rtol, i_rtol)
    scaled = constant and is_float and atol is None
    atol = d_atol if atol is None or not is_float else atol
    rtol = d_rtol if rtol is None or not is_float else rtol
    result = Diff(atol=atol, rtol=rtol)
    if expected.shape != got.shape:  # a torch.Size is a tuple: equal shapes compare equal
        result.shape_mismatch = True
        result.passed = False
        result.note = f"shape {tuple(expected.shape)} vs {tuple(got.shape)}"
        return result
    if exp_dtype != got_dtype:
        result.dtype_mismatch = True
        result.note = f"dtype {exp_dtype} vs {got_dtype}"
    ea, ga = _as_numpy(expected), _as_numpy(got)
    if ea is not None and ga is not None:
        contiguous = ea.flags.c_contiguous and ga.flags.c_contiguous
        # a small value the C module compares: its one pass answers "equal" too
        direct = contiguous and not scaled and ea.size < _NATIVE_DIRECT and _native(ea, ga)
        if direct and ea.size and _native_atol(ea, atol):
            # what _compare_numpy would do for these, without asking again
            _fill_native(result, _native_compare(ea, ga, atol, rtol, measures), atol, ea, ga)
        elif (
            not direct
            and ea.dtype == ga.dtype
            and (
                _same_bits(ea, ga) if contiguous else _RELAYOUT <= ea.size and _same_values(ea, ga)
            )
        ):
            _empty(result, _ulp_zero(ga))
        else:
            # one side in order, the other not: put both in order once (see _RELAYOUT;
            # with the C module, at any size: its one pass needs both in order)
            if (
                _RELAYOUT_NATIVE if NATIVE is not None else _RELAYOUT
            ) <= ea.size <= _BLOCK and ea.flags.c_contiguous != ga.flags.c_contiguous:
                ea, ga = _c_order(ea), _c_order(ga)
            if scaled and ea.size:
                atol = result.atol = _capped_atol(atol, rtol, largest_magnitude(ea))
            _compare_numpy(ea, ga, atol, rtol, result, measures)
    else:
        dev = expected.device if isinstance(expected, torch.Tensor) else torch.device("cpu")
        et = _as_torch(expected, dev)
        if scaled and et.numel():
            atol = result.atol = _capped_atol(atol, rtol, largest_magnitude(et))
        _compare_torch(et, _as_torch(got, dev), atol, rtol, result)
    if result.dtype_mismatch:
        result.passed = False
    if not measures:
        _drop_measures(result)
    if judge is not None:
        judge.apply(result, expected, got)
    return result


def _capped_atol(atol: float, rtol: float, magnitude: float) -> float:
    """A weight's absolute tolerance: at most rtol times its largest magnitude (a NaN
    magnitude keeps atol)."""
    capped = rtol * magnitude
    return capped if capped < atol else atol


def _empty(r: Diff, ulp: float | None) -> None:
    r.err_abs = r.err_rel = r.err_nan = r.err_h01 = r.err_h001 = 0.0
    r.passed = True
    r.err_cos, r.err_snr, r.err_l2, r.err_p50, r.err_p99, _ = ms.IDENTICAL
    r.err_ulp = ulp


def _drop_measures(r: Diff) -> None:
    r.err_cos = r.err_snr = r.err_l2 = r.err_p50 = r.err_p99 = r.err_ulp = None


def _ulp_zero(g) -> float | None:
    """The ulp distance of equal values: 0 for a real float dtype, None otherwise."""
    return 0.0 if g.dtype.kind == "f" else None


def _set_measures(
    r: Diff, sums: tuple[float, float, float, float], stats: list[float], plan, ulp
) -> None:
    r.err_cos, r.err_snr, r.err_l2 = ms.from_sums(*sums)
    r.err_p50, r.err_p99 = ms.quantiles(stats, plan)
    r.err_ulp = ulp


def _set_nonfinite(r: Diff, stats: list[float], plan, ulp: float | None) -> None:
    r.err_cos, r.err_snr, r.err_l2 = ms.NONFINITE
    r.err_p50, r.err_p99 = ms.quantiles(stats, plan)
    r.err_ulp = None if ulp is None else math.inf


# n -> (ranks, plan) of measures.ranks: a run compares the same few sizes
_RANKS: dict[int, tuple] = {}


def _ranks(n: int) -> tuple:
    found = _RANKS.get(n)
    if found is None:
        found = ms.ranks(n)
        if len(_RANKS) < 4096:
            _RANKS[n] = found
    return found


def _fill_integers(r: Diff, err_abs: float, err_rel: float, differing: int) -> None:
    """Integers are equal or not: any difference fails, and it is at least 1."""
    r.err_abs, r.err_rel, r.err_nan = err_abs, err_rel, 0.0
    r.err_h01 = r.err_h001 = float(differing)
    r.passed = differing == 0


def _integer_difference(e: np.ndarray, g: np.ndarray) -> np.ndarray:
    """|e - g| exactly: uint64 (Python ints when a uint64 value does not fit in int64).

    float64 holds integers exactly only up to 2**53: 2**60 and 2**60 + 1 would compare
    equal there.
    """
    for a in (e, g):
        if a.dtype == np.uint64 and a.max() > _INT64_MAX:
            return np.abs(e.astype(object) - g.astype(object))
    ei, gi = e.astype(np.int64, copy=False), g.astype(np.int64, copy=False)
    hi, lo = np.maximum(ei, gi), np.minimum(ei, gi)
    # modular uint64 arithmetic is exact here: 0 <= hi - lo < 2**64
    return hi.view(np.uint64) - lo.view(np.uint64)


def _compare_numpy_integers(e: np.ndarray, g: np.ndarray, r: Diff) -> None:
    d = _integer_difference(e, g)
    differing = int(np.count_nonzero(d))
    if not differing:
        _fill_integers(r, 0.0, 0.0, 0)
        _empty_measures(r, None)
        return
    df = d.astype(np.float64)
    ef = e.astype(np.float64)
    rel = df / (np.abs(ef) + 1e-12)
    _fill_integers(r, float(df.max()), float(rel.max()), differing)
    order, plan = _ranks(df.size)
    stats = ms.numpy_ranks(lambda: (df,), df.size, order)
    _set_measures(r, ms.numpy_sums(ef, g.astype(np.float64), df), stats, plan, None)


def _empty_measures(r: Diff, ulp: float | None) -> None:
    r.err_cos, r.err_snr, r.err_l2, r.err_p50, r.err_p99, _ = ms.IDENTICAL
    r.err_ulp = ulp


# Floats are compared in blocks of this many elements: the temporaries of comparing a
# large weight (an embedding, a vocabulary head) stay small beside the weight itself.
_BLOCK = 1 << 22


def _compare_numpy(
    e: np.ndarray, g: np.ndarray, atol: float, rtol: float, r: Diff, measures: bool = True
) -> None:
    if e.size == 0:
        _empty(r, _ulp_zero(g) if e.dtype.kind != "c" else None)
        return
    if e.dtype.kind in "biu" and g.dtype.kind in "biu":
        _compare_numpy_integers(e, g, r)
        return
    if _native(e, g) and _native_atol(e, atol):
        _fill_native(r, _native_compare(e, g, atol, rtol, measures), atol, e, g)
        return
    if e.size > _BLOCK and e.ndim > 0:
        _compare_numpy_blocks(e, g, atol, rtol, r)
        return
    _compare_numpy_floats(e, g, atol, rtol, r, measures)


def _native(e: np.ndarray, g: np.ndarray) -> bool:
    """Whether the C library compares these two arrays (one float dtype, both in order)."""
    return (
        NATIVE is not None
        and e.dtype == g.dtype
        and NATIVE.compares(e.dtype)
        and e.flags.c_contiguous
        and g.flags.c_contiguous
    )


# (dtype, atol) -> whether the C library may take it: a run asks for the same few
_ATOL_OK: dict[tuple[Any, float], bool] = {}


def _native_atol(e: np.ndarray, atol: float) -> bool:
    """Whether the C library may take this atol: zero, or nonzero in the values' dtype
    (its relative error divides by |e| + atol: never a zero denominator)."""
    key = (e.dtype, atol)
    ok = _ATOL_OK.get(key)
    if ok is None:
        ok = atol == 0 or bool(e.dtype.type(atol) > 0)
        if len(_ATOL_OK) < 4096:
            _ATOL_OK[key] = ok
    return ok


def _native_compare(
    e: np.ndarray, g: np.ndarray, atol: float, rtol: float, measures: bool
) -> tuple[float, ...]:
    """The C library's one pass; with the measures, the order statistics of the quantiles
    follow its eleven values, selected from the keys that same pass kept."""
    if not measures:
        return NATIVE.compare(e, g, atol, rtol, False)
    found = _RANKS.get(e.size)
    return NATIVE.compare(e, g, atol, rtol, True, (found or _ranks(e.size))[0])


def _fill_native(
    r: Diff, found: tuple[float, ...], atol: float, e: np.ndarray, g: np.ndarray
) -> None:
    """The metrics from the C library's one pass, as _compare_numpy_floats sets them, and
    the measures (the quantiles from the library's selection, only where values differ;
    none when the library was asked for none: six values found, not eleven or more).
    ``found`` may end with the order statistics of ``_ranks(e.size)`` (compare(...,
    ranks)); without them they are asked for in a second call."""
    err_abs, err_rel, nan, h01, h001, fails = found[:6]
    _fill_native_metrics(r, err_abs, err_rel, nan, h01, h001, fails, atol)
    if len(found) == 6:
        return
    if not nan and err_abs == 0.0:
        _empty_measures(r, 0.0)
        return
    ee, gg, eg, dd, ulp = found[6:11]
    order, plan = _RANKS.get(e.size) or _ranks(e.size)
    stats = found[11:] if len(found) > 11 else NATIVE.ranks(e, g, order)
    if nan:
        _set_nonfinite(r, stats, plan, ulp)
        return
    sums = (ee, gg, eg, dd)
    if ms.sums_overflow(ee, gg, dd):
        sums = _finite_sums(e, g)
    _set_measures(r, sums, stats, plan, ulp)


def _fill_native_metrics(r: Diff, err_abs, err_rel, nan, h01, h001, fails, atol) -> None:
    r.err_nan = nan
    if nan:
        r.err_abs = r.err_rel = math.inf
        r.err_h01, r.err_h001 = h01 + nan, h001 + nan
        r.passed = False
        return
    r.err_abs = err_abs
    if err_abs == 0.0:
        r.err_rel = r.err_h01 = r.err_h001 = 0.0
        r.passed = True
        return
    r.err_rel = err_rel
    r.err_h01 = h01 if err_abs > 0.1 else 0.0
    r.err_h001 = h001 if err_abs > 0.01 else 0.0
    r.passed = err_abs <= atol or fails == 0


def _finite_sums(e: np.ndarray, g: np.ndarray) -> tuple[float, float, float, float]:
    """The sums over the positions where both sides are finite, scaled (values whose
    squares a double cannot hold)."""
    with np.errstate(all="ignore"):
        both = np.isfinite(e) & np.isfinite(g)
        ef, gf = np.where(both, e, 0).reshape(-1), np.where(both, g, 0).reshape(-1)
        # |d| in the values' own precision, as every other path takes it
        d = np.abs(np.subtract(ef, gf)).astype(np.float64)
        return ms.scaled_sums(ef.astype(np.float64), gf.astype(np.float64), d)


def _compare_numpy_blocks(e: np.ndarray, g: np.ndarray, atol: float, rtol: float, r: Diff) -> None:
    """The comparison of slices along the first axis (views whatever the strides), merged;
    the quantiles from a selection over all the slices (measures.numpy_ranks)."""
    rows = max(1, _BLOCK // max(1, e.size // e.shape[0]))
    r.err_abs = r.err_rel = r.err_nan = r.err_h01 = r.err_h001 = 0.0
    r.passed = True
    sums = [0.0, 0.0, 0.0, 0.0]
    ulp: float | None = 0.0
    for k in range(0, e.shape[0], rows):
        part = Diff()
        found = _compare_numpy_floats(e[k : k + rows], g[k : k + rows], atol, rtol, part, False)
        r.err_abs = max(r.err_abs, part.err_abs)
        r.err_rel = max(r.err_rel, part.err_rel)
        r.err_nan += part.err_nan
        r.err_h01 += part.err_h01
        r.err_h001 += part.err_h001
        r.passed = r.passed and part.passed
        if found is not None:
            sums = [a + b for a, b in zip(sums, found[0], strict=True)]
            ulp = None if found[1] is None or ulp is None else max(ulp, found[1])
        elif part.err_ulp is None:
            ulp = None
    if r.err_abs == 0.0:
        _empty_measures(r, ulp)
        return
    work = _work_dtype(e, g)

    def blocks():
        for k in range(0, e.shape[0], rows):
            yield ms.abs_diff_keys(e[k : k + rows].astype(work), g[k : k + rows].astype(work))

    order, plan = _ranks(e.size)
    stats = ms.numpy_ranks(blocks, e.size, order)
    if r.err_nan:
        _set_nonfinite(r, stats, plan, ulp)
        return
    if ms.sums_overflow(sums[0], sums[1], sums[3]):
        sums = list(_finite_sums(e, g))
    _set_measures(r, tuple(sums), stats, plan, ulp)


def _work_dtype(e: np.ndarray, g: np.ndarray):
    """The precision floats are compared in: float64 when a side has it, else float32."""
    if e.dtype.kind == "c" or g.dtype.kind == "c":
        return np.complex128
    return np.float64 if np.float64 in (e.dtype, g.dtype) else np.float32


def _compare_numpy_floats(
    e: np.ndarray,
    g: np.ndarray,
    atol: float,
    rtol: float,
    r: Diff,
    whole: bool = True,
    measures: bool = True,
) -> tuple[tuple[float, float, float, float], float | None] | None:
    """Sets the metrics and, when ``whole``, the measures; a part of a larger value
    (``whole`` False) returns its sums and ulp distance instead (None when it is equal
    or NaN/inf disagree), and its caller selects the quantiles over all parts."""
    if e.ndim == 0:  # numpy gives scalars for 0-d results: work on arrays of one
        e, g = e.reshape(1), np.asarray(g).reshape(1)
    # Few passes over the data: most pairs of a faithful export are equal or tiny apart.
    # Each step costs a few microseconds on the small tensors of a node-by-node run, so
    # the reductions are the ufuncs' own and scalars are Python floats.
    work = _work_dtype(e, g)
    ef, gf = e.astype(work, copy=False), g.astype(work, copy=False)
    real_ulp = g.dtype.kind == "f" and e.dtype.kind != "c"
    with np.errstate(all="ignore"):
        # in place: a large temporary is a fresh mmap (page faults) each time
        d = np.subtract(ef, gf)
        d = np.abs(d, out=d) if d.dtype.kind == "f" else np.abs(d)
        m = float(_MAX(d, axis=None))
        nan = 0
        both = None
        if not math.isfinite(m):
            fe, fg = np.isfinite(ef), np.isfinite(gf)
            both = fe & fg
            # non-finite on both sides agree only when they are the same value
            same_special = ~fe & ~fg & ((ef == gf) | (np.isnan(ef) & np.isnan(gf)))
            disagree = ~both & ~same_special
            nan = int(np.count_nonzero(disagree))
            d = np.where(both, d, 0.0)
            ef = np.where(both, ef, 0.0)
            gf = np.where(both, gf, 0.0)
            m = float(_MAX(d, axis=None))
        r.err_nan = float(nan)
        if nan:
            # NaN or an infinity against a number (or the other infinity): infinitely wrong
            r.err_abs = r.err_rel = math.inf
            r.err_h01 = float(np.count_nonzero(d > 0.1) + nan)
            r.err_h001 = float(np.count_nonzero(d > 0.01) + nan)
            r.passed = False
            r.err_ulp = math.inf if real_ulp else None
            if whole and measures:
                d[disagree] = np.inf
                order, plan = _ranks(d.size)
                _set_nonfinite(r, ms.numpy_ranks(lambda: (d,), d.size, order), plan, r.err_ulp)
            return None
        err_abs = m
        r.err_abs = err_abs
        if err_abs == 0.0:
            r.err_rel = r.err_h01 = r.err_h001 = 0.0
            r.passed = True
            _empty_measures(r, 0.0 if real_ulp else None)
            return None
        if whole and measures:
            order, plan = _ranks(d.size)
            stats = ms.numpy_ranks(lambda: (d,), d.size, order)
        if not measures:
            sums, ulp = (0.0, 0.0, 0.0, 0.0), None
        elif work is np.complex128:
            sums = ms.complex_sums(ef, gf, d)
            ulp = None
        else:
            sums = ms.numpy_sums(ef, gf, d)
            ulp = ms.numpy_ulp(e, g, both) if real_ulp else None
        magnitude = np.abs(ef)
        denom = magnitude if err_abs <= atol else magnitude.copy()
        denom += atol if atol > 0 else 1e-12
        r.err_rel = float(_MAX(np.divide(d, denom, out=denom), axis=None))
        r.err_h01 = float(np.count_nonzero(d > 0.1)) if err_abs > 0.1 else 0.0
        r.err_h001 = float(np.count_nonzero(d > 0.01)) if err_abs > 0.01 else 0.0
        if err_abs <= atol:
            r.passed = True
        else:
            magnitude *= rtol
            magnitude += atol
            r.passed = bool((d <= magnitude).all())
    if not whole:
        return sums, ulp
    if measures:
        _set_measures(r, sums, stats, plan, ulp)
    return None


_MAX = np.maximum.reduce


def _torch_measures(
    r: Diff, ef: torch.Tensor, gf: torch.Tensor, d: torch.Tensor, keys: torch.Tensor, ulp
) -> None:
    """The measures from the torch path's masked values (ef, gf: finite or 0; d: |e - g|
    with 0 where not both finite; keys: |e - g| with inf where NaN/inf disagree)."""
    order, plan = _ranks(keys.numel())
    stats = ms.torch_ranks(keys, order)
    if r.err_nan:
        _set_nonfinite(r, stats, plan, ulp)
        return
    if r.err_abs == 0.0:
        _empty_measures(r, ulp)
        return
    ed, gd = (
        ef.to(torch.complex128 if ef.is_complex() else torch.float64),
        gf.to(torch.complex128 if gf.is_complex() else torch.float64),
    )
    dd = d.double()
    sums = torch.stack(
        [
            (ed.abs() ** 2).sum(),
            (gd.abs() ** 2).sum(),
            (ed * gd.conj()).real.sum() if ed.is_complex() else (ed * gd).sum(),
            (dd * dd).sum(),
        ]
    ).cpu()
    ee, gg, eg, dsum = sums.tolist()
    if ms.sums_overflow(ee, gg, dsum) and not ed.is_complex():
        ee, gg, eg, dsum = ms.scaled_sums(ed.cpu().numpy(), gd.cpu().numpy(), dd.cpu().numpy())
    _set_measures(r, (ee, gg, eg, dsum), stats, plan, ulp)


def _compare_torch_integers(e: torch.Tensor, g: torch.Tensor, r: Diff) -> None:
    ei, gi = e.to(torch.int64), g.to(torch.int64)
    d = torch.maximum(ei, gi) - torch.minimum(ei, gi)  # wraps to < 0 beyond 2**63 - 1
    df = d.double()
    df = torch.where(d < 0, df + 2.0**64, df)
    rel = df / (ei.double().abs() + 1e-12)
    stats = torch.stack([df.max(), rel.max(), (ei != gi).sum().double()]).cpu()
    err_abs, err_rel, differing = stats.tolist()
    _fill_integers(r, err_abs, err_rel, int(differing))
    _torch_measures(r, ei.double(), gi.double(), df, df, None)


def _compare_torch(e: torch.Tensor, g: torch.Tensor, atol: float, rtol: float, r: Diff) -> None:
    if e.numel() == 0:
        _empty(r, 0.0 if g.is_floating_point() and not e.is_complex() else None)
        return
    if e.is_complex() or g.is_complex():
        ef, gf = e.to(torch.complex128), g.to(torch.complex128)
    elif e.is_floating_point() or g.is_floating_point():
        work = torch.float64 if torch.float64 in (e.dtype, g.dtype) else torch.float32
        ef, gf = e.to(work), g.to(work)
    else:
        _compare_torch_integers(e, g, r)
        return
    d = (ef - gf).abs()
    fe, fg = torch.isfinite(ef), torch.isfinite(gf)
    both = fe & fg
    same_special = ~fe & ~fg & ((ef == gf) | (torch.isnan(ef) & torch.isnan(gf)))
    disagree = ~both & ~same_special
    nan_t = disagree.sum()
    d = (
        torch.where(both, d, torch.zeros_like(d)).real
        if d.is_complex()
        else torch.where(both, d, torch.zeros_like(d))
    )
    ae = torch.where(both, ef.abs(), torch.zeros_like(d))
    stats = torch.stack(
        [
            d.max().double(),
            (d / (ae + (atol if atol > 0 else 1e-12))).max().double(),
            nan_t.double(),
            (d > 0.1).sum().double(),
            (d > 0.01).sum().double(),
            (d <= atol + rtol * ae).all().double(),
        ]
    ).cpu()  # one device synchronisation for all metrics
    err_abs, err_rel, nan, h01, h001, ok = stats.tolist()
    if nan:
        # NaN or an infinity against a number (or the other infinity): infinitely wrong
        err_abs = err_rel = math.inf
        h01, h001 = h01 + nan, h001 + nan
    r.err_abs, r.err_rel, r.err_nan, r.err_h01, r.err_h001 = err_abs, err_rel, nan, h01, h001
    r.passed = bool(ok) and nan == 0
    real = g.is_floating_point() and not e.is_complex()
    ulp = (math.inf if nan else ms.torch_ulp(e, g, both)) if real else None
    keys = torch.where(disagree, torch.full_like(d, math.inf), d) if nan else d
    zero = torch.zeros((), dtype=ef.dtype, device=ef.device)
    _torch_measures(r, torch.where(both, ef, zero), torch.where(both, gf, zero), d, keys, ulp)
