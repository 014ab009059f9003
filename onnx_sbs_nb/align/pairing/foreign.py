"""Pairing a model no metadata ties to the program: the TorchScript exporter's
(``torch.onnx.export(..., dynamo=False)``), another converter's, a graph edited by hand.

Such a model keeps the graph inputs, outputs and most weight names, and nothing else:
its values are named ``/blocks/blocks.0/conv/Conv_output_0``, no node says which fx
node it lowers.  :class:`CorrespondingOps` walks its nodes in order and pairs each value
with the fx value that is, by structure, the same computation:

- the same *frontier*: the nearest paired values (and graph inputs) it is computed
  from, weights, constants and shape arithmetic aside (a static program has no sizes to
  compute), are the twins of the fx value's;
- the same dtype and static shape (ONNX shape inference gives the model's);
- the node is one an exporter ends the fx node's lowering with (:mod:`.lowerings`):
  a linear's value is its bias ``Add``, not the ``MatMul`` before it; where an fx node's
  lowering is several nodes of its end op (a ``Mul`` of a decomposed gelu, then its
  ``Mul`` by 0.5) the value is the last one, read only from constants besides;
- a node reading a paired weight is the fx node reading that weight; one reading
  weights no fx node reads (a batch norm folded into its Conv by an eval export) is the
  end of the chain the exporter folded (conv -> batch norm -> its getitem).

Among several such fx values the one in the same module (read from the node's name,
``/blocks/blocks.0/Add`` is in ``blocks.0``, ``/MatMul_1`` in the root) wins, then the
first in the program (the two sides traced the same code in the same order: a chunk's
parts); one in a module apart from the node's is none.  Every pair is a guess (rule
``structure``): shapes that differ at run time drop it.
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx
import torch

from ...dtypes import ONNX_TO_TORCH
from ...records import KIND_WEIGHT
from ..source.provenance import module_of_node_name, module_path
from .corroborated import mark_read_by_twins
from .lowerings import COPIES, FOLDABLE, LAYOUT, ends_of, op_name
from .onnx_inference import constant_values, inferred_types
from .rules import PairingStep, StructureRule

_DEPTH = 16  # fx nodes between a paired value and the end of one ONNX node's lowering
_REACH = 512  # fx nodes looked at from one paired value

Frontier = frozenset[str]
# ONNX ops that lower one fx node alone, reading its operands as they are
_WHOLE = frozenset({
    "Conv", "ConvTranspose", "Gemm", "Relu", "Sigmoid", "Tanh", "Gelu", "HardSwish",
    "HardSigmoid", "LeakyRelu", "Softmax", "LogSoftmax", "LayerNormalization",
    "BatchNormalization", "GlobalAveragePool", "AveragePool", "MaxPool", "Transpose",
    "Add", "Sub", "Mul", "Div", "Exp", "Log", "Sqrt", "Abs", "Neg", "Erf", "Pow", "Where",
})  # fmt: skip


class CorrespondingOps(StructureRule):
    """The node-by-node walk over a model without exporter metadata (module docstring)."""

    def __init__(self, then: PairingStep | None = None):
        # what pairs around the walk's pairs (names.AroundPaired: a MatMul's transposed
        # weight once its linear is paired), given by the pairing that lists this rule
        self.then = then

    def run(self, ctx) -> None:
        model = getattr(ctx, "model", None)
        if model is None or any(ctx.fx_of) or not ctx.graph.node:
            return  # the exporter's metadata says what each node lowers
        types = inferred_types(model)
        if not types:
            return
        if _Walk(ctx, types).run() and self.then is not None:
            self.then.pair(ctx)
        mark_read_by_twins(ctx)


def _onnx_scope(name: str) -> str | None:
    """The module a TorchScript node name says (``""``: the root, for ``/MatMul_1``);
    None for a name that says none (``MatMul_12``)."""
    if not name.startswith("/"):
        return None
    return module_of_node_name(name) or ""


def _fx_scope(node: torch.fx.Node) -> str | None:
    """The module an fx node was traced in (``""``: the root), None when unknown."""
    if not node.meta.get("nn_module_stack"):
        return None
    return module_path(node.meta) or ""


def _fx_shape(node: torch.fx.Node) -> tuple[torch.dtype, tuple[int, ...]] | None:
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not all(isinstance(d, int) for d in val.shape):
        return None
    return val.dtype, tuple(val.shape)


def _moves(node: torch.fx.Node) -> bool:
    """Whether fx ``node`` only moves its input's values (a transpose, a view; no copy)."""
    return node.op == "call_function" and op_name(node) in LAYOUT and op_name(node) not in COPIES


