"""What a verdict rule is and what it knows of the run (``rules.py`` lists them in order).

A rule is a small object: ``name``, ``stage``, ``own_error``, ``applies(pair, ctx)`` and
``judge(record, expected, got, ctx)``, which fills the record and returns whether it
decided the verdict.  A rule that only annotates the record returns False.  The stages
follow a pair through its judgement:

- :data:`STAGE_PAIR`: before any value is read (a side failed, how the pair was made);
- :data:`STAGE_RAW`: the values as the sides hold them;
- :data:`STAGE_VALUES`: the values made comparable (a transposition, a layout, a cast);
- :data:`STAGE_COMPARED`: after the comparison (``ctx.diff``); the last rule always decides;
- :data:`STAGE_AFTER`: once the own error is known: notes, and the rules that read it
  (precision loss: ``expected`` is then the reference value, ``got`` the candidate's).

``own_error``: whether the node's own error is still judged after the rule decided.

A rule may also have ``inert(ctx)``: True when it applies to no pair of the run, from what
the context holds when the run's judge is made (``verdict.Verdicts``): a quantization rule
in a model that quantizes nothing.  Such a rule is left out of the run's stages, and each
pair is spared asking it.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...compare.diff import Diff
from ...records import Record
from ..pairing.pairs import Pair

STAGE_PAIR = "pair"
STAGE_RAW = "raw"
STAGE_VALUES = "values"
STAGE_COMPARED = "compared"
STAGE_AFTER = "after"
STAGES = (STAGE_PAIR, STAGE_RAW, STAGE_VALUES, STAGE_COMPARED, STAGE_AFTER)


@dataclass
class RuleContext:
    """What the rules know of the run; ``name``, ``fx_name`` and the fields from ``pair``
    on describe the pair being judged (ONNX value ``name``), set anew by :meth:`start`."""

    name: str = ""
    fx_name: str = ""  # its reference partner
    # prepared values whose decomposition fixed a size on the example inputs, by fx name
    specialized: Mapping[str, Any] = field(default_factory=dict)
    undefined: Container[str] = frozenset()  # ONNX values of uninitialised memory
    random: Container[str] = frozenset()  # ONNX values drawn at random
    # the run's tolerances and verdict policy (``verdict_policy.py``), None: the defaults
    atol: float | None = None
    rtol: float | None = None
    policy: Any = None
    own_policy: Any = None
    # values not computed because an input was missing (fx and ONNX names)
    missing: Container[str] = frozenset()
    # pairs the comparison disproved: the run no longer feeds their torch value
    unproven: set[str] = field(default_factory=set)
    # values whose order is free, compared as sets and found the same: the run feeds
    # their torch values (``unordered.py``, ``engine/resets.py``)
    reordered: set[str] = field(default_factory=set)
    # (node, its inputs) computing ONNX value ``name``, None when it cannot be had
    node_inputs: Callable[[str], tuple[Any, list[Any] | None] | None] | None = None
    # the node computing ONNX value ``name`` seen from the reference: its inputs exact and
    # rounded to its types (engine/precision_inputs.py), None when they cannot be had
    precision_inputs: Callable[[str], Any] | None = None
    # --- the pair being judged
    pair: Pair | None = None
    ref_error: str | None = None  # the reference side failed to compute it
    cand_error: str | None = None  # the candidate side failed to compute it
    note: str | None = None  # what the candidate side says of how it computed it
    inherited: str | None = None  # the looser float dtype its value is computed from
    own_inherited: str | None = None  # ... that the own-error run's value is computed from
    tie: tuple[int, Any] | None = None  # a TopK's (axis, input) for its indices
    own_tie: tuple[int, Any] | None = None  # ... in the own-error run
    unordered: Any = None  # an unordered.SetOrder: its order is free (compared as sets)
    own_unordered: Any = None  # ... with the own-error run's key
    has_own: bool = False  # the node was rerun on torch inputs
    own_snr: float | None = None  # the SNR (dB) of its rerun on torch inputs
    # a quantized model: the bit width of its narrowest quantized values (None: not one)
    quant_bits: int | None = None
    # ... and the values whose own rerun goes through a quantization node
    quantized: Container[str] = frozenset()
    # ... the paired values each paired value's own rerun starts from, and the values
    # that failed so far in this run (the noise a value inherits is no fault's)
    rerun_sources: Mapping[str, frozenset[str]] = field(default_factory=dict)
    failing: set[str] = field(default_factory=set)
    # a QDQ pair's DequantizeLinear output: the range its QuantizeLinear clips to
    clip_ranges: Mapping[str, Any] = field(default_factory=dict)
    # a value whose rerun holds a QDQ pair dequantizing with other scales or zero points
    # than it quantizes with: what it does (quantization_noise.mismatched_pairs)
    pair_mismatch: Mapping[str, str] = field(default_factory=dict)
    # ... the pairs inside each paired value's own rerun (saturation.interior_ranges)
    interior_clips: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    # the own-error run's values (engine/own_error.py), from STAGE_AFTER on
    own_values: Mapping[Any, Any] | None = None
    # whether a quantized weight pairs with a torch parameter the exporter folded (a
    # BatchNorm into its Conv, ``folding.py``): judged with its consumer, not alone
    folded_weight: Callable[[str], bool] | None = None
    diff: Diff | None = None  # the comparison, from STAGE_COMPARED on

    def start(self, name: str, pair: Pair) -> None:
        """Takes pair ``pair`` of ONNX value ``name``, forgetting the previous one."""
        self.name, self.fx_name, self.pair = name, pair.fx_name, pair
        self.ref_error = self.cand_error = self.note = None
        self.inherited = self.own_inherited = None
        self.tie = self.own_tie = None
        self.unordered = self.own_unordered = None
        self.has_own = False
        self.own_snr = None
        self.diff = None


class Rule(Protocol):
    name: str
    stage: str
    own_error: bool

    def applies(self, pair: Pair, ctx: RuleContext) -> bool: ...

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool: ...


def first_verdict(
    rules: tuple[Rule, ...], record: Record, pair: Pair, expected: Any, got: Any, ctx: RuleContext
) -> Rule | None:
    """The first rule of ``rules`` that decides the pair's verdict (the record then says
    so in ``decided_by``), None when none does."""
    for rule in rules:
        if rule.applies(pair, ctx) and rule.judge(record, expected, got, ctx):
            record.decided_by = rule.name
            return rule
    return None


__all__ = [
    "STAGES",
    "STAGE_AFTER",
    "STAGE_COMPARED",
    "STAGE_PAIR",
    "STAGE_RAW",
    "STAGE_VALUES",
    "Rule",
    "RuleContext",
    "first_verdict",
]
