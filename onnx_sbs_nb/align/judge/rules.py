"""The verdict rules, as one ordered registry (:data:`RULES`), and the rules for values of
no comparable content.

Each rule is a small object (``context.py`` says what one is): ``name``, ``stage``,
``applies(pair, ctx)`` and ``judge(record, expected, got, ctx)``, which fills the record
and returns whether it decided the verdict.  A test can call one alone.  The engine runs
them stage by stage (``verdict.py``): the first rule of a stage that decides is the
record's ``decided_by``; the last rule of the comparison, :class:`~.tolerance.Tolerance`
(atol/rtol or the user's verdict policy), decides every pair the rules before it leave.  Adding a rule is
one class and one entry of :data:`RULES`.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from ...compare.diff import compare
from ...compare.value_facts import value_dtype_name
from ...records import STATUS_FAIL, STATUS_NOT_COMPARED, STATUS_SHAPE_MISMATCH, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .conditioning import IllConditioned
from .context import (
    STAGE_AFTER,
    STAGE_COMPARED,
    STAGE_PAIR,
    STAGE_RAW,
    STAGE_VALUES,
    STAGES,
    Rule,
    RuleContext,
    first_verdict,
)
from .decisions import NearTieFlip
from .exact_weight import ExactWeight
from .failed import NodeFailed, ReferenceFailed, RunnerCannot, UpstreamFailure
from .judging import comparable, fill_first_comparison
from .linear import LinearCheck
from .precision import InheritedPrecision
from .precision_loss import PrecisionLoss
from .quantization_noise import QuantizationNoise
from .quantization_step import QuantizationStep
from .saturation import Saturation
from .shapes import PermutedPair, UnprovenPair, WrongShapeLowering
from .ties import TopKTies
from .tolerance import Tolerance
from .transforms import PairNotes
from .undefined import UNDEFINED_NOTE
from .unordered import UnorderedResult

RANDOM_NOTE = (
    "drawn at random: each side makes its own draw, so only the shape and type "
    "are compared; the nodes after it continue from the torch value"
)


def same_kind(expected: Any, got: Any) -> bool:
    """The same shape and element type (what a value of no comparable content can be
    checked on)."""
    return tuple(expected.shape) == tuple(got.shape) and value_dtype_name(
        expected
    ) == value_dtype_name(got)


class FixedOnExampleInputs:
    """Both sides agree, on a shape the user's program does not make, or on values the
    user's op does not compute at these sizes: a decomposition fixed a size on the example
    inputs (``source/specialized.py``, ``engine/decomposed_values.py``).  For values, the
    candidate is compared with the user's op's value, the one expected."""

    name = "fixed_on_example_inputs"
    stage = STAGE_RAW
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return bool(ctx.specialized) and pair.fx_name in ctx.specialized

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        fixed = ctx.specialized[ctx.fx_name]
        if fixed.value is not None:
            want, have = comparable(fixed.value, got)
            if want is None:
                return False
            fill_first_comparison(
                record, compare(want, have, ctx.atol, ctx.rtol, ctx.inherited, False, ctx.policy)
            )
            if record.status != STATUS_FAIL:
                return False  # the ONNX model computes the user's values: judged as usual
            record.comment = _join(record.comment, fixed.note())
            return True
        record.status = STATUS_SHAPE_MISMATCH
        record.ep_shape_type = fixed.user_shape_type
        record.comment = _join(record.comment, fixed.note())
        return True


class _ShapeAndTypeOnly:
    """A value whose content no comparison can judge: checked on shape and type only,
    and compared as usual when those differ."""

    name = ""
    note = ""
    stage = STAGE_VALUES
    own_error = False

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


class NotTensors:
    """A value that is not a tensor on both sides (after making them comparable)."""

    name = "not_tensors"
    stage = STAGE_VALUES
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return True

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if expected is not None:
            return False
        record.status = STATUS_NOT_COMPARED
        record.comment = _join(record.comment, "not a tensor on both sides")
        return True


#: Every verdict rule, in the order they are tried (stage by stage, ``context.STAGES``).
RULES: tuple[Rule, ...] = (
    PairNotes(),
    ReferenceFailed(),
    UpstreamFailure(),
    RunnerCannot(),
    NodeFailed(),
    FixedOnExampleInputs(),
    NotTensors(),
    UninitialisedMemory(),
    RandomDraw(),
    UnorderedResult(),
    InheritedPrecision(),
    WrongShapeLowering(),
    UnprovenPair(),
    PermutedPair(),
    TopKTies(),
    ExactWeight(),  # a weight within tolerance, yet not a copy: before it
    Tolerance(),
    LinearCheck(),
    NearTieFlip(),  # indices: a decision the inputs' rounding flips, before any loss
    PrecisionLoss(),
    IllConditioned(),  # after it: a low-precision node's loss is precision_loss's
    QuantizationStep(),  # before the noise: a weight beyond its step is no noise
    QuantizationNoise(),
    Saturation(),
)


def by_stage(rules: tuple[Rule, ...] = RULES) -> dict[str, tuple[Rule, ...]]:
    """``rules`` by stage, each stage's in their order."""
    return {stage: tuple(r for r in rules if r.stage == stage) for stage in STAGES}


_STAGED = by_stage()
BEFORE_VALUES: tuple[Rule, ...] = _STAGED[STAGE_RAW]  # on the values as the sides hold them
ON_VALUES: tuple[Rule, ...] = _STAGED[STAGE_VALUES]  # on the comparable values


__all__ = [
    "BEFORE_VALUES",
    "ON_VALUES",
    "RULES",
    "STAGE_AFTER",
    "STAGE_COMPARED",
    "STAGE_PAIR",
    "FixedOnExampleInputs",
    "NotTensors",
    "RandomDraw",
    "Rule",
    "RuleContext",
    "UninitialisedMemory",
    "by_stage",
    "first_verdict",
    "same_kind",
]
