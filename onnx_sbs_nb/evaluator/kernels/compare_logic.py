"""Comparisons, logic and bitwise ops (ai.onnx)."""

from __future__ import annotations

import torch

from ..registry import op
from ._helpers import unsigned_safe
from .elementwise import binary

binary("Equal", torch.eq)
binary("Less", torch.lt)
binary("Greater", torch.gt)
binary("LessOrEqual", torch.le, legacy=False)
binary("GreaterOrEqual", torch.ge, legacy=False)
binary("And", torch.logical_and)
binary("Or", torch.logical_or)
binary("Xor", torch.logical_xor)


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
