"""Pairing values of the fx graph with values of the ONNX graph.

The rules are the classes of :data:`FX_RULES`, run in that order on one
:class:`FxPairingContext` (each record's ``paired_by`` is the name of the rule that
paired it; each rule's strength is declared in :mod:`.rules`):

1. ``name`` (:class:`.SameName`): the ONNX value carries the fx node's name (the dynamo
   exporter names the value that implements an fx node after it);
2. ``state_dict`` (:class:`.StateDictName`, :class:`FoldedWeights`): an initializer named
   after a parameter, buffer or constant, or one whose ``pkg.torch.onnx.original_node_name``
   says so; an initializer consumed by the ONNX node of an fx node whose weight argument
   has the same number of elements (the exporter folds ``weight.T`` of a linear into a new
   initializer) pairs with that weight, compared through the same transposition;
3. ``metadata`` (:class:`ByMetadata`): an fx node not paired by name pairs with the last
   output of the ONNX nodes that carry it in ``pkg.torch.onnx.fx_node`` whose declared
   type matches;
4. ``metadata`` again (:class:`GetitemOutputs`), for the outputs of a multi-output fx node
   (an LSTM, a Split); ``position`` (:class:`SplitParts`) for the parts of a split whose
   lowering lost its metadata;
5. ``structure`` (:class:`AroundPaired`): the values around paired ones, for a graph tool
   that dropped the metadata or renamed values;
6. ``position`` (:class:`.ByPosition`): graph inputs and outputs left over pair by
   position;
7. ``structure`` (:class:`.foreign.CorrespondingOps`), for a model without any exporter
   metadata (the TorchScript exporter's, another converter's): node by node, each value
   with the fx value of the same frontier, dtype and shape whose lowering its op ends.

A pair is only made between values whose declared element type, rank and known
dimensions agree; a pair made from metadata or position that the actual shapes then
disprove is dropped at run time (not the same value), so a pairing is never the cause
of a shape mismatch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import onnx
import torch

from ...dtypes import ONNX_TO_TORCH
from ...records import (
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    KIND_WEIGHT,
    PAIRED_BY_METADATA,
    PAIRED_BY_NAME,
    PAIRED_BY_POSITION,
    PAIRED_BY_STATE_DICT,
    PAIRED_BY_STRUCTURE,
)
from ..source.fx_metadata import FxMetadata, fx_name_from_metadata
from .basic_rules import ByPosition, OutputFixAliases, SameName, StateDictName
from .context import PairingContext, PairingStep, run_rules
from .foreign import CorrespondingOps, sizes_to_first_reader
from .pairs import Pair, Pairing
from .rules import rule

TRANSFORM_TRANSPOSE = "transpose"
# the ONNX value is the fx value with size-1 axes removed or added (onnxsim and other graph
# tools squeeze a batch of one away): Pair.squeeze holds (fx axes, ONNX axes) of size 1
TRANSFORM_RESHAPE = "reshape"
TRANSFORM_PERMUTE = "permute"  # the ONNX value is the fx value with its axes permuted (perm)
# the ONNX value is the complex fx value as real pairs: ONNX has no complex arithmetic, so
# the exporter computes torch.fft and complex products on [..., 2] tensors
TRANSFORM_AS_REAL = "as_real"
# the ONNX value is the fx value in another float type (a model converted to float16 or
# bfloat16 computes in it): compared in the coarser type, fed to the model cast to it
TRANSFORM_CAST = "cast"
_FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
_REAL_OF_COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def lowering_of_nodes(
    nodes: list[onnx.NodeProto],
    producer: dict[str, int],
    fx_names: list[str | None] | None = None,
) -> list[str | None]:
    """The fx node each ONNX node lowers: its ``pkg.torch.onnx.fx_node`` metadata, else
    (a node an optimizer added, a Cast say) the lowering of the node producing its first
    computed input, so the unit of blame stays the lowering of one fx node.  ``fx_names``:
    each node's metadata, when the caller has read it already."""
    if fx_names is None:
        fx_names = [fx_name_from_metadata(n) for n in nodes]
    groups: list[str | None] = []
    for k, node in enumerate(nodes):
        group = fx_names[k]
        if group is None:
            for name in node.input:
                p = producer.get(name)
                if p is not None and p < k and groups[p] is not None:
                    group = groups[p]
                    break
        groups.append(group)
    return groups


