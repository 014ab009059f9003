"""Which values of a graph depend only on the shapes of its inputs.

A model exported with dynamic shapes spends a large share of its nodes computing shapes
(Shape, Gather, Concat, Unsqueeze, Range...) that are the same at every run with inputs
of the same shapes. ``shape_derived`` finds them: the evaluator computes them once per
input signature and compiles a plan where they are constants, so that Reshape, Expand or
Slice read constant arguments (converted once, written inline, and TorchScript-able).

The analysis is conservative: a value is shape-derived only if every node leading to it
is an op below whose output shape depends on nothing but its inputs' shapes, its
attributes and the values of its shape arguments (``SHAPE_ARGS``), and whose values
depend on nothing but its inputs' values. Ops whose output shape depends on data
(NonZero, Unique, Compress, Loop, If...), random ops, functions and custom kernels stop
it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import onnx
import torch

from .compiled import CompiledGraph, node_implicit_inputs
from .registry import normalize_domain

# Deterministic ops whose output shape is a function of the input shapes, the attributes
# and the values of the inputs at SHAPE_ARGS positions.
SHAPE_REGULAR = frozenset(
    """Add Sub Mul Div Mod Pow Neg Abs Sqrt Reciprocal Exp Log Tanh Sigmoid Relu Erf Sin
    Cos Floor Ceil Round Sign Max Min Sum Mean Where IsNaN IsInf Equal Less Greater
    LessOrEqual GreaterOrEqual And Or Not Xor Cast CastLike Identity Softmax LogSoftmax
    MatMul Gemm Reshape Transpose Slice Concat Unsqueeze Squeeze Gather GatherElements
    GatherND Expand Range ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd Flatten
    Tile ConstantOfShape Trilu Clip CumSum Split Pad TopK LayerNormalization""".split()
)
_REDUCE_AXES = {op: (1,) for op in "ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd".split()}
# Inputs whose values (not only shapes) decide the output shape.
SHAPE_ARGS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4),
    "Tile": (1, 2),
    "Unsqueeze": (1,),
    "Squeeze": (1,),
    "Split": (1,),
    "Pad": (1, 3),
    "TopK": (1,),
    "Range": (0, 1, 2),
    **_REDUCE_AXES,
}


def shape_derived(
    nodes: Iterable[onnx.NodeProto],
    input_names: Iterable[str],
    constant_names: Iterable[str],
    custom: Iterable[tuple[str, str]] = (),
) -> set[str]:
    """Names of the values computed from the input shapes and constants alone (the
    constants themselves excluded)."""
    constants = set(constant_names)
    static = set(input_names) | constants  # shape fixed by the input signature
    derived = set(constants)  # value fixed by the input signature
    custom = {(normalize_domain(d), n) for d, n in custom}
    for node in nodes:
        outs = [o for o in node.output if o]
        if (
            node.domain not in ("", "ai.onnx")
            or node.op_type not in SHAPE_REGULAR | {"Shape", "Size", "Constant"}
            or ("", node.op_type) in custom
            or any(
                a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                for a in node.attribute
            )
        ):
            continue
        ins = [i for i in node.input if i]
        if node.op_type == "Constant":
            constants.update(outs)
            static.update(outs)
            derived.update(outs)
            continue
        if node.op_type in ("Shape", "Size"):
            if ins and ins[0] in static:
                static.update(outs)
                derived.update(outs)
            continue
        shape_args = SHAPE_ARGS.get(node.op_type, ())
        args_known = all(
            node.input[p] in derived for p in shape_args if p < len(node.input) and node.input[p]
        )
        if all(i in static for i in ins) and args_known:
            static.update(outs)
            if all(i in derived for i in ins):
                derived.update(outs)
    return derived - constants


# Input signatures specialised per output set: beyond, new shapes run the generic plan.
MAX_SIGNATURES = 16
_SEEN_ONCE, _NO_GAIN = "seen once", "no gain"
# Most memory the folded values of one signature may hold.
MAX_FOLDED_BYTES = 16 * 2**20


def _nbytes(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    return sum(_nbytes(t) for t in v) if isinstance(v, list) else 0


class ShapeSpecializer:
    """Plans specialised on the shapes (and dtypes, devices) of the inputs.

    The first run with a signature runs the generic plan. The second one runs a capture
    plan (the generic plan also returning the shape-derived values other nodes read),
    then compiles, for that signature, a plan without the nodes that computed them,
    their values being constants; later runs with that signature use it."""

    def __init__(self, graph: onnx.GraphProto, input_names: list[str], custom, jit: bool):
        self.graph = graph
        self.input_names = list(input_names)
        constants = [i.name for i in graph.initializer]
        self.derived = shape_derived(graph.node, input_names, constants, custom or ())
        self.jit = jit
        self._seen: dict[tuple, dict[tuple, Any]] = {}
        self._capture: dict[tuple, tuple[list[str], Any]] = {}
        # plans that could not be built (the generic plan ran instead): a bug to report
        self.failures: list[str] = []

    def run(self, compiler, names: tuple[str, ...], nodes: list[onnx.NodeProto], inputs):
        """The outputs of a specialised run, or None: the caller runs the generic plan."""
        if not self.derived:
            return None
        sig = _signature(inputs)
        if sig is None:
            return None
        key = (id(compiler), names)
        seen = self._seen.setdefault(key, {})
        state = seen.get(sig)
        if isinstance(state, CompiledGraph):
            return state.execute(inputs)
        if state is None:
            if len(seen) < MAX_SIGNATURES:
                seen[sig] = _SEEN_ONCE
            return None
        if state is _NO_GAIN:
            return None
        try:
            frontier, capture = self._capture_plan(compiler, names, nodes)
        except Exception as e:  # an optimisation never breaks a run
            self.failures.append(f"capture plan: {type(e).__name__}: {e}")
            frontier = []
        if not frontier:
            seen[sig] = _NO_GAIN
            return None
        values = capture.execute(inputs)
        folded = values[len(names) :]
        if sum(_nbytes(v) for v in folded) > MAX_FOLDED_BYTES:
            # large tensors made from shapes (masks of long sequences): not kept per signature
            seen[sig] = _NO_GAIN
            return values[: len(names)]
        kept = [n for n in nodes if not all(o in self.derived for o in n.output if o)]
        inits = {**compiler.graph_initializers(self.graph)}
        inits.update(zip(frontier, folded))
        try:
            seen[sig] = compiler.compile(
                kept, self.input_names, list(names), inits, inputs_on_device=True, jit=self.jit
            )
        except Exception as e:  # an optimisation never breaks a run
            self.failures.append(f"specialised plan: {type(e).__name__}: {e}")
            seen[sig] = _NO_GAIN
        return values[: len(names)]

    def _capture_plan(self, compiler, names, nodes) -> tuple[list[str], Any]:
        key = (id(compiler), names)
        if key not in self._capture:
            derived = self.derived
            kept = [n for n in nodes if not all(o in derived for o in n.output if o)]
            # what the kept nodes read, their subgraphs' reads of this scope included
            kept_reads = {i for n in kept for i in (*n.input, *node_implicit_inputs(n))}
            frontier = sorted(v for v in derived if v in kept_reads or v in names)
            capture = None
            if frontier:
                capture = compiler.compile(
                    nodes,
                    self.input_names,
                    [*names, *frontier],
                    compiler.graph_initializers(self.graph),
                    inputs_on_device=True,
                )
            self._capture[key] = (frontier, capture)
        return self._capture[key]


def _signature(inputs) -> tuple | None:
    sig = []
    for v in inputs:
        if isinstance(v, torch.Tensor):
            sig.append((tuple(v.shape), v.dtype, v.device))
        elif v is None:
            sig.append(None)
        else:
            return None  # sequences: not specialised
    return tuple(sig)
