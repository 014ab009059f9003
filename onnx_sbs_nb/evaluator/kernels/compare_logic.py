"""Comparisons, logic and bitwise ops (ai.onnx)."""

from __future__ import annotations

import torch

from ..registry import op
from ._helpers import unsigned_safe
from .elementwise import legacy_broadcast


def _register(name: str, fn, since_legacy: bool = True) -> None:
    modern = fn = unsigned_safe(fn)

    def old(a, b, broadcast=0, axis=None):
        return fn(a, legacy_broadcast(b, a, broadcast, axis))

    old.__name__ = name.lower()
    if since_legacy:
        op(name, since=1)(old)
    op(name, since=7)(modern)


_register("Equal", torch.eq)
_register("Less", torch.lt)
_register("Greater", torch.gt)
_register("LessOrEqual", torch.le, since_legacy=False)
_register("GreaterOrEqual", torch.ge, since_legacy=False)
_register("And", torch.logical_and)
_register("Or", torch.logical_or)
_register("Xor", torch.logical_xor)


@op("Not", since=1)
def not_(x):
    return torch.logical_not(x)


@op("BitwiseAnd", since=18)
def bitwise_and(a, b):
    return torch.bitwise_and(a, b)


@op("BitwiseOr", since=18)
def bitwise_or(a, b):
    return torch.bitwise_or(a, b)


@op("BitwiseXor", since=18)
def bitwise_xor(a, b):
    return torch.bitwise_xor(a, b)


@op("BitwiseNot", since=18)
@unsigned_safe
def bitwise_not(x):
    return torch.bitwise_not(x)
