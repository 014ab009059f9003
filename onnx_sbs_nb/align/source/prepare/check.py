"""Checks a reproduced preparation against what the ONNX model says was lowered.

The dynamo exporter writes, on every ONNX node, the fx node of the prepared program it
lowers (``pkg.torch.onnx.fx_node``: that node as ``Node.format_node()`` printed it).
A reproduction of the preparation is used only when every such node exists in it, under
the same name, with the same target and arguments; and when the values the ONNX model
names after fx nodes without saying which node made them (folded constants, graph
outputs) have, in it, the dtype and shape the model declares.
"""

from __future__ import annotations

import hashlib
import re
from array import array
from typing import Any

import onnx
import torch

from ....dtypes import ONNX_TO_TORCH
from ..fx_metadata import FxMetadata

_USERS = re.compile(r"\[num_users=\d+\] ")


def _normal(text: str) -> str:
    # the number of users says nothing about the node itself
    return _USERS.sub("", text.strip())


# the latest structures digested, as the bytes hashed, with their digests: sha256 is a
# third of the digest's cost, comparing the bytes with these a hundredth (a memcmp)
_DIGESTED: list[tuple[bytes, str]] = []
_DIGESTED_KEPT = 4
_DIGESTED_MAX_BYTES = 16 << 20


def structure_digest(model: onnx.ModelProto) -> str:
    """A digest of the model's structure: nodes (whole: attributes, subgraphs and
    constants' tensors included), declared values, initializers' names, types, shapes and
    metadata; not the weights' values.  It covers what :func:`disagreement`, pairing and
    the one-node session keys read, so their results can be reused for a model with the
    same digest without holding on to the model (a Constant changed in place makes
    another digest, and so another session).  It is taken on every run: each message
    serialized in one call, the lengths packed in one array, one hash (sha256 runs on
    the CPU's hash instructions), skipped for the bytes of a structure digested lately."""
    g = model.graph
    nodes = [m.SerializeToString() for m in g.node]
    declared = [m.SerializeToString() for m in (*g.input, *g.output, *g.value_info)]
    names: list[str] = []
    for i in g.initializer:
        names += (i.name, str(i.data_type), str(list(i.dims)))
        for p in i.metadata_props:
            names += (p.key, p.value)
        names.append("\2")
    # every message's length first, in one array: no two splits hash alike
    lengths = array("Q", [len(nodes), len(declared), *map(len, nodes), *map(len, declared)])
    text = b"".join([lengths.tobytes(), *nodes, *declared, "\0".join(names).encode()])
    # the same bytes digested before (a warm run): a memcmp, not the hash again
    for kept, digest in _DIGESTED:
        if kept == text:
            return digest
    digest = hashlib.sha256(text).hexdigest()[:40]
    if len(text) <= _DIGESTED_MAX_BYTES:
        if len(_DIGESTED) >= _DIGESTED_KEPT:
            _DIGESTED.pop(0)  # the oldest
        _DIGESTED.append((text, digest))
    return digest


# values _format_arg prints as str(value): what fx arguments mostly are
_PLAIN_ARGS = frozenset(
    {
        int,
        float,
        bool,
        str,
        type(None),
        torch.dtype,
        torch.device,
        torch.layout,
        torch.memory_format,
    }
)


def _fast_arg(arg: Any) -> str | None:
    """``torch.fx.node._format_arg(arg)`` for plain arguments (nodes, numbers, strings,
    dtypes and containers of them); None for anything else."""
    t = type(arg)
    if t in _PLAIN_ARGS:
        return str(arg)
    if t is torch.fx.Node:
        return "%" + str(arg)
    if hasattr(arg, "_custom_fx_repr_fn"):
        return None
    if isinstance(arg, tuple | list):
        items = [_fast_arg(a) for a in arg]
        if None in items:
            return None
        if isinstance(arg, list):
            return f"[{', '.join(items)}]"
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    if isinstance(arg, dict):
        parts = []
        for k, v in arg.items():
            text = _fast_arg(v)
            if text is None:
                return None
            parts.append(f"{k}: {text}")
        return f"{{{', '.join(parts)}}}"
    return None