class _Walk:
    def __init__(self, ctx, types) -> None:
        self.ctx = ctx
        self.pairing = ctx.pairing
        self.nodes = list(ctx.graph.node)
        self.types = types
        self.producer = {o: k for k, n in enumerate(self.nodes) for o in n.output if o}
        self.consumers: dict[str, list[int]] = {}
        for k, n in enumerate(self.nodes):
            for i in n.input:
                if i:
                    self.consumers.setdefault(i, []).append(k)
        self.constant = constant_values(ctx.graph)
        fx_nodes = ctx.fx_nodes
        self.order = {name: k for k, name in enumerate(fx_nodes)}
        self.weights = {
            name for name, n in fx_nodes.items() if name in ctx.weights or n.op == "get_attr"
        }
        self._onnx_memo: dict[str, Frontier | None] = {}
        self._fx_memo: dict[str, Frontier] = {}
        self._between_memo: dict[str, bool] = {}

    # -- frontiers -------------------------------------------------------------------
    def onnx_frontier(self, value: str) -> Frontier | None:
        """The fx twins of the nearest paired values ``value`` is computed from (None: it
        reads an unpaired graph input)."""
        pair = self.pairing.by_onnx.get(value)
        if pair is not None and pair.kind != KIND_WEIGHT:
            return frozenset({pair.fx_name})
        if value in self.constant:
            return frozenset()
        if value in self._onnx_memo:
            return self._onnx_memo[value]
        k = self.producer.get(value)
        found: Frontier | None = None
        if k is not None:
            parts = [self.onnx_frontier(i) for i in self.nodes[k].input if i]
            if all(p is not None for p in parts):
                found = frozenset().union(*parts)
        self._onnx_memo[value] = found
        return found

    def fx_value_frontier(self, node: torch.fx.Node) -> Frontier:
        if node.name in self.weights:
            return frozenset()
        if node.name in self.pairing.by_fx or node.op == "placeholder":
            return frozenset({node.name})
        return self.fx_frontier(node)

    def fx_frontier(self, node: torch.fx.Node) -> Frontier:
        """The nearest paired values (and graph inputs) fx ``node`` is computed from."""
        found = self._fx_memo.get(node.name)
        if found is None:
            parts = [self.fx_value_frontier(a) for a in node.all_input_nodes]
            found = frozenset().union(*parts) if parts else frozenset()
            self._fx_memo[node.name] = found
        return found

    def computes_between(self, node: torch.fx.Node) -> bool:
        """Whether an unpaired fx node that computes (not a view, copy or part of a
        split) lies between ``node`` and its frontier: then an ONNX node with that
        frontier is inside the lowering of that node, not ``node``'s value (a
        GroupNorm's weight Mul is not the silu after it).  A getitem's multi-output
        source is part of its own lowering."""
        found = self._between_memo.get(node.name)
        if found is None:
            start = list(node.all_input_nodes)
            if op_name(node) == "getitem":
                start = [b for a in start for b in a.all_input_nodes]
            found = False
            seen: set[str] = set()
            while start and not found:
                a = start.pop()
                if a.name in seen or a.name in self.weights or a.op != "call_function":
                    continue
                seen.add(a.name)
                if a.name in self.pairing.by_fx or not self.fx_value_frontier(a):
                    continue
                name = op_name(a)
                if name == "getitem" and a.args and op_name(a.args[0]) in LAYOUT:
                    name = op_name(a.args[0])
                found = name not in LAYOUT and not (name == "getitem" or name in COPIES)
                start.extend(a.all_input_nodes)
            self._between_memo[node.name] = found
        return found

    def _paired(self) -> None:
        self._onnx_memo.clear()
        self._fx_memo.clear()
        self._between_memo.clear()

    # -- candidates ------------------------------------------------------------------
    def _reach(self, anchor: str, through_views: bool = False) -> set[str]:
        """Unpaired fx nodes computed from ``anchor`` within a few steps (through paired
        views too: ``through_views``)."""
        start = self.ctx.fx_nodes.get(anchor)
        if start is None:
            return set()
        seen: set[str] = set()
        layer = [start]
        for _ in range(_DEPTH):
            nxt = []
            for n in layer:
                for u in n.users:
                    if u.name in seen or u.op != "call_function":
                        continue
                    if u.name in self.pairing.by_fx:
                        if through_views and op_name(u) in LAYOUT:
                            nxt.append(u)  # walked through, not a candidate
                        continue
                    seen.add(u.name)
                    nxt.append(u)
            if not nxt or len(seen) > _REACH:
                break
            layer = nxt
        return seen

    def _matches(self, value: str, node: torch.fx.Node) -> bool:
        """Same dtype and rank, and every dimension inference knows the same (a slice
        whose bounds are computed from sizes has unknown ones: the run checks them)."""
        fx = _fx_shape(node)
        found = self.types.get(value)
        if fx is None or found is None or len(found[1]) != len(fx[1]):
            return False
        return ONNX_TO_TORCH.get(found[0]) == fx[0] and all(
            d is None or d == e for d, e in zip(found[1], fx[1])
        )

    def _weights_read(self, node: onnx.NodeProto) -> tuple[set[str], bool]:
        """The fx weights a node's paired initializers are, and whether it reads an
        unpaired initializer of several elements (a weight the exporter made).  A weight
        paired with an fx weight no fx node reads counts as unpaired: torch.export reads
        a tied weight (an embedding and its LM head) by one of its names only."""
        paired, made = set(), False
        for i in node.input:
            init = self.ctx.initializers.get(i)
            if init is None:
                continue
            pair = self.pairing.by_onnx.get(i)
            fx = self.ctx.fx_nodes.get(pair.fx_name) if pair is not None else None
            if pair is not None and (fx is None or fx.users):
                paired.add(pair.fx_name)
            elif len(init.dims) > 0 and any(d > 1 for d in init.dims):
                made = True
        return paired, made

    def _fold_end(self, node: torch.fx.Node) -> torch.fx.Node:
        """The end of the chain an exporter folds into the weights of ``node``'s lowering:
        a batch norm after a conv, an affine scale or shift by weights."""
        cur = node
        while len(cur.users) == 1:
            (u,) = cur.users
            name = op_name(u)
            nxt = None
            if name not in FOLDABLE or u.op != "call_function":
                break
            if name.startswith("native_batch_norm"):
                items = [g for g in u.users if op_name(g) == "getitem" and g.args[1:2] == (0,)]
                nxt = items[0] if len(items) == 1 else None
            elif name == "batch_norm" or all(
                a is cur or a.name in self.weights for a in u.all_input_nodes
            ):
                nxt = u
            if nxt is None or _fx_shape(nxt) != _fx_shape(cur):
                break
            cur = nxt
        return cur

    def _weights_agree(self, node: onnx.NodeProto, fx: torch.fx.Node) -> bool:
        """Whether ``node`` may compute ``fx``'s value by the weights each reads: a
        paired weight it reads is one ``fx`` reads; a tensor of weights it reads, when
        ``fx`` reads none, is a constant ``fx`` reads."""
        onnx_weights, made = self._weights_read(node)
        fx_weights = {a.name for a in fx.all_input_nodes if a.name in self.weights}
        if onnx_weights and not onnx_weights & fx_weights:
            return False
        return not (made and not fx_weights and not self._reads_constants(fx))

    def _reads_constants(self, node: torch.fx.Node) -> bool:
        """Whether fx ``node`` reads a value no input computes (a mask made from
        ``ones``, which an exporter stores as a tensor) or a number."""
        nodes = node.all_input_nodes
        if len(nodes) < len([a for a in node.args if a is not None]):
            return True  # a number or a list among its arguments
        return any(a.op == "call_function" and not self.fx_value_frontier(a) for a in nodes)

    def _module_score(self, onnx_module: str | None, node: torch.fx.Node) -> int:
        """2: the same module, 1: one holds the other, 0: unknown, -1: two modules
        apart (``/o/MatMul`` is not ``p``'s).  The root ("") is a module too: a node in
        no submodule (``/MatMul_1``) is the root's, as an fx node whose module stack
        holds only the root is."""
        fx_module = _fx_scope(node)
        if onnx_module is None or fx_module is None:
            return 0
        if onnx_module == fx_module:
            return 2
        a, b = sorted((onnx_module, fx_module), key=len)
        return 1 if not a or b.startswith(a + ".") else -1

    def _canon(self, frontier: Frontier) -> tuple[str, ...]:
        """A frontier with each paired view or transpose replaced by the value it moves:
        an exporter reads the value before a transpose with the permutations merged (a
        key transposed twice), so the two sides may reach the same values at different
        views.  Counted, not a set: q, k and v views of one projection all move its value,
        and a node reading two of them (the scores q @ k^T) is not one reading three
        (the attention's output), though they have one shape when the sequence is as
        long as a head."""
        found = []
        for name in frontier:
            node = self.ctx.fx_nodes.get(name)
            while node is not None and node.args and isinstance(node.args[0], torch.fx.Node):
                op = op_name(node)
                if op == "getitem" and op_name(node.args[0]) in LAYOUT:
                    node = node.args[0]
                elif op in LAYOUT:
                    node = node.args[0]
                else:
                    break
            found.append(node.name if node is not None else name)
        return tuple(sorted(found))

    def _candidate(self, node: onnx.NodeProto, value: str, anchors: Frontier, loose=False):
        """The fx node ``node``'s ``value`` is; ``loose``: frontiers compared up to views
        (:meth:`_canon`), when they are not the same."""
        reach: set[str] | None = None
        canon = self._canon(anchors) if loose else anchors
        for a in anchors:
            r = self._reach(a, through_views=loose)
            reach = r if reach is None else reach & r
            if not reach:
                return None
        onnx_weights, made = self._weights_read(node)
        module = _onnx_scope(node.name)
        best, best_key = None, None
        for name in reach or ():
            fx = self.ctx.fx_nodes[name]
            if node.op_type not in ends_of(fx) or not self._matches(value, fx):
                continue
            frontier = self.fx_frontier(fx)
            if (self._canon(frontier) if loose else frontier) != canon:
                continue
            if self.computes_between(fx):
                continue
            fx_weights = {a.name for a in fx.all_input_nodes if a.name in self.weights}
            if not self._weights_agree(node, fx):
                continue  # it reads weights this fx node does not
            confirmed = bool(onnx_weights & fx_weights)
            score = self._module_score(module, fx)
            if made and fx_weights and not confirmed:
                folded = self._fold_end(fx)
                if folded.name in self.pairing.by_fx:
                    continue  # that fold is another node's value
                score = max(score, self._module_score(module, folded))
                fx = folded
            if score < 0:
                continue  # the node's name puts it in another module
            key = (confirmed, score, -self.order[fx.name])
            if best_key is None or key > best_key:
                best, best_key = fx, key
        return self._merged_end(node, value, best) if best is not None else None

    def _merged_end(self, node: onnx.NodeProto, value: str, fx: torch.fx.Node) -> torch.fx.Node:
        """The end of the run of fx moves (transposes, views) that ``fx`` starts, each the
        one reader of the one before, that ``node`` may make whole: an exporter merges a
        key transposed twice into one Transpose.  The first of the run matches too when
        two dimensions are equally long (a sequence as long as a head), but its value
        is not the merged one.  The run stops where a node reading ``value`` is the next
        move's own lowering (the exporter kept the two apart)."""
        module = _onnx_scope(node.name)
        readers = [self.nodes[k] for k in self.consumers.get(value, ())]
        while _moves(fx) and len(fx.users) == 1:
            (u,) = fx.users
            if u.name in self.pairing.by_fx or u.op != "call_function" or not _moves(u):
                break
            if node.op_type not in ends_of(u) or not self._matches(value, u):
                break
            if [a for a in u.all_input_nodes if a.name not in self.weights] != [fx]:
                break
            if self._module_score(module, u) < self._module_score(module, fx):
                break
            if any(self._claimed(fx, m, o, self._computed_besides(m, value))
                   for m in readers for o in m.output if o):  # fmt: skip
                break
            fx = u
        return fx

    def _computed_besides(self, node: onnx.NodeProto, value: str) -> int:
        """How many computed values ``node`` reads besides ``value``."""
        return sum(1 for i in node.input if i and i != value and self.onnx_frontier(i))

    def _users(self, node: torch.fx.Node) -> Iterable[torch.fx.Node]:
        for u in node.users:
            if op_name(u) in COPIES:
                yield from u.users
            yield u

    def _claimed(self, fx: torch.fx.Node, m: onnx.NodeProto, out: str, computed: int) -> bool:
        """Whether an fx user of ``fx`` may be what ONNX node ``m`` computes (a relu of a
        relu), rather than the rest of ``fx``'s lowering."""
        for u in self._users(fx):
            if u.name in self.pairing.by_fx or m.op_type not in ends_of(u):
                continue
            if not self._matches(out, u) or not self._weights_agree(m, u):
                continue
            others = [a for a in u.all_input_nodes if a is not fx and self.fx_value_frontier(a)]
            if len(others) == computed:
                return True
        return False

    def _same_operands(self, node: onnx.NodeProto, value: str) -> torch.fx.Node | None:
        """The fx node reading exactly the twins of ``node``'s computed inputs, of its
        dtype and shape, whatever op either is: a node edited into another op (an Add
        made a Sub) is still that fx node's value.  Not where the value is combined with
        one of those inputs again a few nodes on (x * hardsigmoid(x)): then the node is
        a piece of a lowering."""
        computed = [i for i in node.input if i and self.onnx_frontier(i)]
        pairs = [self.pairing.by_onnx.get(i) for i in computed]
        if len(node.output) != 1 or not computed or any(p is None for p in pairs):
            return None
        twins = {p.fx_name for p in pairs}
        if self._recombines(value, set(computed)):
            return None
        module = _onnx_scope(node.name)
        found: list[tuple[int, torch.fx.Node]] = []
        for t in twins:
            src = self.ctx.fx_nodes.get(t)
            for u in self._users(src) if src is not None else ():
                if (
                    u.name in self.pairing.by_fx
                    or u.op != "call_function"
                    or u in (f for _, f in found)
                ):
                    continue
                args = {a.name for a in u.all_input_nodes if self.fx_value_frontier(a)}
                if args != twins or not self._matches(value, u) or self.computes_between(u):
                    continue
                if not self._weights_agree(node, u):
                    continue
                if self._goes_on(value, u):
                    return None  # a piece of u's lowering, whose end is further on
                if self._module_score(module, u) >= 0:
                    found.append((self._module_score(module, u), u))
        found.sort(key=lambda f: -f[0])
        if not found or (len(found) > 1 and found[1][0] == found[0][0]):
            return None
        return found[0][1]

    def _goes_on(self, value: str, fx: torch.fx.Node) -> bool:
        """Whether a node reading ``value`` reads a weight of ``fx``'s: then ``fx``'s
        lowering goes on there (a linear's MatMul, then the Add, edited or not, of its
        bias), and ``value`` is not yet its value."""
        weights = {a.name for a in fx.all_input_nodes if a.name in self.weights}
        return any(
            self._weights_read(self.nodes[k])[0] & weights for k in self.consumers.get(value, ())
        )

    def _recombines(self, value: str, inputs: set[str]) -> bool:
        layer, seen = [value], {value}
        for _ in range(6):
            nxt = []
            for v in layer:
                for k in self.consumers.get(v, ()):
                    n = self.nodes[k]
                    if inputs.intersection(n.input):
                        return True
                    nxt.extend(o for o in n.output if o and o not in seen)
                    seen.update(n.output)
            layer = nxt
        return False

    def _derives_from(self, value: str, source: str) -> bool:
        """Whether ONNX ``value`` is computed from ``source`` (through unpaired values)."""
        stack, seen = [value], set()
        while stack:
            v = stack.pop()
            if v == source:
                return True
            if v in seen or v in self.constant or v in self.pairing.by_onnx:
                continue
            seen.add(v)
            k = self.producer.get(v)
            if k is not None and len(seen) < _REACH:
                stack.extend(i for i in self.nodes[k].input if i)
        return False

    def _chain_end(self, value: str, fx: torch.fx.Node, anchors: Frontier) -> str:
        """The last value of the run of ``fx``'s end ops that starts at ``value``, each
        reading only ``value``'s frontier besides (a gelu's two Muls)."""
        ends = ends_of(fx)
        start = self.producer.get(value)
        scope = (
            self._module_score(_onnx_scope(self.nodes[start].name), fx) if start is not None else 0
        )
        while True:
            found = []
            for k in self.consumers.get(value, ()):
                m = self.nodes[k]
                if m.op_type not in ends:
                    continue
                # one fx node's lowering stays in its module and reads its weights: a
                # MatMul in another module (/o/MatMul after the root's /MatMul_1) or
                # reading a weight the fx node does not is the next fx node's lowering
                if self._module_score(_onnx_scope(m.name), fx) < scope:
                    continue
                if not self._weights_agree(m, fx):
                    continue
                outs = [o for o in m.output if o and self._matches(o, fx)]
                if len(outs) != 1 or outs[0] in self.pairing.by_onnx:
                    continue
                inputs = [i for i in m.input if i and i != value]
                others = [self.onnx_frontier(i) for i in inputs]
                if any(f is None or not f <= anchors for f in others):
                    continue
                if any(self._derives_from(i, value) for i in inputs):
                    continue  # it reads the value twice (v * sigmoid(v)): the next op's
                computed = sum(1 for f in others if f)
                if not self._claimed(fx, m, outs[0], computed):
                    found.append(outs[0])
            if len(found) != 1:
                return value
            value = found[0]

    def _gap(self, node: onnx.NodeProto) -> bool:
        """A paired node whose one computed input is unpaired, read where its fx twin
        reads its one unpaired computed argument: the two are the same value, whatever
        op made it (a Relu turned Sigmoid by an edit is no op of the relu's lowering)."""
        pair = self.pairing.by_onnx.get(node.output[0]) if node.output else None
        fx = self.ctx.fx_nodes.get(pair.fx_name) if pair is not None else None
        if fx is None or node.op_type not in _WHOLE or node.op_type not in ends_of(fx):
            return False
        if op_name(fx) == "linear" and node.op_type != "Gemm":
            return False  # its bias Add reads the product, not the linear's input
        loose = [
            i for i in node.input if i and self.onnx_frontier(i) and i not in self.pairing.by_onnx
        ]
        paired = [
            i
            for i in node.input
            if i and i in self.pairing.by_onnx and i not in self.ctx.initializers
        ]
        args = [
            a
            for a in fx.all_input_nodes
            if self.fx_value_frontier(a) and a.name not in self.pairing.by_fx
        ]
        bound = [
            a
            for a in fx.all_input_nodes
            if a.name in self.pairing.by_fx and a.name not in self.weights
        ]
        if len(loose) != 1 or len(args) != 1 or len(paired) != len(bound):
            return False
        twins = {self.pairing.by_onnx[i].fx_name for i in paired}
        if twins != {a.name for a in bound} or not self._matches(loose[0], args[0]):
            return False
        if self.onnx_frontier(loose[0]) != self.fx_frontier(args[0]):
            return False
        return self.ctx.try_pair(loose[0], args[0].name, StructureRule.name)

    def run(self) -> int:
        made = self._walk()
        # then the gaps, latest first: a gap filled lets the node before it be read
        for _ in range(4):
            filled = 0
            for node in reversed(self.nodes):
                if self._gap(node):
                    filled += 1
                    self._paired()
            made += filled
            if not filled:
                break
        return made

    def _walk(self) -> int:
        made = 0
        for node in self.nodes:
            for value in node.output:
                if not value or value in self.pairing.by_onnx or value in self.constant:
                    continue
                anchors = self.onnx_frontier(value)
                if not anchors:
                    continue
                fx = self._candidate(node, value, anchors)
                if fx is None:
                    fx = self._candidate(node, value, anchors, loose=True)
                end = value
                if fx is None:
                    fx = self._same_operands(node, value)
                if fx is None:
                    continue
                end = self._chain_end(value, fx, anchors)
                if self.ctx.try_pair(end, fx.name, StructureRule.name):
                    made += 1
                    self._paired()
        return made


__all__ = ["CorrespondingOps"]
