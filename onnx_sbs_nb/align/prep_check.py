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

import onnx
import torch

from ..dtypes import ONNX_TO_TORCH
from .names import FX_NODE_KEY

_USERS = re.compile(r"\[num_users=\d+\] ")
_NAME = re.compile(r"^%([^\s:]+)\s*:")


def _normal(text: str) -> str:
    # the number of users says nothing about the node itself
    return _USERS.sub("", text.strip())


def structure_digest(model: onnx.ModelProto) -> str:
    """A digest of the model's structure: nodes (whole: attributes, subgraphs and
    constants' tensors included), declared values, initializers' names, types, shapes and
    metadata; not the weights' values.  It covers what :func:`disagreement`, pairing and
    the one-node session keys read, so their results can be reused for a model with the
    same digest without holding on to the model (a Constant changed in place makes
    another digest, and so another session).  It is taken on every run: each message
    serialized in one call, the lengths packed in one array, one hash (sha256 runs on
    the CPU's hash instructions)."""
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
    h = hashlib.sha256(lengths.tobytes())
    h.update(b"".join(nodes))
    h.update(b"".join(declared))
    h.update("\0".join(names).encode())
    return h.hexdigest()[:40]


def disagreement(program: torch.export.ExportedProgram, model: onnx.ModelProto) -> str | None:
    """The first way ``program`` is not the one ``model`` was lowered from, or None.

    A model that names no fx node cannot vouch for anything: that is a disagreement.
    """
    nodes = {n.name: n for n in program.graph.nodes}
    checked = 0
    formatted: dict[str, str] = {}
    for onnx_node in model.graph.node:
        text = next((p.value for p in onnx_node.metadata_props if p.key == FX_NODE_KEY), None)
        if text is None:
            continue
        m = _NAME.match(text)
        if m is None:
            return f"ONNX node {onnx_node.name!r} names no fx node ({text[:80]!r})"
        name = m.group(1)
        node = nodes.get(name)
        if node is None:
            return f"fx node {name!r} (lowered by ONNX node {onnx_node.name!r}) is missing"
        mine = formatted.get(name)
        if mine is None:
            mine = formatted[name] = node.format_node()
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


def agreeing_nodes(program: torch.export.ExportedProgram, model: onnx.ModelProto) -> set[str]:
    """The fx nodes of ``program`` that the ONNX model's metadata describes exactly (same
    name, target and arguments): the values a program that is not the exporter's own
    may still be paired by."""
    nodes = {n.name: n for n in program.graph.nodes}
    agree: set[str] = set()
    seen: set[str] = set()
    for onnx_node in model.graph.node:
        text = next((p.value for p in onnx_node.metadata_props if p.key == FX_NODE_KEY), None)
        m = _NAME.match(text) if text else None
        if m is None or m.group(1) in seen:
            continue
        name = m.group(1)
        seen.add(name)
        node = nodes.get(name)
        if node is not None:
            mine = node.format_node()
            if mine == text or _normal(mine) == _normal(text):
                agree.add(name)
    return agree
