"""Which fx node each ONNX node lowers, and which fx values the program returns.

The unit of blame is the lowering of one fx node: the ONNX nodes the exporter made for it,
read from each node's ``pkg.torch.onnx.fx_node`` metadata, else (a graph tool dropped it)
from the pairs.
"""

from __future__ import annotations

import onnx
import torch

from ...records import KIND_INPUT
from ..source.fx_metadata import fx_name_from_metadata
from .float_view_nodes import view_kind
from .onnx_inference import sizes_to_first_reader
from .pairs import Pairing


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
    added: set[int] = set()  # nodes a quantizer added around one product (below)
    for k, node in enumerate(nodes):
        group = fx_names[k]
        if group is None:
            for name in node.input:
                p = producer.get(name)
                if p is not None and p < k and groups[p] is not None:
                    group = groups[p]
                    break
            if node.op_type in _QUANTIZER_PRODUCTS or any(
                producer.get(i) in added for i in node.input if i
            ):
                added.add(k)
        groups.append(group)
    _join_readers(nodes, groups, added)
    return groups


# The nodes onnxruntime's quantize_dynamic (and the integer products) add for one linear or
# conv: DynamicQuantizeLinear of its input, MatMulInteger/ConvInteger, the Cast and the
# scale Muls.  They carry no exporter metadata and only feed that product's lowering, so
# they belong to it, not to the producer of the quantized input (the previous layer's
# activation).  QuantizeLinear/DequantizeLinear pairs are not among them: a QDQ pair
# quantizes its producer's value, whoever reads it.
_QUANTIZER_PRODUCTS = frozenset(
    {"DynamicQuantizeLinear", "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul"}
)


def _join_readers(nodes: list[onnx.NodeProto], groups: list[str | None], added: set[int]) -> None:
    """Each quantizer-added node whose outputs are all read by one fx node's lowering
    joins it; backwards, so a chain (MatMulInteger, Cast, scale Mul) joins its last reader."""
    readers: dict[str, list[int]] = {}
    for k, node in enumerate(nodes):
        if view_kind(node) is not None:
            continue  # a float view added to compare a value reads it, it does not use it
        for i in node.input:
            if i:
                readers.setdefault(i, []).append(k)
    for k in sorted(added, reverse=True):
        owners = {groups[r] for o in nodes[k].output if o for r in readers.get(o, ())}
        if len(owners) == 1 and None not in owners:
            groups[k] = owners.pop()


def fx_of_paired(g, fx_of: list[str | None], pairing: Pairing) -> list[str | None]:
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
    return sizes_to_first_reader(g, fx_of_paired(g, [None] * len(g.node), pairing))


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


__all__ = [
    "fx_of_paired",
    "graph_outputs",
    "lowering_of_nodes",
    "returned_outputs",
    "structural_lowering",
]
