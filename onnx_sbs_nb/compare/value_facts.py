"""What a value is, before any comparison: its dtype's name and default tolerance, its
shape and type as records show them, numpy and torch views of it, whether two values hold
the same bits, and the sizes a comparison reads (largest magnitude, smallest normal).

CPU values are read through numpy without a copy where numpy has their dtype; the C
extension answers "same bytes?" in one pass where it is built."""

from __future__ import annotations

import numpy as np
import torch

from ..convert import _ML_NAMES, _ML_SUBBYTE, to_numpy, to_torch
from ..native import NATIVE
from .tolerances import default_tolerance

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


# the float dtypes whose facts numpy computes (others take the torch path)
_NUMPY_FLOATS = frozenset((np.dtype(np.float32), np.dtype(np.float64)))
_TORCH_FLOATS = frozenset((torch.float32, torch.float64))


def largest_magnitude(v) -> float | None:
    """max |v| of a non-empty float tensor or array, None for anything else."""
    if isinstance(v, torch.Tensor) and v.is_cpu and v.dtype in _TORCH_FLOATS and v.numel():
        v = _as_numpy(v)  # numpy's reduction: no dispatch, no thread pool woken
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


def _numpy_float_pair(expected, got) -> tuple[np.ndarray, np.ndarray] | None:
    """Two CPU float32/float64 values of one dtype and shape as numpy arrays (shared,
    not copied), None for anything else (the torch path then answers)."""
    e, g = _as_numpy(expected), _as_numpy(got)
    if e is None or g is None or e.dtype != g.dtype or e.shape != g.shape:
        return None
    return (e, g) if e.dtype in _NUMPY_FLOATS else None


def largest_element_error(expected, got) -> float | None:
    """max |got - expected| / |expected| over the elements where ``expected`` is a finite
    normal number (None where none is, or for anything but two float values of one
    shape): how far the worst element is off relative to itself."""
    arrays = _numpy_float_pair(expected, got)
    if arrays is not None:
        # the torch path's double arithmetic in numpy, without its masked copies (a
        # rerun's elementwise node paid 4 ms here, torch's dispatch and indexing)
        e, g = arrays
        with np.errstate(all="ignore"):
            ae = np.absolute(e, dtype=np.float64)
            d = np.subtract(g, e, dtype=np.float64)
            np.absolute(d, out=d)
            np.divide(d, ae, out=d)
            keep = ae >= smallest_normal(e)
            keep &= ae < np.inf
            keep &= np.isfinite(g)
        found = float(np.max(d, where=keep, initial=-1.0)) if d.size else -1.0
        return None if found < 0 else found
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
    arrays = _numpy_float_pair(expected, got)
    if arrays is not None:
        e, g = arrays
        if _same_bits(e, g):  # a rerun's equal values mostly are: one byte comparison
            return 0
        zeros = e == 0
        if not zeros.any():
            return 0
        return int(np.count_nonzero(zeros & (g == 0) & (np.signbit(e) != np.signbit(g))))
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
