"""Optional values (ai.onnx): an empty optional is None, a full one is its value."""

from __future__ import annotations

import torch

from ..registry import op


@op("Optional", since=15, placement="any")
def optional(x=None, type=None):  # noqa: A002
    return x


@op("OptionalHasElement", since=15)
def optional_has_element(x=None):
    return torch.tensor(x is not None)


@op("OptionalGetElement", since=15, placement="any")
def optional_get_element(x):
    if x is None:
        raise ValueError("OptionalGetElement on an empty optional")
    return x
