"""Small helpers shared by kernel modules (no kernels here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

# Unsigned types wider than 8 bits exist in torch but most CPU kernels lack them.
WIDE_UNSIGNED = frozenset(
    getattr(torch, n) for n in ("uint16", "uint32", "uint64") if hasattr(torch, n)
)


def as_ints(t: Any) -> list[int]:
    """A shape/axes argument (tensor, list, tuple or None) as a list of Python ints.

    Constant arguments arrive as tuples of ints, converted once by the compiler."""
    if type(t) is tuple:
        return list(t)
    if t is None:
        return []
    if isinstance(t, torch.Tensor):
        v = t.tolist()  # int tensors give Python ints; shape arguments are 0-d or 1-d
        if not isinstance(v, list):
            return [int(v)]
        if v and isinstance(v[0], list):
            return [int(i) for i in t.reshape(-1).tolist()]
        return v if t.dtype in _INT_TYPES else [int(i) for i in v]
    return [int(v) for v in t]


_INT_TYPES = frozenset((torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8))


def widen(*ts: torch.Tensor | None) -> tuple[list[torch.Tensor | None], torch.dtype | None]:
    """Unsigned 16/32/64-bit inputs computed in int64 (the caller casts back)."""
    dtype = next((t.dtype for t in ts if t is not None), None)
    if dtype in WIDE_UNSIGNED:
        return [t.to(torch.int64) if t is not None else None for t in ts], dtype
    return list(ts), None


def unsigned_safe(fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Wraps a kernel of tensors so that wide unsigned inputs go through int64.

    The common path costs a try block only: torch raises for the unsigned types it lacks.
    """

    def wrapped(*ts: torch.Tensor, **kw: Any) -> torch.Tensor:
        try:
            return fn(*ts, **kw)
        except (NotImplementedError, RuntimeError, TypeError):
            if not ts or ts[0] is None or ts[0].dtype not in WIDE_UNSIGNED:
                raise
        dtype = ts[0].dtype
        res = fn(*[t.to(torch.int64) if t is not None else None for t in ts], **kw)
        return res.to(dtype) if res.dtype == torch.int64 else res

    wrapped.__name__ = fn.__name__
    wrapped.__doc__ = fn.__doc__
    return wrapped


def norm_axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis
