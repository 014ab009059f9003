"""One input of a run over many inputs, as the user gives it: positional, keyword, both,
one tensor, or the path of a saved file."""

from __future__ import annotations

import os
from typing import Any

import torch

from ..errors import SbsInputError


def split_input(item: Any, index: int) -> tuple[Any, Any]:
    """``(args, kwargs)`` of one input: a tuple or list of positional inputs (what a
    DataLoader yields), a dict of keyword inputs, a pair ``(args, kwargs)``, one tensor,
    or the path of a file saved with ``torch.save``."""
    if isinstance(item, dict):
        return None, item
    if isinstance(item, tuple | list):
        if len(item) == 2 and isinstance(item[0], tuple | list) and isinstance(item[1], dict):
            return tuple(item[0]), item[1]
        return tuple(item), None
    if isinstance(item, torch.Tensor):
        return (item,), None
    if isinstance(item, str | os.PathLike):
        return item, None
    raise SbsInputError(
        f"input {index} is a {type(item).__name__}: each input is a tuple or list of "
        "positional inputs, a dict of keyword inputs, a tensor or the path of a file saved "
        "with torch.save"
    )


__all__ = ["split_input"]
