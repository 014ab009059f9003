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

from ..convert import _ML_NAMES, _ML_SUBBYTE, to_numpy, to_torch
from ..native import NATIVE
from . import measures as ms
from .tolerances import default_tolerance


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


_DTYPE_NAMES: dict = {}
# tuples, not ``a | b`` unions: a union is a new object at every call, and these are
# asked several times per comparison
ARRAY_TYPES = (torch.Tensor, np.ndarray, np.generic)
_NUMPY_SCALARS = (np.generic, int, float, bool)


def value_dtype_name(v) -> str:
    dtype = v.dtype if isinstance(v, ARRAY_TYPES) else np.asarray(v).dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = str(dtype).replace("torch.", "") if isinstance(dtype, torch.dtype) else dtype.name
        _DTYPE_NAMES[dtype] = name
    return name


# dtype -> (name, default atol, default rtol, is a float type): asked at every comparison
_DTYPE_FACTS: dict = {}
_FLOAT_PREFIXES = ("float", "bfloat", "complex")


def _dtype_facts(v) -> tuple[str, float, float, bool]:
    dtype = v.dtype if isinstance(v, ARRAY_TYPES) else np.asarray(v).dtype
    facts = _DTYPE_FACTS.get(dtype)
    if facts is None:
        name = value_dtype_name(v)
        facts = (name, *default_tolerance(name), name.startswith(_FLOAT_PREFIXES))
        _DTYPE_FACTS[dtype] = facts
    return facts


# (dtype, shape) -> text: a run shows the same few shapes thousands of times
_SHAPE_TYPES: dict = {}


def shape_type(v) -> str:
    """'float32[2x3]' for a tensor, the type name otherwise."""
    if isinstance(v, ARRAY_TYPES):
        key = (v.dtype, v.shape)  # a torch.Size is a tuple: one key for both kinds
        text = _SHAPE_TYPES.get(key)
        if text is None:
            shape = "x".join(str(d) for d in v.shape)
            text = f"{value_dtype_name(v)}[{shape}]"
            if len(_SHAPE_TYPES) < 65536:
                _SHAPE_TYPES[key] = text
        return text
    if isinstance(v, list | tuple):
        return f"{type(v).__name__}[{len(v)}]"
    if v is None:
        return "None"
    return type(v).__name__


# torch dtypes numpy cannot hold (bfloat16 and float8 types live in ml_dtypes): their
# comparisons run on the torch path, which upcasts them (torch cannot subtract float8)
_NO_NUMPY = frozenset(
    getattr(torch, name) for name in (*_ML_NAMES, "float4_e2m1fn_x2") if hasattr(torch, name)
)
# sub-byte types (one element per byte under torch's storage-only dtypes) have no torch
# arithmetic at all: they are compared as their ml_dtypes arrays
_SUBBYTE = frozenset(getattr(torch, n) for n in _ML_SUBBYTE.values() if hasattr(torch, n))
_INT64_MAX = np.iinfo(np.int64).max


def _as_numpy(v) -> np.ndarray | None:
    if type(v) is np.ndarray:
        return v
    if isinstance(v, torch.Tensor):
        if v.dtype in _SUBBYTE:
            return to_numpy(v)
        if not v.is_cpu or v.dtype in _NO_NUMPY:
            return None
        if v.is_conj() or v.is_neg():
            v = v.resolve_conj().resolve_neg()
        return v.detach().numpy() if v.requires_grad else v.numpy()
    if isinstance(v, np.ndarray):
        return v
    if isinstance(v, _NUMPY_SCALARS):
        return np.asarray(v)
    return None


# A transposed weight (a linear lowered to MatMul) against its contiguous twin: numpy
# walks one of them across the cache at every pass; torch's blocked copy puts it in
# order once, and every pass after that is contiguous.
_RELAYOUT = 1 << 15
_RELAYOUT_NATIVE = 2
# below this many elements, the C library's comparison is as cheap as a byte comparison
_NATIVE_DIRECT = 1 << 16


