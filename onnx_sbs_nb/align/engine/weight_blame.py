"""The engine's half of the weight blame (``judge/weights.py`` gives the verdict): a
weight that differs from its torch parameter waits for the verdict of its first paired
consumer, which the engine may run once more with the torch parameter to tell whose
error it is."""

from __future__ import annotations

from typing import Any

from ...diff import compare
from ...records import KIND_WEIGHT, Record
from ..judge.judging import as_candidate, comparable
from ..judge.weights import settle_weight
from ..pairing.names import Pairing
from .sides import OnnxSide


class WeightBlame:
    """The differing weights of one run, held until a consumer is judged."""

    def __init__(
        self,
        reference: Any,
        candidate: OnnxSide,
        pairing: Pairing,
        atol: float | None,
        rtol: float | None,
    ) -> None:
        self.reference, self.candidate, self.pairing = reference, candidate, pairing
        self.atol, self.rtol = atol, rtol
        self.pending: dict[str, Record] = {}  # weights awaiting a verdict
        self.awaiting: dict[str, list[str]] = {}  # consumer value -> weights
        # the own-error inputs of a pending weight's consumers, by node, to probe them
        self.probe_inputs: dict[int, list[Any]] = {}
        self._consumers: dict[str, list[int]] | None = None

    def holds(self, name: str, rec: Record) -> bool:
        """Whether the record of initializer ``name`` waits for its consumers' verdict
        (a differing weight with a paired consumer)."""
        if rec.kind != KIND_WEIGHT or not rec.failed or name not in self.candidate.initializers:
            return False
        outs = self.consumer_outputs(name)
        if not outs:
            return False
        self.pending[name] = rec
        for o in outs:
            self.awaiting.setdefault(o, []).append(name)
        return True

    def settled_by(
        self, name: str, rec: Record, ref_env: dict[str, Any]
    ) -> tuple[list[Record], list[Record]]:
        """The weights the record of consumer ``name`` settles: those whose record comes
        before it (they are the answer) and those that come after it."""
        before: list[Record] = []
        after: list[Record] = []
        for w in self.awaiting.pop(name, ()):
            wrec = self.pending.pop(w, None)
            if wrec is not None:
                (before if self.settle(wrec, rec, ref_env) else after).append(wrec)
        return before, after

    def reads_pending(self, idx: int) -> bool:
        """Whether candidate node ``idx`` reads a weight that waits for a verdict."""
        pending = self.pending
        return bool(pending) and any(n in pending for n in self.candidate.graph.inputs[idx])

    def consumer_outputs(self, name: str, depth: int = 8) -> list[str]:
        """The first paired values computed from initializer ``name`` (through values
        without a partner, a Cast or a Transpose say)."""
        cand, by_onnx = self.candidate, self.pairing.by_onnx
        consumers = self._consumers
        if consumers is None:
            consumers = {}
            for k, n in enumerate(cand.nodes):
                for i in cand.node_inputs(n):
                    consumers.setdefault(i, []).append(k)
            self._consumers = consumers
        found: list[str] = []
        frontier, seen = [name], {name}
        for _ in range(depth):
            nxt = []
            for value in frontier:
                for k in consumers.get(value, ()):
                    for o in cand.nodes[k].output:
                        if not o or o in seen:
                            continue
                        seen.add(o)
                        (found if o in by_onnx else nxt).append(o)
            if found or not nxt:
                break
            frontier = nxt
        return found

    def settle(self, wrec: Record, consumer: Record, ref_env: dict[str, Any]) -> bool:
        """Whose error a differing weight is (``judge/weights.py``); the engine only
        offers the probe of the consumer run with the torch parameter."""
        return settle_weight(
            wrec,
            consumer,
            ref_env.get(consumer.ep_name or ""),
            lambda: self._consumer_with_torch_weight(wrec, consumer, ref_env),
        )

    def _consumer_with_torch_weight(
        self, wrec: Record, consumer: Record, ref_env: dict[str, Any]
    ) -> bool | None:
        """Whether the consumer agrees with torch when fed the torch parameter instead of
        the differing weight (None when that cannot be tried)."""
        cand = self.candidate
        k = consumer.onnx_id_node
        inputs = self.probe_inputs.get(k) if k is not None else None
        pair = self.pairing.by_onnx.get(wrec.onnx_name)
        out = self.pairing.by_onnx.get(consumer.onnx_name)
        if inputs is None or pair is None or out is None or out.fx_name not in ref_env:
            return None
        names = cand.node_inputs(cand.nodes[k])
        if wrec.onnx_name not in names:
            return None
        torch_value = cand.as_runner_value(
            as_candidate(pair, self.reference.leaf_value(pair.fx_name))
        )
        fed = [torch_value if n == wrec.onnx_name else v for n, v in zip(names, inputs)]
        try:
            outputs = cand.call(k, fed)
        except Exception:
            return None
        got = outputs[list(cand.nodes[k].output).index(consumer.onnx_name)]
        e, g = comparable(as_candidate(out, ref_env[out.fx_name]), got)
        if e is None:
            return None
        return bool(compare(e, g, self.atol, self.rtol).passed)


__all__ = ["WeightBlame"]
