"""What an exporter folded into a weight's consumer: a BatchNorm in eval mode becomes part
of its Conv's (or Gemm's) weight and bias, a constant scale part of a MatMul's weight.

The folded initializer then differs from the torch parameter it pairs with, by design:
the ONNX node consuming it computes several fx nodes at once (the Conv and the
BatchNorm), and its value pairs with the last of them.  Such a weight is never the
culprit by itself: the consumer's comparison judges the weight and the computation
together, and its lowering (with the fx nodes it folds) is what to blame.
"""

from __future__ import annotations

from collections.abc import Container, Mapping, Sequence
from typing import Any

# fx targets that move, view or pick a value without computing: a path through them
# alone folds nothing
_PASSING = (
    "<built-in function getitem>",
    "aten.view",
    "aten._unsafe_view",
    "aten.reshape",
    "aten.t.",
    "aten.permute",
    "aten.transpose",
    "aten.expand",
    "aten.unsqueeze",
    "aten.squeeze",
    "aten._to_copy",
    "aten.to.",
    "aten.clone",
    "aten.contiguous",
    "aten.alias",
    "aten.detach",
    "aten.lift_fresh_copy",
)


def _computes(node: Any) -> bool:
    target = str(getattr(node, "target", ""))
    return getattr(node, "op", "") == "call_function" and not target.startswith(_PASSING)


class Folding:
    """Which fx nodes a weight's consumer computes at once (``folded(weight, value)``),
    read from the reference program's graph: its nodes' inputs by index and the fx nodes
    by name (no fx nodes: an ONNX reference, where nothing is folded)."""

    def __init__(
        self,
        inputs: Sequence[Sequence[str]],
        outputs: Sequence[Sequence[str]],
        nodes: Mapping[str, Any] | None,
        depth: int = 8,
    ) -> None:
        self._inputs, self._outputs, self._nodes = inputs, outputs, nodes
        self._depth = depth
        self._users: dict[str, list[int]] | None = None

    def users(self) -> dict[str, list[int]]:
        if self._users is None:
            users: dict[str, list[int]] = {}
            for k, names in enumerate(self._inputs):
                for n in names:
                    users.setdefault(n, []).append(k)
            self._users = users
        return self._users

    def folded(self, weight: str, value: str) -> tuple[str, ...]:
        """The fx nodes that compute ``value`` from ``weight`` (in graph order) when more
        than one of them computes (a Conv and its BatchNorm); () when one does, when
        ``value`` is not computed from ``weight`` within a few nodes, or when the
        reference is no torch program."""
        nodes = self._nodes
        if not nodes or weight == value:
            return ()
        users, outputs = self.users(), self._outputs
        # the nodes reached from the weight, with the values read to reach them
        reached: dict[str, int] = {}
        frontier = [weight]
        for _ in range(self._depth):
            nxt = []
            for name in frontier:
                for k in users.get(name, ()):
                    for out in outputs[k]:
                        if out not in reached:
                            reached[out] = k
                            nxt.append(out)
            if value in reached or not nxt:
                break
            frontier = nxt
        if value not in reached:
            return ()
        # back from the value, through reached nodes only: the nodes on a path
        on_path: set[str] = set()
        todo = [value]
        while todo:
            name = todo.pop()
            if name in on_path or name not in reached:
                continue
            on_path.add(name)
            todo.extend(self._inputs[reached[name]])
        ordered = sorted(on_path, key=lambda n: reached[n])
        computing = tuple(n for n in ordered if _computes(nodes.get(n)))
        return computing if len(computing) > 1 else ()

    def changes_weight(self, weight: str, value: str, weights: Container[str]) -> bool:
        """Whether the fx nodes folded into ``weight`` on its way to ``value``
        (:meth:`folded`) change its values: one of them, after its first reader, reads
        another weight (``weights``: the program's parameters, buffers and constants: a
        BatchNorm's statistics) or scales by a number.  An activation fused with its
        producer (a QLinearConv's Relu) computes at once too, but changes no weight."""
        folded = self.folded(weight, value)
        nodes = self._nodes
        if not folded or not nodes:
            return False
        for name in folded[1:]:
            node = nodes.get(name)
            if node is None:
                continue
            target = str(getattr(node, "target", ""))
            for a in _flat((getattr(node, "args", ()), getattr(node, "kwargs", {}))):
                if getattr(a, "op", None) == "placeholder" and a.name in weights:
                    return True
                if isinstance(a, int | float) and target.startswith(_SCALING):
                    return True
        return False

    def weights_read(self, value: str, weights: Container[str], depth: int = 4) -> list[str]:
        """The weights (``weights``: the program's parameters, buffers and constants) fx
        node ``value`` reads, directly or through nodes that only move or view them (a
        ``t`` before a ``linear``), in the order of its arguments ([] when the reference
        is no torch program)."""
        nodes = self._nodes
        node = nodes.get(value) if nodes else None
        if node is not None and str(getattr(node, "target", "")) == _GETITEM and node.args:
            node = node.args[0]  # one output of a node computing several: that node's
        found: list[str] = []
        frontier = list(getattr(node, "all_input_nodes", ()))
        for _ in range(depth):
            nxt = []
            for n in frontier:
                if getattr(n, "op", None) == "placeholder":
                    if n.name in weights and n.name not in found:
                        found.append(n.name)
                elif not _computes(n):
                    nxt.extend(getattr(n, "all_input_nodes", ()))
            if not nxt:
                break
            frontier = nxt
        return found


_GETITEM = "<built-in function getitem>"

# fx targets that fold a number into a weight (``x * 0.5`` folded into a MatMul's weight)
_SCALING = ("aten.mul", "aten.div")


def _flat(args: Any) -> list[Any]:
    """The leaves of nested args and kwargs."""
    if isinstance(args, list | tuple):
        return [leaf for a in args for leaf in _flat(a)]
    if isinstance(args, dict):
        return [leaf for a in args.values() for leaf in _flat(a)]
    return [args]


__all__ = ["Folding"]