class NodePrinter:
    """``node.format_node()`` of call_function nodes, several times faster: each target
    printed once, plain arguments printed here.  It is checked against ``format_node``
    on the first node it prints; a torch that prints otherwise gets ``format_node``."""

    def __init__(self) -> None:
        self._targets: dict[Any, str] = {}
        self._trusted: bool | None = None

    def __call__(self, node: torch.fx.Node) -> str:
        if self._trusted is False or node.op != "call_function" or node.type is not None:
            return node.format_node()
        try:
            text = self._fast(node)
        except Exception:
            text = None
        if text is None:
            return node.format_node()
        if self._trusted is None:
            reference = node.format_node()
            self._trusted = text == reference
            return reference
        return text

    def _fast(self, node: torch.fx.Node) -> str | None:
        target = self._targets.get(node.target)
        if target is None:
            target = self._targets[node.target] = torch.fx.Node._pretty_print_target(node.target)
        args, kwargs = _fast_arg(node.args), _fast_arg(node.kwargs)
        if args is None or kwargs is None:
            return None
        return (
            f"%{node.name} : [num_users={len(node.users)}] = call_function[target={target}]"
            f"(args = {args}, kwargs = {kwargs})"
        )


def disagreement(
    program: torch.export.ExportedProgram,
    model: onnx.ModelProto,
    metadata: FxMetadata | None = None,
) -> str | None:
    """The first way ``program`` is not the one ``model`` was lowered from, or None.

    A model that names no fx node cannot vouch for anything: that is a disagreement.
    ``metadata``: the model's :class:`.names.FxMetadata`, when the caller reads it too.
    """
    nodes = {n.name: n for n in program.graph.nodes}
    checked = 0
    formatted: dict[str, str] = {}
    node_text = NodePrinter()
    metadata = metadata or FxMetadata(model)
    for k, (text, name) in enumerate(zip(metadata.texts, metadata.names)):
        if text is None:
            continue
        if name is None:
            return f"ONNX node {model.graph.node[k].name!r} names no fx node ({text[:80]!r})"
        node = nodes.get(name)
        if node is None:
            lowering = model.graph.node[k].name
            return f"fx node {name!r} (lowered by ONNX node {lowering!r}) is missing"
        mine = formatted.get(name)
        if mine is None:
            mine = formatted[name] = node_text(node)
        # equal texts need no normalizing (most do: same node, same number of users)
        if mine != text and _normal(mine) != _normal(text):
            return f"fx node {name!r} differs: {_normal(mine)!r} vs {_normal(text)!r}"
        checked += 1
    if checked == 0:
        return "the ONNX model carries no fx node metadata to check against"
    g = model.graph
    declared = [(i.name, i.data_type, list(i.dims)) for i in g.initializer]
    for vi in g.output:
        tt = vi.type.tensor_type
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            declared.append((vi.name, tt.elem_type, [d.dim_value for d in tt.shape.dim]))
    for name, elem, dims in declared:
        node = nodes.get(name)
        if node is None or node.op != "call_function":
            continue
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        dtype = ONNX_TO_TORCH.get(elem)
        if (dtype is not None and dtype != val.dtype) or list(val.shape) != dims:
            return (
                f"ONNX value {name!r} is {dims} {dtype} but fx node {name!r} is "
                f"{list(val.shape)} {val.dtype}"
            )
    return None


def agreeing_nodes(
    program: torch.export.ExportedProgram,
    model: onnx.ModelProto,
    metadata: FxMetadata | None = None,
) -> set[str]:
    """The fx nodes of ``program`` that the ONNX model's metadata describes exactly (same
    name, target and arguments): the values a program that is not the exporter's own
    may still be paired by."""
    nodes = {n.name: n for n in program.graph.nodes}
    agree: set[str] = set()
    seen: set[str] = set()
    node_text = NodePrinter()
    metadata = metadata or FxMetadata(model)
    for text, name in zip(metadata.texts, metadata.names):
        if name is None or name in seen:
            continue
        seen.add(name)
        node = nodes.get(name)
        if node is not None:
            mine = node_text(node)
            if mine == text or _normal(mine) == _normal(text):
                agree.add(name)
    return agree
