"""Comparisons, logic and bitwise ops (ai.onnx)."""

from __future__ import annotations

import numpy as np
import torch

from ..registry import op
from ._helpers import unsigned_safe
from .elementwise import binary


def _equal(a, b):
    try:
        return torch.eq(a, b)
    except TypeError:
        # string tensors come as numpy object arrays (torch has no string dtype); the
        # common path pays for the try block only
        if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
            raise
    return torch.from_numpy(np.asarray(np.equal(a, b), dtype=bool))


binary("Equal", _equal, placement="follow")
binary("Less", torch.lt, placement="follow")
binary("Greater", torch.gt, placement="follow")
binary("LessOrEqual", torch.le, legacy=False, placement="follow")
binary("GreaterOrEqual", torch.ge, legacy=False, placement="follow")
binary("And", torch.logical_and, placement="follow")
binary("Or", torch.logical_or, placement="follow")
binary("Xor", torch.logical_xor)


@op("Not", since=1, placement="follow")
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
