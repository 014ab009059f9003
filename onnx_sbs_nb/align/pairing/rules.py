"""The pairing rules, each declared once: a class with its name and strength.

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
``caveat``: what a culprit's why says of a pair the rule made (the summary reads it).

The classes below are the declarations; the rules as code derive from them (``class
SameName(NameRule)``), so a rule's name is written in one place.  Code asks
:func:`rule`, :func:`proven_rules` and :func:`linking_rules`; it never lists rules itself.
This module imports nothing heavy (no onnx, no torch): the summary reads it too.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

PROVEN = "proven"
GUESS = "guess"


class PairingStep:
    """A pairing rule as code.  Its rule (name, strength, whether it links the two sides,
    what a culprit's why says of its pairs) is declared once, as one of the classes below
    that the step derives from; several steps may share one rule (the structure passes
    all pair by structure).  What it reads: :mod:`.context`."""

    name: ClassVar[str]  # the value of Record.paired_by for the pairs it makes
    strength: ClassVar[Literal["proven", "guess"]]
    links_models: ClassVar[bool]
    doc: ClassVar[str]
    # the words a culprit's why adds when its pair was made by this rule (None: nothing)
    caveat: ClassVar[str | None] = None

    def pair(self, ctx: Any) -> int:
        """Pairs what the rule can on ``ctx``; returns how many pairs it made."""
        before = len(ctx.pairing)
        self.run(ctx)
        return len(ctx.pairing) - before

    def run(self, ctx: Any) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.strength!r})"


class NameRule(PairingStep):
    name = "name"
    strength = PROVEN
    links_models = True
    doc = "the same value name on both sides"


class StateDictRule(PairingStep):
    name = "state_dict"
    strength = PROVEN
    links_models = True
    doc = "a weight through its state-dict name"


class MetadataRule(PairingStep):
    name = "metadata"
    strength = GUESS
    links_models = True
    doc = "the exporter's node metadata (pkg.torch.onnx.fx_node)"


class StructureRule(PairingStep):
    name = "structure"
    strength = GUESS
    links_models = False
    doc = "the graph around a paired value (a reshape of it, an operand of its node)"
    # no name or metadata says this is the torch value: the why says what the pair rests on
    caveat = (
        "; its torch twin was found by the graph's structure (the twins of its "
        "inputs, its dtype and shape), not by a name the exporter gave: a likely "
        "pairing, not a proven one"
    )


class PositionRule(PairingStep):
    name = "position"
    strength = GUESS
    links_models = False
    doc = "a place among the inputs or outputs"


class RenamedRule(PairingStep):
    """optimize=: onnxruntime computes an original value anew under another name (a
    float16 node run in float32 between Casts keeps its node's name and op): the new value
    pairs with the reference partner of the original one.  A guess: the original's pair
    may be one, and the node is recognised by its name."""

    name = "renamed"
    strength = GUESS
    links_models = False
    doc = "a value onnxruntime computes anew under another name, through its original"


class DequantizedRule(PairingStep):
    """A quantized model: the value the model computes on is the DequantizeLinear output
    of a value it quantizes, and a parameter's twin is its quantized weight dequantized
    (``quantized.py``).  A guess: the quantizer's names and graph shape say so."""

    name = "dequantized"
    strength = GUESS
    links_models = False
    doc = "a quantized value through its DequantizeLinear (the float domain)"


# The registry, in the order the pairings first try the rules.  Each pairing's tuple of
# rule objects (names.FX_RULES, onnx_pairing.ONNX_RULES, same_model.SAME_MODEL_RULES,
# deployed.DEPLOYED_RULES) says what runs in which order.
RULES: tuple[type[PairingStep], ...] = (
    NameRule,
    StateDictRule,
    MetadataRule,
    StructureRule,
    PositionRule,
    RenamedRule,
    DequantizedRule,
)
_BY_NAME = {r.name: r for r in RULES}

# the names of the rules, for code and tests that spell a paired_by value
PAIRED_BY_NAME = NameRule.name
PAIRED_BY_STATE_DICT = StateDictRule.name
PAIRED_BY_METADATA = MetadataRule.name
PAIRED_BY_STRUCTURE = StructureRule.name
PAIRED_BY_POSITION = PositionRule.name
PAIRED_BY_RENAMED = RenamedRule.name
PAIRED_BY_DEQUANTIZED = DequantizedRule.name


def rule(name: str) -> type[PairingStep]:
    """The rule a ``Record.paired_by`` names (KeyError: no rule has that name)."""
    return _BY_NAME[name]


def rule_names() -> frozenset[str]:
    """Every value ``Record.paired_by`` takes for a paired value."""
    return frozenset(_BY_NAME)


def proven_rules() -> frozenset[str]:
    """The rules whose pairs are the same value by construction."""
    return frozenset(r.name for r in RULES if r.strength == PROVEN)


def linking_rules() -> frozenset[str]:
    """The rules whose pairs are evidence that the two sides are one program."""
    return frozenset(r.name for r in RULES if r.links_models)


def caveat(paired_by: str | None) -> str | None:
    """What a culprit's why says of a pair made by rule ``paired_by`` (None: nothing, or
    no such rule)."""
    found = _BY_NAME.get(paired_by or "")
    return None if found is None else found.caveat


__all__ = [
    "GUESS",
    "DequantizedRule",
    "PAIRED_BY_DEQUANTIZED",
    "PAIRED_BY_METADATA",
    "PAIRED_BY_NAME",
    "PAIRED_BY_POSITION",
    "PAIRED_BY_RENAMED",
    "PAIRED_BY_STATE_DICT",
    "PAIRED_BY_STRUCTURE",
    "PROVEN",
    "PairingStep",
    "RULES",
    "MetadataRule",
    "NameRule",
    "PositionRule",
    "RenamedRule",
    "StateDictRule",
    "StructureRule",
    "caveat",
    "linking_rules",
    "proven_rules",
    "rule",
    "rule_names",
]