# below this many elements, numpy's copy (no dispatcher, a few microseconds less) is the
# faster way to put a value in order, whatever its strides
_SMALL_COPY = 1 << 14


def _c_order(a: np.ndarray) -> np.ndarray:
    if a.flags.c_contiguous:
        return a
    # torch's blocked copy wins where the last axis is strided (a transposed matrix) and
    # the value is large; numpy's where rows stay contiguous (a permuted attention head)
    if (
        a.size > _SMALL_COPY
        and a.ndim
        and a.strides[-1] != a.itemsize
        and all(s >= 0 for s in a.strides)
        and a.dtype.kind in "fc"
    ):
        return torch.from_numpy(a).contiguous().numpy()
    return np.ascontiguousarray(a)


# Bit-identical values (the weights, and every value until the first rounding difference
# between the two runtimes) are answered by a memcmp: a few microseconds, where the float
# comparison makes several passes and temporaries.  Large values are compared in slices,
# so the copies made to compare stay small and the first differing slice ends the check.
_BITS_SLICE = 1 << 20
_BITS_PREFIX = 4096  # a copy this small costs less than slicing first


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two C-ordered arrays of one dtype hold the same bytes (NaN matching NaN)."""
    if not (a.flags.c_contiguous and b.flags.c_contiguous) or a.dtype.hasobject:
        return False
    if NATIVE is not None:
        return NATIVE.same_bytes(a, b)
    if a.nbytes <= _BITS_PREFIX:
        return a.tobytes() == b.tobytes()
    a8, b8 = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    # once the runtimes round differently, nearly every element differs: the first bytes
    # tell, before the whole value is copied to be compared
    if a8[:_BITS_PREFIX].tobytes() != b8[:_BITS_PREFIX].tobytes():
        return False
    if a.nbytes <= _BITS_SLICE:
        return a.tobytes() == b.tobytes()
    return all(
        a8[k : k + _BITS_SLICE].tobytes() == b8[k : k + _BITS_SLICE].tobytes()
        for k in range(0, a8.size, _BITS_SLICE)
    )


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Whether two arrays of one dtype, one of them strided (a transposed weight against
    its twin), hold equal values: one strided pass in torch, where putting one of them in
    order to compare bytes reads and writes it first.  Equal values (0.0 and -0.0 alike)
    make a zero difference; NaNs make it False, and the full comparison matches them."""
    if a.dtype.kind not in "biufc" or min(a.strides + b.strides, default=0) < 0:
        return False
    if NATIVE is not None and a.ndim == 2:
        # a transposed weight: the same bytes tell in one pass through the cache (±0.0
        # or NaNs that differ in bits go on to the full comparison, which matches them)
        for x, y in ((a, b), (b, a)):
            if x.T.flags.c_contiguous and y.flags.c_contiguous:
                same = NATIVE.equal_transposed(x.T, y)
                if same is not None:
                    return same
    try:
        return torch.equal(_read_view(a), _read_view(b))
    except (TypeError, RuntimeError):  # a dtype torch does not take from numpy
        return False


class _Alias:
    """An array's memory, declared writable, for a tensor that only reads it: torch
    warns (once per process, for the user's code too) on a read-only array, and an
    initializer's array is one (a view of the bytes onnx gives)."""

    __slots__ = ("__array_interface__", "base")

    def __init__(self, a: np.ndarray) -> None:
        face = a.__array_interface__
        face["data"] = (face["data"][0], False)
        self.__array_interface__ = face
        self.base = a  # keeps the memory alive as long as the alias


