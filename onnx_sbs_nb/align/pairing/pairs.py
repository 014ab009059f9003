"""A pair of values, and the pairing: every pair made between the two sides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Pair:
    onnx_name: str
    fx_name: str
    rule: str
    kind: str
    transform: str | None = None  # how to turn the fx value into the ONNX one
    cast_to: int | None = None  # for a cast: the ONNX element type of the candidate value
    perm: tuple[int, ...] | None = None  # the permutation of TRANSFORM_PERMUTE
    # TRANSFORM_RESHAPE: the size-1 axes of the fx value and of the ONNX value
    squeeze: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # TRANSFORM_RESHAPE otherwise: the ONNX value's shape (-1 for its one unknown axis)
    shape: tuple[int, ...] | None = None
    # the model declares the value with the fx value's static shape, every axis known: a
    # pair made by metadata, place or structure whose computed shape then differs is the
    # lowering's error (it computes another shape than it declares), not another value
    declared: bool = False
    # a structural pair whose paired readers all read its twin (``corroborated.py``): a
    # value agreeing with its twin only once transposed is then the node's fault
    read_by_twins: bool = False


@dataclass
class Pairing:
    by_onnx: dict[str, Pair] = field(default_factory=dict)
    # tuples: a run shares them with the cached pairing, and the cyclic collector does
    # not track a tuple the way it tracks a list (one per fx value)
    by_fx: dict[str, tuple[Pair, ...]] = field(default_factory=dict)
    # what a kept pairing is keyed on (setup_cache.py): a plan made from it may be kept too
    cache_key: Any = field(default=None, compare=False)

    def add(self, pair: Pair) -> None:
        self.by_onnx[pair.onnx_name] = pair
        self.by_fx[pair.fx_name] = (*self.by_fx.get(pair.fx_name, ()), pair)

    def __len__(self) -> int:
        return len(self.by_onnx)


__all__ = ["Pair", "Pairing"]
