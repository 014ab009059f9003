"""Verdicts that are not the model's fault, as named rules tried in order.

Each rule is a small object: ``name``, ``applies(pair, ctx)`` and ``judge(record,
expected, got, ctx)``, which fills the record and returns whether it decided the verdict
(the pair is then not compared).  A test can call one alone.  :data:`BEFORE_VALUES` are
tried before the values are made comparable, :data:`ON_VALUES` on the comparable values
(after a transposition, a layout or a cast); the comparison itself decides the rest.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...diff import value_dtype_name
from ...records import STATUS_NOT_COMPARED, STATUS_SHAPE_MISMATCH, Record
from ...records import join_comments as _join
from ..pairing.names import Pair
from .undefined import UNDEFINED_NOTE

RANDOM_NOTE = (
    "drawn at random: each side makes its own draw, so only the shape and type "
    "are compared; the nodes after it continue from the torch value"
)


@dataclass
class RuleContext:
    """What the rules know of the run: by ONNX value ``name``, the pair being judged."""

    name: str = ""
    fx_name: str = ""  # its reference partner
    # prepared values whose decomposition fixed a size on the example inputs, by fx name
    specialized: Mapping[str, Any] = field(default_factory=dict)
    undefined: Container[str] = frozenset()  # ONNX values of uninitialised memory
    random: Container[str] = frozenset()  # ONNX values drawn at random


class Rule(Protocol):
    name: str

    def applies(self, pair: Pair, ctx: RuleContext) -> bool: ...

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool: ...


def same_kind(expected: Any, got: Any) -> bool:
    """The same shape and element type (what a value of no comparable content can be
    checked on)."""
    return tuple(expected.shape) == tuple(got.shape) and value_dtype_name(
        expected
    ) == value_dtype_name(got)


class FixedOnExampleInputs:
    """Both sides agree, on a shape the user's program does not make: a decomposition
    fixed a size on the example inputs (``source/specialized.py``)."""

    name = "fixed_on_example_inputs"

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return bool(ctx.specialized) and pair.fx_name in ctx.specialized

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        fixed = ctx.specialized[ctx.fx_name]
        record.status = STATUS_SHAPE_MISMATCH
        record.ep_shape_type = fixed.user_shape_type
        record.comment = _join(record.comment, fixed.note())
        return True


class _ShapeAndTypeOnly:
    """A value whose content no comparison can judge: checked on shape and type only,
    and compared as usual when those differ."""

    name = ""
    note = ""

    def values(self, ctx: RuleContext) -> Container[str]:
        raise NotImplementedError

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.name in self.values(ctx)

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if not same_kind(expected, got):
            return False
        record.status = STATUS_NOT_COMPARED
        record.comment = _join(record.comment, self.note)
        return True


class UninitialisedMemory(_ShapeAndTypeOnly):
    """A value of ``torch.empty`` and its kin (``judge/undefined.py``)."""

    name = "uninitialised_memory"
    note = UNDEFINED_NOTE

    def values(self, ctx: RuleContext) -> Container[str]:
        return ctx.undefined


class RandomDraw(_ShapeAndTypeOnly):
    """A random draw: each side draws its own (``engine/randomness.py``)."""

    name = "random_draw"
    note = RANDOM_NOTE

    def values(self, ctx: RuleContext) -> Container[str]:
        return ctx.random


BEFORE_VALUES: tuple[Rule, ...] = (FixedOnExampleInputs(),)
ON_VALUES: tuple[Rule, ...] = (UninitialisedMemory(), RandomDraw())


def first_verdict(
    rules: tuple[Rule, ...], record: Record, pair: Pair, expected: Any, got: Any, ctx: RuleContext
) -> Rule | None:
    """The first rule of ``rules`` that decides the pair's verdict, None when none does."""
    for rule in rules:
        if rule.applies(pair, ctx) and rule.judge(record, expected, got, ctx):
            return rule
    return None


__all__ = [
    "BEFORE_VALUES",
    "ON_VALUES",
    "FixedOnExampleInputs",
    "RandomDraw",
    "Rule",
    "RuleContext",
    "UninitialisedMemory",
    "first_verdict",
    "same_kind",
]
