"""Outputs too large for the machine, refused before a torch op allocates them.

The program side of :mod:`.limits`: a ``.pt2`` is untrusted input too, and its graph can
ask ``aten.full`` for terabytes, or broadcast an ``[N, 1]`` against a ``[1, N]``.  The
size is computed from the op's actual arguments (never from ``node.meta``, which the file
controls as well), for the ops whose output can be much larger than their inputs; any
other op, or arguments a rule cannot read, pass.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .limits import broadcast_shape, matmul_shape, refuse_if_too_large

Estimate = tuple[tuple[int, ...], int] | None  # (output shape, bytes per element)
FxRule = Callable[[tuple, dict], Estimate]


def _ints(v: Any) -> tuple[int, ...]:
    if isinstance(v, torch.Size | list | tuple):
        return tuple(int(d) for d in v)
    return (int(v),)


def _dtype_size(kwargs: dict, default: int) -> int:
    dtype = kwargs.get("dtype")
    return dtype.itemsize if isinstance(dtype, torch.dtype) else default


def _factory(size_at: int) -> FxRule:
    def rule(args: tuple, kwargs: dict) -> Estimate:
        size = kwargs.get("size", args[size_at] if len(args) > size_at else None)
        return _ints(size), _dtype_size(kwargs, torch.get_default_dtype().itemsize)

    return rule


def _full(args: tuple, kwargs: dict) -> Estimate:
    fill = args[1] if len(args) > 1 else kwargs.get("fill_value")
    default = 1 if isinstance(fill, bool) else 8 if isinstance(fill, int) else 4
    return _ints(args[0]), _dtype_size(kwargs, default)


def _new_factory(args: tuple, kwargs: dict) -> Estimate:
    default = args[0].element_size() if isinstance(args[0], torch.Tensor) else 8
    return _ints(args[1]), _dtype_size(kwargs, default)


def _arange(args: tuple, kwargs: dict) -> Estimate:
    nums = [float(a) for a in args if isinstance(a, int | float) and not isinstance(a, bool)]
    if not nums:
        return None
    start, end, step = (0.0, nums[0], 1.0) if len(nums) == 1 else (*nums[:2], 1.0)
    if len(nums) > 2:
        step = nums[2]
    if step == 0:
        return None
    return (max(math.ceil((end - start) / step), 0),), _dtype_size(kwargs, 8)


def _repeat(args: tuple, kwargs: dict) -> Estimate:
    x, repeats = args[0], _ints(args[1])
    shape = (1,) * (len(repeats) - x.dim()) + tuple(x.shape)
    return tuple(int(d) * r for d, r in zip(shape, repeats)), x.element_size()


def _elementwise(args: tuple, kwargs: dict) -> Estimate:
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    if len(tensors) < 2:
        return None
    shapes = [tuple(t.shape) for t in tensors]
    if all(s == shapes[0] for s in shapes):
        return None  # no broadcasting (most calls): no larger than an input
    shape = broadcast_shape(*shapes)
    return (shape, max(t.element_size() for t in tensors)) if shape is not None else None


def _matmul(args: tuple, kwargs: dict) -> Estimate:
    a, b = (args[1], args[2]) if len(args) > 2 and isinstance(args[2], torch.Tensor) else args[:2]
    shape = matmul_shape(tuple(a.shape), tuple(b.shape))
    return (shape, a.element_size()) if shape is not None else None


def _pad(args: tuple, kwargs: dict) -> Estimate:
    x, pads = args[0], _ints(args[1])
    shape = list(x.shape)
    for i in range(len(pads) // 2):
        shape[-1 - i] += pads[2 * i] + pads[2 * i + 1]
    return tuple(int(d) for d in shape), x.element_size()


def _upsample(args: tuple, kwargs: dict) -> Estimate:
    x, size = args[0], kwargs.get("output_size", args[1] if len(args) > 1 else None)
    if size is None:
        return None
    return (*x.shape[:2], *_ints(size)), x.element_size()


_ELEMENTWISE = (
    "add sub rsub mul div pow where maximum minimum eq ne lt le gt ge logical_and "
    "logical_or logical_xor bitwise_and bitwise_or bitwise_xor atan2 remainder fmod "
    "copysign masked_fill clamp hypot floor_divide lerp addcmul addcdiv"
)
_FX_RULES: dict[str, FxRule] = {
    **dict.fromkeys(("zeros", "ones", "empty", "rand", "randn", "empty_strided"), _factory(0)),
    "randint": _factory(1),
    "full": _full,
    **dict.fromkeys(("new_zeros", "new_ones", "new_empty", "new_full"), _new_factory),
    "arange": _arange,
    "repeat": _repeat,
    **dict.fromkeys(_ELEMENTWISE.split(), _elementwise),
    **dict.fromkeys(("mm", "bmm", "matmul", "addmm", "baddbmm"), _matmul),
    "constant_pad_nd": _pad,
    **dict.fromkeys(
        ("upsample_nearest2d", "upsample_bilinear2d", "upsample_bicubic2d", "upsample_nearest1d"),
        _upsample,
    ),
}


_RULES_BY_TARGET: dict[Any, FxRule | None] = {}


def fx_size_rule(target: Any) -> FxRule | None:
    """The size rule of an fx call_function target (an aten overload), or None."""
    if isinstance(target, torch._ops.OpOverload):
        try:  # one lookup: an op overload hashes in Python
            return _RULES_BY_TARGET[target]
        except KeyError:
            rule = _RULES_BY_TARGET[target] = _size_rule(target)
            return rule
    return _size_rule(target)


def _size_rule(target: Any) -> FxRule | None:
    schema = getattr(target, "_schema", None)
    name = getattr(schema, "name", "")
    if not name.startswith("aten::"):
        return None
    return _FX_RULES.get(name[len("aten::") :])


def check_fx_output_size(rule: FxRule, args: Sequence[Any], kwargs: dict, device: Any) -> None:
    """Raises ``OutputTooLargeError`` if the op's output would not fit in memory."""
    try:
        estimate = rule(tuple(args), dict(kwargs))
    except Exception:  # arguments the rule cannot read: torch decides
        return
    if estimate is not None:
        refuse_if_too_large(*estimate, device=device)


__all__ = ["check_fx_output_size", "fx_size_rule"]
