"""The fx-to-ONNX rules that pair by structure: the values around paired ones, for a
graph tool that dropped the exporter's metadata or renamed values (onnxslim, onnxsim).
A pair they make is a guess (rule ``structure``)."""

from __future__ import annotations

import torch

from .context import FxPairingContext
from .fx_rules import FoldedWeights
from .pairs import Pairing
from .rules import PairingStep, StructureRule
from .values import TRANSFORM_RESHAPE, fx_value_shape, numel

# fx views whose ONNX lowering is a Reshape, and the ONNX ops a graph tool leaves for them
_FX_VIEWS = ("aten.view", "aten._unsafe_view", "aten.reshape", "aten.squeeze",
             "aten.unsqueeze", "aten.flatten", "aten.expand_dims")  # fmt: skip


_ONNX_VIEWS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


class ThroughViews(StructureRule):
    """A paired view (an fx ``view``/``reshape`` whose ONNX value a Reshape makes): the
    Reshape's data input is the view's input, in another shape.  Graph tools move
    reshapes around a MatMul turned Gemm, and the fx value before the view keeps no ONNX
    value of its own shape."""

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
            if numel(fx_value_shape(src)) != numel(onnx_shapes.get(node.input[0])):
                continue
            ctx.try_pair(node.input[0], src.name, StructureRule.name, TRANSFORM_RESHAPE)


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


class Operands(StructureRule):
    """The operands of a paired one-node lowering (an ``aten.add`` whose value an ``Add``
    makes) are the fx node's operands: graph tools rename the values between nodes (a
    bias Add of zeros removed, a reshape folded), and the node reading them says which
    they are.  Operands pair only where the others agree (an anchor), or alone."""

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
                    ctx.try_pair(loose[0][0], loose[0][1].name, StructureRule.name)
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


class AroundPaired(StructureRule):
    """The values around paired ones (through views, operands, folded weights), a few
    rounds, until nothing more pairs: for a graph tool that dropped the metadata or
    renamed values."""

    rounds: tuple[PairingStep, ...] = (ThroughViews(), Operands(), FoldedWeights(by_pairs=True))

    def run(self, ctx: FxPairingContext) -> None:
        for _ in range(4):
            if not sum(step.pair(ctx) for step in self.rounds):
                break


__all__ = ["AroundPaired", "Operands", "ThroughViews"]