def _read_view(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(a if a.flags.writeable else np.asarray(_Alias(a)))


def _as_torch(v, device: torch.device) -> torch.Tensor:
    return to_torch(v, device).detach()


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
            _fill_native(result, NATIVE.compare(ea, ga, atol, rtol, measures), atol, ea, ga)
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


def largest_magnitude(v) -> float | None:
    """max |v| of a non-empty float tensor or array, None for anything else."""
    if isinstance(v, torch.Tensor):
        if v.is_floating_point() and v.numel():
            return float(v.detach().abs().max().double())
    elif isinstance(v, np.ndarray) and v.dtype.kind == "f" and v.size:
        return float(np.abs(v).max())
    return None


def _float_pair(expected, got) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Two float values of one shape as tensors on the expected one's device (numpy
    arrays shared, not copied), None for anything else."""
    if not isinstance(expected, ARRAY_TYPES) or not isinstance(got, ARRAY_TYPES):
        return None
    try:
        e, g = to_torch(expected), to_torch(got)
    except TypeError:  # strings, dtypes torch has not
        return None
    if not e.is_floating_point() or e.shape != g.shape:
        return None
    return e.detach(), g.detach().to(e.device)


def largest_element_error(expected, got) -> float | None:
    """max |got - expected| / |expected| over the elements where ``expected`` is a finite
    normal number (None where none is, or for anything but two float values of one
    shape): how far the worst element is off relative to itself."""
    pair = _float_pair(expected, got)
    if pair is None:
        return None
    e, g = pair[0].double(), pair[1].double()
    keep = torch.isfinite(e) & torch.isfinite(g) & (e.abs() >= smallest_normal(pair[0]))
    if not bool(keep.any()):
        return None
    return float(((g - e).abs()[keep] / e.abs()[keep]).max())


def zero_sign_mismatches(expected, got) -> int:
    """Positions where both values are zero with opposite signs (-0.0 against +0.0):
    equal as numbers, yet 1/x, atan2 or copysign downstream tell them apart."""
    pair = _float_pair(expected, got)
    if pair is None:
        return 0
    e, g = pair
    zeros = e == 0
    if not bool(zeros.any()):  # most values hold no zero: one pass
        return 0
    return int((zeros & (g == 0) & (torch.signbit(e) != torch.signbit(g))).sum())


def smallest_normal(v) -> float:
    """The smallest positive normal number of a float tensor's or array's dtype (0.0 for
    anything else): below it, values keep only a few significant bits."""
    if isinstance(v, torch.Tensor):
        return float(torch.finfo(v.dtype).tiny) if v.is_floating_point() else 0.0
    if isinstance(v, np.ndarray) and v.dtype.kind == "f":
        return float(np.finfo(v.dtype).tiny)
    return 0.0


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
        _fill_native(r, NATIVE.compare(e, g, atol, rtol, measures), atol, e, g)
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


def _fill_native(
    r: Diff, found: tuple[float, ...], atol: float, e: np.ndarray, g: np.ndarray
) -> None:
    """The metrics from the C library's one pass, as _compare_numpy_floats sets them, and
    the measures (the quantiles from the library's selection, only where values differ;
    none when the library was asked for none: six values found, not eleven)."""
    err_abs, err_rel, nan, h01, h001, fails = found[:6]
    if len(found) == 6:
        _fill_native_metrics(r, err_abs, err_rel, nan, h01, h001, fails, atol)
        return
    ee, gg, eg, dd, ulp = found[6:]
    _fill_native_metrics(r, err_abs, err_rel, nan, h01, h001, fails, atol)
    if nan:
        order, plan = _ranks(e.size)
        _set_nonfinite(r, list(NATIVE.ranks(e, g, order)), plan, ulp)
        return
    if err_abs == 0.0:
        _empty_measures(r, 0.0)
        return
    sums = (ee, gg, eg, dd)
    if ms.sums_overflow(ee, gg, dd):
        sums = _finite_sums(e, g)
    order, plan = _ranks(e.size)
    _set_measures(r, sums, list(NATIVE.ranks(e, g, order)), plan, ulp)


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
