"""Element-wise arithmetic and math (ai.onnx): Add ... Pow, Mod, trigonometry, Clip, Where."""

from __future__ import annotations

import math

import torch

from ..registry import Placement, op
from ._helpers import WIDE_UNSIGNED, unsigned_safe


def legacy_broadcast(b: torch.Tensor, a: torch.Tensor, broadcast: int, axis: int | None):
    """Opset < 7 broadcasting: ``b`` aligned with ``a`` starting at ``axis``."""
    if not broadcast or axis is None or b.dim() == a.dim():
        return b
    axis = axis + a.dim() if axis < 0 else axis
    return b.reshape(*b.shape, *([1] * (a.dim() - axis - b.dim())))


def binary(name: str, fn, legacy: bool = True, placement: Placement = "device") -> None:
    """Registers a binary op: ``fn`` from opset 7 (numpy broadcasting, wide unsigned types
    through int64) and, with ``legacy``, its opset-1 form with ``broadcast``/``axis``."""
    modern = unsigned_safe(fn)

    def old(a, b, broadcast=0, axis=None):
        return modern(a, legacy_broadcast(b, a, broadcast, axis))

    old.__name__ = name.lower()
    if legacy:
        op(name, since=1, placement=placement)(old)
    op(name, since=7, placement=placement)(modern)


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.is_floating_point() or a.is_complex():
        return a / b
    # ONNX integer division truncates toward zero (C semantics)
    return torch.div(a, b, rounding_mode="trunc")


binary("Add", torch.add, placement="follow")
binary("Sub", torch.sub, placement="follow")
binary("Mul", torch.mul, placement="follow")
binary("Div", _div, placement="follow")


@op("Pow", since=1, host_inputs=(1,))
def pow_legacy(a, b, broadcast=0, axis=None):
    return pow_(a, legacy_broadcast(b, a, broadcast, axis))


@op("Pow", since=7, host_inputs=(1,))  # a scalar exponent on the host: torch's fast path
def pow_(a, b):
    # The result has the type of the base, whatever the exponent's type.
    if b.device != a.device and b.dim():
        b = b.to(a.device, non_blocking=True)  # the exponent may be kept on the host
    if a.is_floating_point():
        if b.dim() == 0 and b.device.type == "cpu" and not b.dtype.is_complex:
            # a scalar exponent on the host: torch's scalar path (x*x for 2) is ~20x faster
            return torch.pow(a, b.item())
        return torch.pow(a, b.to(a.dtype) if b.dtype != a.dtype else b)
    if b.is_floating_point():
        return torch.pow(a.to(torch.float64), b.to(torch.float64)).to(a.dtype)
    if a.dtype in WIDE_UNSIGNED:
        return torch.pow(a.to(torch.int64), b.to(torch.int64)).to(a.dtype)
    return torch.pow(a, b.to(a.dtype))


@op("Mod", since=10, placement="follow")
@unsigned_safe
def mod(a, b, fmod=0):
    if fmod:
        return torch.fmod(a, b)
    if a.is_floating_point():
        # numpy's mod: the sign of the divisor, exact with infinities and signed zeros
        r = torch.fmod(a, b)
        fix = (r != 0) & ((r < 0) != (b < 0))
        r = torch.where(fix, r + b, r)
        return torch.where(r == 0, torch.copysign(torch.zeros_like(r), b), r)
    return torch.remainder(a, b)  # sign of the divisor, like Python and numpy


# the torch function itself is the kernel: one call per node
for _name, _fn in {
    "Abs": unsigned_safe(torch.abs),
    "Neg": torch.neg,
    "Sqrt": torch.sqrt,
    "Floor": torch.floor,
    "Ceil": torch.ceil,
}.items():
    op(_name, since=1, placement="follow")(_fn)  # shape arithmetic too
for _name, _fn in {
    "Exp": torch.exp,
    "Log": torch.log,
    "Reciprocal": torch.reciprocal,
    "Sin": torch.sin,
    "Cos": torch.cos,
    "Tan": torch.tan,
    "Asin": torch.asin,
    "Acos": torch.acos,
    "Atan": torch.atan,
    "Sinh": torch.sinh,
    "Cosh": torch.cosh,
    "Asinh": torch.asinh,
    "Acosh": torch.acosh,
    "Atanh": torch.atanh,
    "Erf": torch.erf,
    "Round": torch.round,  # half to even, like ONNX
}.items():
    op(_name, since=1)(_fn)


@op("Sign", since=9, placement="follow")
@unsigned_safe
def sign(x):
    return torch.sign(x)


@op("IsNaN", since=9)
def isnan(x):
    return torch.isnan(x)


@op("IsInf", since=10)
def isinf(x, detect_negative=1, detect_positive=1):
    if detect_negative and detect_positive:
        return torch.isinf(x)
    if detect_negative:
        return torch.isneginf(x)
    if detect_positive:
        return torch.isposinf(x)
    return torch.zeros_like(x, dtype=torch.bool)


def _variadic(reduce):
    def kernel(*xs):
        if len(xs) == 1:
            return xs[0]
        res = xs[0]
        for x in xs[1:]:
            res = reduce(res, x)
        return res

    return kernel


def _maximum(a, b):
    if a.dtype == torch.bool:
        return a | b
    return torch.maximum(a, b)


def _minimum(a, b):
    if a.dtype == torch.bool:
        return a & b
    return torch.minimum(a, b)


_max = _variadic(unsigned_safe(_maximum))
_min = _variadic(unsigned_safe(_minimum))
_sum = _variadic(unsigned_safe(torch.add))
for _since in (1, 6, 8, 12, 13):
    op("Max", since=_since, placement="follow")(_max)
    op("Min", since=_since, placement="follow")(_min)
    op("Sum", since=_since)(_sum)


@op("Mean", since=1)
def mean(*xs):
    return _sum(*xs) / len(xs)


@op("Clip", since=1)
def clip_attr(x, min=-math.inf, max=math.inf):  # noqa: A002  (ONNX attribute names)
    return torch.clamp(x, min, max)


@op("Clip", since=11)
@unsigned_safe
def clip(x, min=None, max=None):  # noqa: A002
    if min is not None and max is not None:
        # ONNX: min > max sets everything to max, as clamp does (it applies max last).
        return torch.clamp(x, min.to(x.dtype), max.to(x.dtype))
    if min is not None:
        return torch.clamp(x, min=min.to(x.dtype))
    if max is not None:
        return torch.clamp(x, max=max.to(x.dtype))
    return x


@op("Where", since=9, placement="follow")
def where(cond, a, b):
    if a.dtype in WIDE_UNSIGNED:
        return torch.where(cond, a.to(torch.int64), b.to(torch.int64)).to(a.dtype)
    return torch.where(cond, a, b)


@op("BitShift", since=11)
def bitshift(x, y, direction="LEFT"):
    dtype = x.dtype
    wide = x.to(torch.int64)
    yy = y.to(torch.int64)
    res = wide << yy if direction == "LEFT" else wide >> yy
    if dtype != torch.int64:
        bits = torch.iinfo(dtype).bits if dtype not in WIDE_UNSIGNED else dtype.itemsize * 8
        if bits < 64:
            res = res & ((1 << bits) - 1)
    return res.to(dtype)


@op("Identity", since=1, placement="follow")
def identity(x):
    return x