def onnx_value_types(model: onnx.ModelProto) -> dict[str, tuple[int, int | None]]:
    """Declared (elem_type, rank or None) of every typed value in the main graph."""
    return onnx_value_types_and_shapes(model)[0]


def onnx_value_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Declared shapes of the main graph's values (None for a dimension not known)."""
    return onnx_value_types_and_shapes(model)[1]


def onnx_value_types_and_shapes(
    model: onnx.ModelProto,
) -> tuple[dict[str, tuple[int, int | None]], dict[str, tuple[int | None, ...]]]:
    """:func:`onnx_value_types` and :func:`onnx_value_shapes` in one reading of the
    graph (each protobuf field read from Python makes an object)."""
    types: dict[str, tuple[int, int | None]] = {}
    shapes: dict[str, tuple[int | None, ...]] = {}
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        vt = vi.type
        if not vt.HasField("tensor_type"):
            continue
        tt = vt.tensor_type
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
            shapes[vi.name] = shape
            if tt.elem_type:
                types[vi.name] = (tt.elem_type, len(shape))
        elif tt.elem_type:
            types[vi.name] = (tt.elem_type, None)
    for init in g.initializer:
        dims = tuple(int(d) for d in init.dims)
        types[init.name] = (init.data_type, len(dims))
        shapes[init.name] = dims
    return types, shapes


def fx_value_shape(node: torch.fx.Node) -> tuple[int | None, ...] | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return tuple(d if isinstance(d, int) else None for d in val.shape)
    return None


def shapes_compatible(a: tuple | None, b: tuple | None) -> bool:
    """False only when both shapes are known and a known dimension differs."""
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return False
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def fx_value_type(node: torch.fx.Node) -> tuple[torch.dtype, int] | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype, val.dim()
    return None


def types_compatible(fx_type: tuple[torch.dtype, int] | None, onnx_type: Any) -> bool:
    """False only when both types are known and disagree."""
    if fx_type is None or onnx_type is None:
        return True
    elem, rank = onnx_type
    dtype = ONNX_TO_TORCH.get(elem)
    if dtype is not None and dtype != fx_type[0]:
        return False
    return rank is None or rank == fx_type[1]


def as_real_compatible(node: torch.fx.Node, onnx_type: Any, onnx_shape: tuple | None) -> bool:
    """Whether a complex fx value may be the ONNX value holding its real pairs."""
    fx_type = fx_value_type(node)
    if fx_type is None or fx_type[0] not in _REAL_OF_COMPLEX or onnx_type is None:
        return False
    elem, rank = onnx_type
    if ONNX_TO_TORCH.get(elem) != _REAL_OF_COMPLEX[fx_type[0]]:
        return False
    if rank is not None and rank != fx_type[1] + 1:
        return False
    if onnx_shape is not None and onnx_shape and onnx_shape[-1] not in (None, 2):
        return False
    shape = fx_value_shape(node)
    return shapes_compatible(None if shape is None else (*shape, 2), onnx_shape)


def value_transform(node: torch.fx.Node, onnx_type: Any, onnx_shape: tuple | None) -> str | bool:
    """How the fx value of ``node`` may be the ONNX value of that type and shape: ``True``
    as it is, :data:`TRANSFORM_AS_REAL` as its real pairs, ``False`` not at all."""
    if types_compatible(fx_value_type(node), onnx_type) and shapes_compatible(
        fx_value_shape(node), onnx_shape
    ):
        return True
    return TRANSFORM_AS_REAL if as_real_compatible(node, onnx_type, onnx_shape) else False


