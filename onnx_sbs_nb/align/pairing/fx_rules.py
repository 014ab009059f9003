"""The fx-to-ONNX rules that read the exporter's metadata and the program's weights:
a weight the exporter folded (``weight.T`` of a linear), the last value of the ONNX nodes
an fx node's metadata names, the outputs of a multi-output fx node, the parts of a split.
They run in :data:`.names.FX_RULES`."""

from __future__ import annotations

from typing import Any

import onnx
import torch

from .context import FxPairingContext
from .lowered_by import fx_of_paired, lowering_of_nodes
from .pairs import Pairing
from .rules import MetadataRule, PositionRule, StateDictRule
from .values import (
    TRANSFORM_PERMUTE,
    TRANSFORM_TRANSPOSE,
    fx_value_shape,
    fx_value_type,
    types_compatible,
    value_transform,
)


def _multiplies_as_stored(node: onnx.NodeProto, name: str) -> bool:
    """``node`` multiplies by initializer ``name`` as it is stored (not transposed): a
    MatMul, or a Gemm / FusedMatMul whose B it is, without transB."""
    if node.op_type == "MatMul":
        return True
    if node.op_type in ("Gemm", "FusedMatMul") and len(node.input) > 1 and node.input[1] == name:
        return not any(a.name == "transB" and a.i for a in node.attribute)
    return False


class FoldedWeights(StateDictRule):
    """An initializer consumed by the lowering of an fx node whose weight argument has as
    many elements pairs with that weight (through a transposition when it is one).
    ``by_pairs``: a node's fx node is also found from the pairs (:func:`fx_of_paired`),
    for a graph tool that dropped the metadata."""

    def __init__(self, by_pairs: bool = False):
        self.by_pairs = by_pairs

    def run(self, ctx: FxPairingContext) -> None:
        g, fx_nodes, initializers = ctx.graph, ctx.fx_nodes, ctx.initializers
        weights, pairing, try_pair = ctx.weights, ctx.pairing, ctx.try_pair
        fx_of = fx_of_paired(g, ctx.fx_of, pairing) if self.by_pairs else ctx.fx_of
        for node, fx_name in zip(g.node, fx_of):
            unpaired = [i for i in node.input if i in initializers and i not in pairing.by_onnx]
            if not unpaired:
                continue
            fx_node = fx_nodes.get(fx_name) if fx_name else None
            if fx_node is None:
                continue
            weight_args = [a for a in fx_node.all_input_nodes if a.name in weights]
            for inp in unpaired:
                if inp in pairing.by_onnx:
                    continue
                dims = list(initializers[inp].dims)
                numel = 1
                for d in dims:
                    numel *= d
                cands = []
                for w in weight_args:
                    val = w.meta.get("val")
                    if isinstance(val, torch.Tensor) and val.numel() == numel and numel > 1:
                        cands.append((w, list(val.shape)))
                if len(cands) != 1:
                    continue
                w, shape = cands[0]
                # a linear lowered to MatMul multiplies by weight.T, folded into the initializer;
                # a square one can only be told by its consumer (onnxruntime's MatMulAddFusion
                # makes that MatMul a Gemm, which multiplies by B as stored unless transB)
                transposed = (
                    len(dims) == 2
                    and shape == dims[::-1]
                    and (
                        shape != dims
                        or (_multiplies_as_stored(node, inp) and "linear" in str(fx_node.target))
                    )
                )
                if transposed:
                    try_pair(inp, w.name, StateDictRule.name, TRANSFORM_TRANSPOSE)
                elif shape == dims:
                    try_pair(inp, w.name, StateDictRule.name)


def _tail_fused(node, fx: torch.fx.Node | None, fused: dict, pairing: Pairing) -> bool:
    """Whether a fused node reading ``node``'s value also reads an operand of the fx node
    (onnxruntime's SkipLayerNormalization taking a linear's bias): the tail of the fx
    node's lowering went into the fusion, and the value is not the fx node's."""
    if fx is None:
        return False
    operands = {a.name for a in fx.all_input_nodes}
    for o in node.output:
        for reader in fused.get(o, ()):
            for i in reader.input:
                p = pairing.by_onnx.get(i)
                if p is not None and p.fx_name in operands and i not in node.input:
                    return True
    return False


