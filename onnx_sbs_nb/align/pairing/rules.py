"""The pairing rules, declared once with their strength.

Each rule that pairs a value names itself in ``Record.paired_by``.  Its strength says what
a pair it made is worth:

- ``proven``: the two values are the same value by construction (the same value name, a
  weight through its state-dict name); a pair whose shapes then differ is the model's
  error;
- ``guess``: the values are probably the same (the exporter's metadata, the graph around
  a paired value, a place among the inputs or outputs); a pair whose shapes differ was a
  wrong guess, not a mismatch.

``links_models``: whether a pair made by the rule is evidence that the two sides are one
program (a place among the inputs is not: any two models taking the same inputs share it).
Code asks :func:`proven_rules` and :func:`linking_rules`; it never lists rules itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ...records import (
    PAIRED_BY_METADATA,
    PAIRED_BY_NAME,
    PAIRED_BY_POSITION,
    PAIRED_BY_STATE_DICT,
    PAIRED_BY_STRUCTURE,
)

PROVEN = "proven"
GUESS = "guess"


@dataclass(frozen=True)
class PairingRule:
    name: str  # the value of Record.paired_by
    strength: Literal["proven", "guess"]
    links_models: bool
    doc: str


# The declarations, in the order the pairings first try them.  The rules as code are
# classes naming their declaration (context.PairingStep.declared): a rule's name and
# strength are read from here, and each pairing's tuple of rule objects (names.FX_RULES,
# onnx_pairing.ONNX_RULES) says what runs in which order.
RULES: tuple[PairingRule, ...] = (
    PairingRule(PAIRED_BY_NAME, PROVEN, True, "the same value name on both sides"),
    PairingRule(PAIRED_BY_STATE_DICT, PROVEN, True, "a weight through its state-dict name"),
    PairingRule(PAIRED_BY_METADATA, GUESS, True, "the exporter's node metadata"),
    PairingRule(PAIRED_BY_STRUCTURE, GUESS, False, "the graph around a paired value"),
    PairingRule(PAIRED_BY_POSITION, GUESS, False, "a place among the inputs or outputs"),
)
_BY_NAME = {r.name: r for r in RULES}


def rule(name: str) -> PairingRule:
    return _BY_NAME[name]


def proven_rules() -> frozenset[str]:
    """The rules whose pairs are the same value by construction."""
    return frozenset(r.name for r in RULES if r.strength == PROVEN)


def linking_rules() -> frozenset[str]:
    """The rules whose pairs are evidence that the two sides are one program."""
    return frozenset(r.name for r in RULES if r.links_models)


__all__ = ["GUESS", "PROVEN", "RULES", "PairingRule", "linking_rules", "proven_rules", "rule"]
