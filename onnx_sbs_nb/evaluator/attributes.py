"""Which attributes a node may carry: checked when the evaluator is built, not at run time.

An attribute name is known when:

- the ONNX schema of the op defines it at the opset the model imports (onnxruntime and
  the ONNX checker reject any other, "Unrecognized attribute");
- or a built-in kernel has a keyword parameter naming an attribute the op has in some
  opset (one kernel may serve several opsets, and implement what a later one added);
- or, for a custom kernel, its signature takes it: a custom kernel accepts what it
  accepts, anything with ``**kwargs``.

A node calling a local function may carry any attribute, as in onnxruntime: the function
reads those it declares.

An attribute the schema defines that a built-in kernel with a closed signature does not
take (one a newer opset added to an op whose kernel predates it) is not passed to it,
and a warning says that the result may differ from the spec's.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import onnx

# a memory hint of opsets < 6 with no effect on results: never passed to a kernel
IGNORED = frozenset({"consumed_inputs"})

Implementation = Literal["builtin", "custom", "function"]


class UnknownAttributeError(ValueError):
    """A node carries an attribute that neither the ONNX spec of its op nor its kernel
    knows: the message names the node, its op and domain, the attribute and the
    attributes the op accepts."""


@dataclass(frozen=True)
class AttributeRule:
    """What one op accepts as implemented: ``accepted`` (None: anything), and the names
    the schema defines that the kernel does not take (``dropped``)."""

    kind: Implementation
    accepted: frozenset[str] | None
    dropped: frozenset[str] = frozenset()

    def unknown(self, names: Iterable[str]) -> list[str]:
        if self.accepted is None:
            return []
        return [n for n in names if n not in self.accepted and n not in IGNORED]


def kernel_keywords(fn: Callable[..., Any]) -> frozenset[str] | None:
    """The keyword names a kernel takes, None when it takes any (``**kwargs``, or a
    signature that cannot be read, as for C functions). A wrapper taking ``**kwargs``
    may declare the names it accepts as ``fn.onnx_attributes``."""
    declared = getattr(fn, "onnx_attributes", None)
    if declared is not None:
        return frozenset(declared)
    try:
        sig = inspect.signature(fn)  # follows functools.wraps and partial
    except (TypeError, ValueError):
        return None
    params = sig.parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return frozenset(p.name for p in params if p.kind in kinds) - {"ctx"}


def attribute_rule(
    kind: Implementation, domain: str, op_type: str, version: int | None, kernel: Any
) -> AttributeRule:
    """The rule of an op at an opset as implemented by ``kernel``."""
    try:
        return _rule(kind, domain, op_type, version, kernel)
    except TypeError:  # an unhashable custom kernel
        return _rule.__wrapped__(kind, domain, op_type, version, kernel)


@functools.lru_cache(maxsize=4096)
def _rule(kind, domain, op_type, version, kernel) -> AttributeRule:
    if kind == "function":
        return AttributeRule(kind, None)
    keywords = kernel_keywords(kernel)
    if kind == "custom":
        return AttributeRule(kind, keywords)
    schema = _schema(domain, op_type, version)
    if schema is None:
        return AttributeRule(kind, keywords)
    # a keyword counts when it names an attribute of the op (not an input, nor a
    # parameter of the torch function that happens to be the kernel)
    own = frozenset()
    if keywords:
        inputs = {i.name for i in schema.inputs}
        own = (keywords - inputs - IGNORED) & _op_attribute_names(domain, op_type)
    if keywords is None:
        return AttributeRule(kind, frozenset(schema.attributes) | own)
    dropped = frozenset(schema.attributes) - keywords - IGNORED
    return AttributeRule(kind, frozenset(schema.attributes) | own, dropped)


def _schema(domain: str, op_type: str, version: int | None) -> onnx.defs.OpSchema | None:
    try:
        if version is None:
            return onnx.defs.get_schema(op_type, domain)
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


@functools.lru_cache(maxsize=1024)
def _op_attribute_names(domain: str, op_type: str) -> frozenset[str]:
    """Every attribute name the op has in some opset."""
    names: set[str] = set()
    schema = _schema(domain, op_type, None)
    while schema is not None:
        names.update(schema.attributes)
        older = schema.since_version - 1
        schema = _schema(domain, op_type, older) if older >= 1 else None
    return frozenset(names)


def unknown_attributes(
    node: onnx.NodeProto, domain: str, version: int | None, rule: AttributeRule
) -> str | None:
    """What is wrong with the node's attributes under ``rule`` (None: nothing)."""
    unknown = rule.unknown(a.name for a in node.attribute)
    if not unknown:
        return None
    where = f"node {node.name!r} ({domain or 'ai.onnx'}::{node.op_type}, opset {version})"
    known = sorted(rule.accepted or ()) or "none"
    if rule.kind == "custom":
        return (
            f"{where} has attribute(s) {unknown} that its custom kernel does not take "
            f"(its keywords: {known}): add them as parameters of the kernel, or **kwargs"
        )
    return (
        f"{where} has unknown attribute(s) {unknown}; the op's attributes are {known}. "
        "The model is invalid (onnx.checker and onnxruntime reject it too)"
    )


def without_dropped(
    node: onnx.NodeProto, attrs: dict[str, Any], rule: AttributeRule
) -> dict[str, Any]:
    """``attrs`` without those the kernel does not take, with a warning."""
    dropped = sorted(rule.dropped & attrs.keys())
    if not dropped:
        return attrs
    warnings.warn(
        f"node {node.name!r} ({node.domain or 'ai.onnx'}::{node.op_type}): the torch kernel "
        f"does not implement attribute(s) {dropped} and ignores them; its result may differ "
        "from the spec's",
        stacklevel=3,
    )
    return {k: v for k, v in attrs.items() if k not in rule.dropped}