class ByMetadata(MetadataRule):
    """An fx node not paired by name pairs with the last output of the last ONNX node
    whose metadata names it, when the declared type and shape agree."""

    def run(self, ctx: FxPairingContext) -> None:
        fx_nodes, pairing = ctx.fx_nodes, ctx.pairing
        onnx_types, onnx_shapes = ctx.onnx_types, ctx.onnx_shapes
        last_by_fx: dict[str, onnx.NodeProto] = {}
        fused: dict[str, list[onnx.NodeProto]] = {}  # value -> fused nodes reading it
        for node, fx_name in zip(ctx.graph.node, ctx.fx_of):
            if fx_name:
                last_by_fx[fx_name] = node
            elif node.domain not in ("", "ai.onnx"):
                for i in node.input:
                    fused.setdefault(i, []).append(node)
        for fx_name, node in last_by_fx.items():
            if fused and _tail_fused(node, fx_nodes.get(fx_name), fused, pairing):
                continue
            if fx_name in pairing.by_fx or fx_name not in fx_nodes:
                continue
            fx_type = fx_value_type(fx_nodes[fx_name])
            if fx_type is None:
                continue
            candidates = [
                o
                for o in node.output
                if o
                and o not in pairing.by_onnx
                and o in onnx_types
                and value_transform(fx_nodes[fx_name], onnx_types[o], onnx_shapes.get(o))
            ]
            if not candidates and len(node.output) == 1 and node.output[0] not in pairing.by_onnx:
                candidates = [node.output[0]] if node.output[0] not in onnx_types else []
            if candidates:
                ctx.try_pair(candidates[-1], fx_name, MetadataRule.name)