def size_one_axes(
    fx_shape: tuple | None, onnx_shape: tuple | None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(fx axes, ONNX axes) of size 1 when the two shapes differ only by such axes (the
    same elements in the same order), else None."""
    if fx_shape is None or onnx_shape is None or len(fx_shape) == len(onnx_shape):
        return None
    fx_rest = [d for d in fx_shape if d != 1]
    onnx_rest = [d for d in onnx_shape if d != 1]
    if len(fx_rest) != len(onnx_rest) or not shapes_compatible(tuple(fx_rest), tuple(onnx_rest)):
        return None
    return (
        tuple(i for i, d in enumerate(fx_shape) if d == 1),
        tuple(i for i, d in enumerate(onnx_shape) if d == 1),
    )


def _other_float(node: torch.fx.Node, onnx_type: Any) -> bool:
    """Whether the ONNX value holds the fx value in a coarser float type, same rank."""
    fx_type = fx_value_type(node)
    if fx_type is None or onnx_type is None or fx_type[0] not in _FLOAT_DTYPES:
        return False
    dtype = ONNX_TO_TORCH.get(onnx_type[0])
    rank = onnx_type[1]
    # only to a coarser type: a converter lowers the precision, and a model computing in
    # more precision than the program is another computation (never hidden by a cast)
    return (
        dtype in _FLOAT_DTYPES
        and torch.finfo(dtype).eps > torch.finfo(fx_type[0]).eps
        and rank in (None, fx_type[1])
    )


def _squeezed(
    node: torch.fx.Node, onnx_type: Any, onnx_shape: tuple | None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    fx_type = fx_value_type(node)
    if fx_type is None or onnx_type is None:
        return None
    dtype = ONNX_TO_TORCH.get(onnx_type[0])
    if dtype is not None and dtype != fx_type[0]:
        return None
    return size_one_axes(fx_value_shape(node), onnx_shape)


def _multiplies_as_stored(node: onnx.NodeProto, name: str) -> bool:
    """``node`` multiplies by initializer ``name`` as it is stored (not transposed): a
    MatMul, or a Gemm / FusedMatMul whose B it is, without transB."""
    if node.op_type == "MatMul":
        return True
    if node.op_type in ("Gemm", "FusedMatMul") and len(node.input) > 1 and node.input[1] == name:
        return not any(a.name == "transB" and a.i for a in node.attribute)
    return False


class FoldedWeights(PairingStep):
    """An initializer consumed by the lowering of an fx node whose weight argument has as
    many elements pairs with that weight (through a transposition when it is one).
    ``by_pairs``: a node's fx node is also found from the pairs (:func:`_fx_of_paired`),
    for a graph tool that dropped the metadata."""

    declared = rule(PAIRED_BY_STATE_DICT)

    def __init__(self, by_pairs: bool = False):
        self.by_pairs = by_pairs

    def run(self, ctx: FxPairingContext) -> None:
        g, fx_nodes, initializers = ctx.graph, ctx.fx_nodes, ctx.initializers
        weights, pairing, try_pair = ctx.weights, ctx.pairing, ctx.try_pair
        fx_of = _fx_of_paired(g, ctx.fx_of, pairing) if self.by_pairs else ctx.fx_of
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
                    try_pair(inp, w.name, PAIRED_BY_STATE_DICT, TRANSFORM_TRANSPOSE)
                elif shape == dims:
                    try_pair(inp, w.name, PAIRED_BY_STATE_DICT)


# fx views whose ONNX lowering is a Reshape, and the ONNX ops a graph tool leaves for them
_FX_VIEWS = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten.squeeze",
             "aten.unsqueeze", "aten.flatten", "aten.expand_dims")  # fmt: skip
_ONNX_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


class ThroughViews(PairingStep):
    """A paired view (an fx ``view``/``reshape`` whose ONNX value a Reshape makes): the
    Reshape's data input is the view's input, in another shape.  Graph tools move
    reshapes around a MatMul turned Gemm, and the fx value before the view keeps no ONNX
    value of its own shape."""

    declared = rule(PAIRED_BY_STRUCTURE)

    def run(self, ctx: FxPairingContext) -> None:
        fx_nodes, pairing, onnx_shapes = ctx.fx_nodes, ctx.pairing, ctx.onnx_shapes
        for node in ctx.graph.node:
            if node.op_type not in _ONNX_VIEWS or node.domain not in ("", "ai.onnx"):
                continue
            if not node.input or not node.output or node.input[0] in pairing.by_onnx:
                continue
            pairs = pairing.by_onnx.get(node.output[0])
            fx = fx_nodes.get(pairs.fx_name) if pairs is not None else None
            if fx is None or not str(fx.target).startswith(_FX_VIEWS) or not fx.args:
                continue
            src = fx.args[0]
            if not isinstance(src, torch.fx.Node) or src.name in pairing.by_fx:
                continue
            if _numel(fx_value_shape(src)) != _numel(onnx_shapes.get(node.input[0])):
                continue
            ctx.try_pair(node.input[0], src.name, PAIRED_BY_STRUCTURE, TRANSFORM_RESHAPE)


# fx targets lowered to one ONNX node of that op, operands in the same order (the last
# two may swap: both ops are commutative)
_ONE_NODE_LOWERINGS = {
    "aten.add.Tensor": "Add", "aten.sub.Tensor": "Sub", "aten.mul.Tensor": "Mul",
    "aten.div.Tensor": "Div", "aten.tanh.default": "Tanh", "aten.relu.default": "Relu",
    "aten.sigmoid.default": "Sigmoid", "aten.exp.default": "Exp", "aten.log.default": "Log",
    "aten.sqrt.default": "Sqrt", "aten.neg.default": "Neg", "aten.erf.default": "Erf",
    "aten.abs.default": "Abs", "aten.rsqrt.default": "Reciprocal", "aten.cos.default": "Cos",
    "aten.sin.default": "Sin", "aten.bmm.default": "MatMul", "aten.mm.default": "MatMul",
    "aten.matmul.default": "MatMul", "aten.pow.Tensor_Tensor": "Pow",
    "aten.where.self": "Where", "aten.maximum.default": "Max", "aten.minimum.default": "Min",
}  # fmt: skip
_COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min"})


class Operands(PairingStep):
    """The operands of a paired one-node lowering (an ``aten.add`` whose value an ``Add``
    makes) are the fx node's operands: graph tools rename the values between nodes (a
    bias Add of zeros removed, a reshape folded), and the node reading them says which
    they are.  Operands pair only where the others agree (an anchor), or alone."""

    declared = rule(PAIRED_BY_STRUCTURE)

    def run(self, ctx: FxPairingContext) -> None:
        g, fx_nodes, weights, pairing = ctx.graph, ctx.fx_nodes, ctx.weights, ctx.pairing
        initializers = ctx.initializers
        constants = {o for n in g.node if n.op_type == "Constant" for o in n.output}
        for node in g.node:
            if not node.output:
                continue
            pair = pairing.by_onnx.get(node.output[0])
            fx = fx_nodes.get(pair.fx_name) if pair is not None else None
            if fx is None or fx.op != "call_function" or fx.kwargs:
                continue
            if _ONE_NODE_LOWERINGS.get(str(fx.target)) != node.op_type or pair.transform:
                continue
            onnx_args = [
                i for i in node.input if i and i not in initializers and i not in constants
            ]
            fx_args = [
                _through_copies(a, pairing)
                for a in fx.args
                if isinstance(a, torch.fx.Node) and a.name not in weights
            ]
            if len(onnx_args) != len(fx_args) or len(fx_args) != len(
                [a for a in fx.args if isinstance(a, torch.fx.Node)]
            ):
                continue
            orders = [fx_args]
            if node.op_type in _COMMUTATIVE and len(fx_args) == 2:
                orders.append(fx_args[::-1])
            for order in orders:
                loose = [
                    (o, f) for o, f in zip(onnx_args, order)
                    if o not in pairing.by_onnx and f.name not in pairing.by_fx
                ]  # fmt: skip
                bound = [(o, f) for o, f in zip(onnx_args, order) if (o, f) not in loose]
                if any(
                    o not in pairing.by_onnx or pairing.by_onnx[o].fx_name != f.name
                    for o, f in bound
                ):
                    continue  # the other operands disagree in this order
                if len(loose) == 1:
                    ctx.try_pair(loose[0][0], loose[0][1].name, PAIRED_BY_STRUCTURE)
                break


# fx nodes that pass their first argument's value on: the exporter lowers them to nothing
_FX_COPIES = ("aten.clone.default", "aten.alias.default", "aten.detach.default",
              "aten.lift_fresh_copy.default")  # fmt: skip


def _through_copies(node: torch.fx.Node, pairing: Pairing) -> torch.fx.Node:
    """The fx value a chain of copies starts from, unless a copy is paired itself."""
    while (
        node.name not in pairing.by_fx
        and node.op == "call_function"
        and str(node.target) in _FX_COPIES
        and node.args
        and isinstance(node.args[0], torch.fx.Node)
    ):
        node = node.args[0]
    return node


def _reshape_target(shape: tuple | None) -> tuple[int, ...] | None:
    if shape is None or sum(d is None for d in shape) > 1:
        return None
    return tuple(-1 if d is None else d for d in shape)


def _numel(shape: tuple | None) -> int | None:
    if shape is None or any(d is None for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


def _fx_of_paired(g, fx_of: list[str | None], pairing: Pairing) -> list[str | None]:
    """Each ONNX node's fx node: the one its metadata names, else (metadata removed by a
    graph tool) the fx node one of its outputs is paired with, else the one all the
    consumers of its outputs belong to (a MatMul whose product only its bias Add reads
    is part of the linear the Add's value is paired with)."""
    out: list[str | None] = []
    for node, fx_name in zip(g.node, fx_of):
        if fx_name is None:
            for o in node.output:
                p = pairing.by_onnx.get(o)
                if p is not None and p.kind != KIND_INPUT:
                    fx_name = p.fx_name
                    break
        out.append(fx_name)
    consumers: dict[str, list[int]] = {}
    for k, node in enumerate(g.node):
        for i in node.input:
            consumers.setdefault(i, []).append(k)
    graph_outputs = {o.name for o in g.output}
    for k in range(len(out) - 1, -1, -1):
        if out[k] is not None:
            continue
        owners = set()
        for o in g.node[k].output:
            if o in graph_outputs:
                owners.add(None)
            owners.update(out[c] for c in consumers.get(o, ()))
        if len(owners) == 1:
            out[k] = owners.pop()
    return out


def structural_lowering(model: onnx.ModelProto, pairing: Pairing) -> list[str | None]:
    """For a model that carries no exporter metadata (a graph tool removed it): the fx
    node each ONNX node belongs to, from the pairs (a node whose value is paired with an
    fx node, and the nodes that only feed it), so blame still names a lowering with the
    ONNX nodes it holds."""
    g = model.graph
    return sizes_to_first_reader(g, _fx_of_paired(g, [None] * len(g.node), pairing))


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


class ByMetadata(PairingStep):
    """An fx node not paired by name pairs with the last output of the last ONNX node
    whose metadata names it, when the declared type and shape agree."""

    declared = rule(PAIRED_BY_METADATA)

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
                ctx.try_pair(candidates[-1], fx_name, PAIRED_BY_METADATA)


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


class GetitemOutputs(PairingStep):
    """The outputs of a multi-output fx node (an LSTM, a Split): its ``getitem`` users
    pair with the values its lowering hands to other nodes, when their declared type and
    shape single one out (through a permutation of the axes when an optimizer merged the
    transposes around the lowering)."""

    declared = rule(PAIRED_BY_METADATA)

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
                    try_pair(same[0], u.name, PAIRED_BY_METADATA)
                    continue
                if len(same) > 1:
                    # equal parts (chunk, split into equal sizes): one Split makes them all, in
                    # the order torch returns them, so the getitem's index names its output
                    v = _split_output(nodes, producer, same, u.args[1] if len(u.args) > 1 else None)
                    if v is not None:
                        try_pair(v, u.name, PAIRED_BY_METADATA)
                    continue
                # Optimizers merge the transposes around RNN lowerings into their neighbours,
                # so the value handed on may be the getitem with its axes permuted: pair it
                # when one value and one permutation single it out, compared through it.
                permuted = [(v, _unique_permutation(fshape, onnx_shapes[v])) for v in typed]
                permuted = [(v, p) for v, p in permuted if p is not None]
                if len(permuted) == 1 and not same:
                    v, perm = permuted[0]
                    if try_pair(v, u.name, PAIRED_BY_METADATA, TRANSFORM_PERMUTE):
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


class SplitParts(PairingStep):
    """Pairs the getitems of an fx split with the outputs of the ONNX Split of the same
    tensor (its input paired with the split's) along the same axis, part by part: the
    optimizer rewrites a split's lowering into one Split node and drops its metadata, and
    equal parts (``chunk``) cannot be told apart by shape."""

    declared = rule(PAIRED_BY_POSITION)

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
                        try_pair(v, u.name, PAIRED_BY_POSITION)


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


# What a program returns to its caller.  Its other outputs are state it writes back
# (mutated buffers, parameters, inputs; gradients, effect tokens): an ONNX model, run for
# inference, returns none of them, so none is an output the model fails to compute.
_RETURNED = frozenset({"USER_OUTPUT", "LOSS_OUTPUT"})


def returned_outputs(program: torch.export.ExportedProgram) -> list[str]:
    """The fx node names of the values ``program`` returns to its caller, in order."""
    out = _output_node(program.graph)
    specs = getattr(getattr(program, "graph_signature", None), "output_specs", None)
    values = out.args[0] if len(out.args) == 1 and isinstance(out.args[0], tuple | list) else None
    if specs is None or values is None or len(specs) != len(values):
        return graph_outputs(program.graph)  # not told apart: every output
    return [
        v.name
        for v, spec in zip(values, specs)
        if spec.kind.name in _RETURNED and isinstance(v, torch.fx.Node)
    ]


def graph_outputs(graph: torch.fx.Graph) -> list[str]:
    """The fx node names of every value of the graph's output node."""
    leaves = torch.utils._pytree.tree_leaves(_output_node(graph).args)
    return [a.name for a in leaves if isinstance(a, torch.fx.Node)]


def _output_node(graph: torch.fx.Graph) -> torch.fx.Node:
    return next(n for n in reversed(graph.nodes) if n.op == "output")


def _transform_of(
    node: torch.fx.Node,
    onnx_type: Any,
    onnx_shape: tuple | None,
    rule: str,
    transform: str | None,
    coarser: bool,
) -> tuple[str | None, Any] | None:
    """How fx value ``node`` becomes the ONNX value (its transform, and the size-1 axes of
    a squeeze), None when they cannot be the same value.  ``transform``: the one the
    rule asks for (None: found from the declared types and shapes)."""
    squeeze = None
    if transform == TRANSFORM_RESHAPE:
        fx_type = fx_value_type(node)
        if fx_type is None or onnx_type is None:
            return None
        same = ONNX_TO_TORCH.get(onnx_type[0]) == fx_type[0]
        if not same and not _other_float(node, (onnx_type[0], None)):
            return None
    elif transform is None:
        how = value_transform(node, onnx_type, onnx_shape)
        if how is False and rule in (PAIRED_BY_NAME, PAIRED_BY_METADATA):
            squeeze = _squeezed(node, onnx_type, onnx_shape)
            how = TRANSFORM_RESHAPE if squeeze is not None else False
        if how is False and coarser and shapes_compatible(fx_value_shape(node), onnx_shape):
            how = TRANSFORM_CAST
        if how is False:
            return None
        transform = None if how is True else how
    return transform, squeeze


class AroundPaired(PairingStep):
    """The values around paired ones (through views, operands, folded weights), a few
    rounds, until nothing more pairs: for a graph tool that dropped the metadata or
    renamed values."""

    declared = rule(PAIRED_BY_STRUCTURE)
    rounds: tuple[PairingStep, ...] = (ThroughViews(), Operands(), FoldedWeights(by_pairs=True))

    def run(self, ctx: FxPairingContext) -> None:
        for _ in range(4):
            if not sum(step.pair(ctx) for step in self.rounds):
                break


@dataclass
class FxPairingContext(PairingContext):
    """What the fx-to-ONNX rules read besides the shared context: the program's nodes and
    weights, and the candidate's declared types and shapes and each node's fx node."""

    fx_nodes: dict[str, torch.fx.Node]
    weights: dict[str, str]  # placeholder -> state-dict name
    fx_of: list[str | None]  # per ONNX node, the fx node its metadata names
    onnx_types: dict[str, tuple[int, int | None]]
    onnx_shapes: dict[str, tuple[int | None, ...]]
    model: onnx.ModelProto | None = None  # the candidate (shape inference reads it)


# The fx-to-ONNX pairing: its rules, in the order they run (each record's paired_by is
# the name of the rule that paired it).
FX_RULES: tuple[PairingStep, ...] = (
    SameName(),  # node outputs, graph inputs, folded constants named after fx nodes
    OutputFixAliases(),  # X_orig inputs and V_alias_<i> outputs of the output fix
    StateDictName(),
    FoldedWeights(),  # e.g. the transposed weight of a linear
    ByMetadata(),
    GetitemOutputs(),
    SplitParts(),  # a split whose lowering lost its metadata, by the parts' place
    AroundPaired(),
    ByPosition(),
    CorrespondingOps(then=AroundPaired()),  # a model without metadata: node by node
)


def fx_pairing_context(
    graph: torch.fx.Graph,
    model: onnx.ModelProto,
    weights: dict[str, str],
    user_inputs: list[str],
    trusted: set[str] | None = None,
    metadata: FxMetadata | None = None,
    outputs: list[str] | None = None,
) -> FxPairingContext:
    """What the fx-to-ONNX rules read: the context :func:`pair_values` runs them on.

    ``trusted``: when the program is not known to be the one the model was lowered from,
    the fx nodes its metadata describes exactly; computed values of other fx nodes are
    not paired by name or metadata (the same name may be another computation).
    ``metadata``: the model's :class:`FxMetadata`, when the caller reads it too.
    ``outputs``: the fx values the program returns (:func:`returned_outputs`); by
    default every value of the graph's output node.
    """
    g = model.graph
    fx_nodes = {n.name: n for n in graph.nodes}
    onnx_types, onnx_shapes = onnx_value_types_and_shapes(model)
    initializers = {i.name: i for i in g.initializer}
    produced = list(dict.fromkeys(o for node in g.node for o in node.output if o))
    graph_inputs = [i.name for i in g.input if i.name not in initializers]
    onnx_outputs = [o.name for o in g.output]
    fx_outputs = graph_outputs(graph) if outputs is None else list(outputs)
    fx_output_set = set(fx_outputs)
    pairing = Pairing()

    def kind_of(fx_name: str, onnx_name: str) -> str:
        if fx_name in weights or onnx_name in initializers and fx_name not in fx_nodes:
            return KIND_WEIGHT
        node = fx_nodes.get(fx_name)
        if node is not None and node.op == "placeholder":
            return KIND_WEIGHT if fx_name in weights else KIND_INPUT
        if fx_name in fx_output_set or onnx_name in onnx_outputs:
            return KIND_OUTPUT
        return KIND_NODE

    def try_pair(onnx_name: str, fx_name: str, rule: str, transform: str | None = None) -> bool:
        if onnx_name in pairing.by_onnx:
            return False
        node = fx_nodes.get(fx_name)
        if node is None:
            return False
        if (
            trusted is not None
            and rule in (PAIRED_BY_NAME, PAIRED_BY_METADATA)
            and node.op == "call_function"
            and fx_name not in trusted
            and not ("getitem" in str(node.target) and node.args and str(node.args[0]) in trusted)
        ):
            return False
        coarser = _other_float(node, onnx_types.get(onnx_name))
        found = _transform_of(
            node, onnx_types.get(onnx_name), onnx_shapes.get(onnx_name), rule, transform, coarser
        )
        if found is None:
            return False
        transform, squeeze = found
        pair = Pair(onnx_name, fx_name, rule, kind_of(fx_name, onnx_name), transform)
        pair.squeeze = squeeze
        if transform is None:
            declared, fx_shape = onnx_shapes.get(onnx_name), fx_value_shape(node)
            pair.declared = (
                declared is not None
                and fx_shape is not None
                and None not in fx_shape
                and tuple(declared) == fx_shape
            )
        if transform == TRANSFORM_RESHAPE and squeeze is None:
            pair.shape = _reshape_target(onnx_shapes.get(onnx_name))
        if coarser:
            pair.cast_to = onnx_types[onnx_name][0]
        pairing.add(pair)
        return True

    return FxPairingContext(
        pairing=pairing,
        try_pair=try_pair,
        graph=g,
        inputs=graph_inputs,
        produced=produced,
        initializers=initializers,
        outputs=onnx_outputs,
        same_name=lambda name: name in fx_nodes and fx_nodes[name].op != "output",
        reference_by_original={t: ph for ph, t in weights.items()},
        reference_inputs=user_inputs,
        reference_outputs=fx_outputs,
        fx_nodes=fx_nodes,
        weights=weights,
        fx_of=(metadata or FxMetadata(model)).names,  # read once: protobuf is slow
        onnx_types=onnx_types,
        onnx_shapes=onnx_shapes,
        model=model,
    )


def pair_values(
    graph: torch.fx.Graph,
    model: onnx.ModelProto,
    weights: dict[str, str],
    user_inputs: list[str],
    trusted: set[str] | None = None,
    metadata: FxMetadata | None = None,
    outputs: list[str] | None = None,
) -> Pairing:
    """Pairs fx values (by node name) with ONNX values (by value name): runs
    :data:`FX_RULES` on :func:`fx_pairing_context` (which says what the arguments are)."""
    return run_rules(
        FX_RULES, fx_pairing_context(graph, model, weights, user_inputs, trusted, metadata, outputs)
    )