def _unique_permutation(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[int, ...] | None:
    """The one permutation p with dst == src[p] (None: none, several, or the identity)."""
    if len(src) != len(dst) or sorted(src) != sorted(dst) or len(set(src)) != len(src):
        return None
    perm = tuple(src.index(d) for d in dst)
    return None if perm == tuple(range(len(src))) else perm


# fx target -> whether it takes one output of a multi-output node: pairing asks for every
# fx node, and printing an op overload costs a microsecond or two
_GETITEM_TARGETS: dict[Any, bool] = {}


def _is_getitem(node: torch.fx.Node) -> bool:
    """Whether ``node`` takes one output of a multi-output fx node."""
    if node.op != "call_function":
        return False
    target = node.target
    try:
        found = _GETITEM_TARGETS.get(target)
    except TypeError:  # an unhashable target
        return "getitem" in str(target)
    if found is None:
        found = "getitem" in str(target)
        if len(_GETITEM_TARGETS) < 4096:
            _GETITEM_TARGETS[target] = found
    return found


class GetitemOutputs(MetadataRule):
    """The outputs of a multi-output fx node (an LSTM, a Split): its ``getitem`` users
    pair with the values its lowering hands to other nodes, when their declared type and
    shape single one out (through a permutation of the axes when an optimizer merged the
    transposes around the lowering)."""

    def run(self, ctx: FxPairingContext) -> None:
        g, fx_of, fx_nodes, pairing = ctx.graph, ctx.fx_of, ctx.fx_nodes, ctx.pairing
        onnx_types, onnx_shapes, try_pair = ctx.onnx_types, ctx.onnx_shapes, ctx.try_pair
        # only the lowerings of multi-output fx nodes matter: most programs have few or none,
        # and the walk below reads every ONNX node
        sources = {
            u.args[0].name
            for u in fx_nodes.values()
            if _is_getitem(u) and u.args and isinstance(u.args[0], torch.fx.Node)
        }
        if not sources.intersection(fx_of):
            return
        nodes = list(g.node)
        producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
        lowering = lowering_of_nodes(nodes, producer, fx_of)
        consumers: dict[str, set[int]] = {}
        for k, n in enumerate(nodes):
            for i in n.input:
                consumers.setdefault(i, set()).add(k)
        outputs = {o.name for o in g.output}
        handed_on: dict[str, list[str]] = {}  # fx node -> values its lowering hands on
        for k, n in enumerate(nodes):
            group = lowering[k]
            if group is None:
                continue
            for o in n.output:
                if not o or o in pairing.by_onnx:
                    continue
                outside = any(lowering[c] != group for c in consumers.get(o, ())) or o in outputs
                if outside:
                    handed_on.setdefault(group, []).append(o)
        for group, values in handed_on.items():
            source = fx_nodes.get(group)
            if source is None:
                continue
            getitems = [
                u
                for u in source.users
                if _is_getitem(u) and u.name not in pairing.by_fx and fx_value_type(u) is not None
            ]
            for u in getitems:
                ftype, fshape = fx_value_type(u), fx_value_shape(u)
                if fshape is None or None in fshape:
                    continue
                typed = [
                    v
                    for v in values
                    if v not in pairing.by_onnx
                    and v in onnx_types
                    and types_compatible(ftype, onnx_types[v])
                    and None not in onnx_shapes.get(v, (None,))
                ]
                same = [v for v in typed if onnx_shapes[v] == fshape]
                if len(same) == 1:
                    try_pair(same[0], u.name, MetadataRule.name)
                    continue
                if len(same) > 1:
                    # equal parts (chunk, split into equal sizes): one Split makes them all, in
                    # the order torch returns them, so the getitem's index names its output
                    v = _split_output(nodes, producer, same, u.args[1] if len(u.args) > 1 else None)
                    if v is not None:
                        try_pair(v, u.name, MetadataRule.name)
                    continue
                # Optimizers merge the transposes around RNN lowerings into their neighbours,
                # so the value handed on may be the getitem with its axes permuted: pair it
                # when one value and one permutation single it out, compared through it.
                permuted = [(v, _unique_permutation(fshape, onnx_shapes[v])) for v in typed]
                permuted = [(v, p) for v, p in permuted if p is not None]
                if len(permuted) == 1 and not same:
                    v, perm = permuted[0]
                    if try_pair(v, u.name, MetadataRule.name, TRANSFORM_PERMUTE):
                        pairing.by_onnx[v].perm = perm


def _split_output(nodes, producer, candidates: list[str], index: Any) -> str | None:
    """The output at ``index`` of the one Split node making every candidate, or None."""
    makers = {producer.get(v) for v in candidates}
    if len(makers) != 1 or None in makers or not isinstance(index, int):
        return None
    node = nodes[makers.pop()]
    outputs = list(node.output)
    if node.op_type != "Split" or node.domain not in ("", "ai.onnx"):
        return None
    if index < 0:
        index += len(outputs)
    if not 0 <= index < len(outputs) or outputs[index] not in candidates:
        return None
    return outputs[index]


_SPLITS = ("aten.split.Tensor", "aten.split_with_sizes.default", "aten.unsafe_split.Tensor")


class SplitParts(PositionRule):
    """Pairs the getitems of an fx split with the outputs of the ONNX Split of the same
    tensor (its input paired with the split's) along the same axis, part by part: the
    optimizer rewrites a split's lowering into one Split node and drops its metadata, and
    equal parts (``chunk``) cannot be told apart by shape."""

    def run(self, ctx: FxPairingContext) -> None:
        g, fx_nodes, pairing = ctx.graph, ctx.fx_nodes, ctx.pairing
        onnx_types, onnx_shapes, try_pair = ctx.onnx_types, ctx.onnx_shapes, ctx.try_pair
        # the split tensor's fx name -> {split node name -> {index -> getitem}}
        splits: dict[str, dict[str, dict[Any, torch.fx.Node]]] = {}
        for u in fx_nodes.values():
            if _is_getitem(u) and u.name not in pairing.by_fx and len(u.args) > 1:
                src = u.args[0]
                if isinstance(src, torch.fx.Node) and str(src.target) in _SPLITS and src.args:
                    split_of = getattr(src.args[0], "name", None)
                    splits.setdefault(split_of, {}).setdefault(src.name, {})[u.args[1]] = u
        if not splits:
            return
        for n in g.node:
            if n.op_type != "Split" or n.domain not in ("", "ai.onnx") or not n.input:
                continue
            data = pairing.by_onnx.get(n.input[0])
            if data is None or data.transform is not None or data.fx_name not in splits:
                continue
            for name, parts in splits[data.fx_name].items():
                src = fx_nodes[name]
                if not _same_split_axis(src, n, onnx_shapes.get(n.input[0])):
                    continue
                outputs = list(n.output)
                for index, u in parts.items():
                    if not isinstance(index, int) or not -len(outputs) <= index < len(outputs):
                        continue
                    v = outputs[index]
                    shape = fx_value_shape(u)
                    ftype = fx_value_type(u)
                    if (
                        v
                        and shape is not None
                        and onnx_shapes.get(v) == shape
                        and ftype is not None
                        and v in onnx_types
                        and types_compatible(ftype, onnx_types[v])
                    ):
                        try_pair(v, u.name, PositionRule.name)


def _same_split_axis(src: torch.fx.Node, node: onnx.NodeProto, shape) -> bool:
    dim = src.args[2] if len(src.args) > 2 else src.kwargs.get("dim", 0)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
    if not isinstance(dim, int):
        return False
    if dim < 0 or axis < 0:
        if shape is None:
            return False
        dim, axis = dim % len(shape), axis % len(shape)
    return dim == axis


__all__ = ["ByMetadata", "FoldedWeights", "GetitemOutputs", "SplitParts"]
