"""The engine's half of the weight blame (``judge/weights.py`` gives the verdict): a
weight that differs from its torch parameter waits for the verdict of its first paired
consumer, which the engine may run once more with the torch parameter to tell whose
error it is.  Every other node reading it (the exporter stores equal parameters once:
two fresh LayerNorms read one initializer) is probed the same way, with the parameter
its own torch twin reads, so that the error it inherits from the weight is not its own."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ...compare.diff import compare
from ...compare.value_facts import value_dtype_name
from ...dtypes import ONNX_FLOAT_TYPES
from ...records import KIND_WEIGHT, Record
from ...records import join_comments as _join
from ..judge.folding import Folding
from ..judge.judging import as_candidate, comparable
from ..judge.weights import explain_reader, readers_text, settle_weight
from ..pairing.pairs import Pairing
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
        judge: Any = None,
        own_error: bool = False,
    ) -> None:
        self.reference, self.candidate, self.pairing = reference, candidate, pairing
        self.atol, self.rtol = atol, rtol
        # the user's verdict policy and compare function (verdict_policy.Judge): they
        # decide the probe and whether atol/rtol's scale check applies, as everywhere
        self.judge = judge
        graph = reference.graph
        self.folding = Folding(graph.inputs, graph.outputs, getattr(reference, "by_name", None))
        # the torch value of a constant computed by the program (not a parameter): the
        # probe feeds it, and the program may free it before the consumer is compared
        self.torch_constants: dict[str, Any] = {}
        self.pending: dict[str, Record] = {}  # weights awaiting a verdict
        self.awaiting: dict[str, list[str]] = {}  # consumer value -> weights
        # the own-error inputs of a pending weight's consumers, by node, to probe them
        self.probe_inputs: dict[int, list[Any]] = {}
        self._consumers: dict[str, list[int]] | None = None
        self._folded: dict[str, list[str]] = {}  # quantized weight -> folded consumers
        # a differing initializer read by several nodes, with how many are still to be
        # compared: each is probed with its torch twin's parameter (explain_reader)
        self._read_by: dict[str, tuple[Record, int]] = {}
        # own errors on: a consumer not rerun is not for want of asking (the why says so)
        self.own_error = own_error

    def holds(self, name: str, rec: Record, ref_env: dict[str, Any] | None = None) -> bool:
        """Whether the record of initializer ``name`` waits for its consumers' verdict
        (a differing weight with a paired consumer).  A constant the program computes
        (``nan_to_num``'s bounds, a mask) is judged the same way: by its content once,
        through what its consumers make of it, not as a value failing on every input."""
        if not rec.failed:
            return False
        if name in self.candidate.initializers:
            outs = self.consumer_outputs(name)
        else:
            # a quantized weight (the dequantized value of an integer initializer) waits
            # only when the exporter folded its torch twin: judged with its consumer, as
            # the float weight is, never element by element against the unfolded one
            outs = self._folded_consumers(name)
        if not outs:
            return False
        if rec.kind != KIND_WEIGHT:
            pair = self.pairing.by_onnx.get(name)
            if pair is not None and ref_env is not None and pair.fx_name in ref_env:
                self.torch_constants[name] = want = ref_env[pair.fx_name]
                rec.comment = _join(rec.comment, _scalars(self.candidate.initializer(name), want))
        self.pending[name] = rec
        for o in outs:
            self.awaiting.setdefault(o, []).append(name)
        if len(outs) > 1 and name in self.candidate.initializers:
            self._read_by[name] = (rec, len(outs))
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
            elif w in self._read_by:
                # a later reader of a weight its first consumer settled: its own error
                # may be the weight's, as the first consumer's was
                self._explain(self._read_by[w][0], rec, ref_env)
            if w in self._read_by:
                wrec, left = self._read_by[w]
                if left > 1:
                    self._read_by[w] = (wrec, left - 1)
                else:
                    del self._read_by[w]
        return before, after

    def reads_pending(self, idx: int) -> bool:
        """Whether candidate node ``idx`` reads a weight that waits for a verdict, or one
        with readers still to be probed (its own-error inputs are then kept)."""
        pending, read_by = self.pending, self._read_by
        return (bool(pending) or bool(read_by)) and any(
            n in pending or n in read_by for n in self.candidate.graph.inputs[idx]
        )

    def folded_weight(self, name: str) -> bool:
        """Whether ``name``, a quantized weight (a ``DequantizeLinear`` of an initializer
        or a float view of one), pairs with a torch parameter the exporter folded other
        fx nodes into (a BatchNorm into its Conv): its values differ by design."""
        return bool(self._folded_consumers(name))

    def _folded_consumers(self, name: str) -> list[str]:
        """The first paired consumers of quantized weight ``name`` whose value the
        exporter computes at once with fx nodes folded into the weight ([] when none,
        or when ``name`` dequantizes no initializer)."""
        if name not in self._folded:
            self._folded[name] = self._find_folded_consumers(name)
        return self._folded[name]

    def _find_folded_consumers(self, name: str) -> list[str]:
        cand = self.candidate
        k = cand.producer.get(name)
        weight = self.pairing.by_onnx.get(name)
        if k is None or weight is None:
            return []
        node = cand.nodes[k]
        if node.op_type not in ("DequantizeLinear", "MatMulNBits") or not node.input:
            return []
        source = node.input[0]
        if source not in cand.initializers:
            return []
        # a float view is read by no node: its consumers are those of the integer weight
        # it views (a ConvInteger), the view itself left out
        outs = self.consumer_outputs(name) or self.consumer_outputs(source, skip=name)
        by_onnx, folding = self.pairing.by_onnx, self.folding
        weights = getattr(self.reference, "weights", ())
        if not any(
            folding.changes_weight(weight.fx_name, by_onnx[o].fx_name, weights) for o in outs
        ):
            return []
        return outs

    def consumer_outputs(self, name: str, depth: int = 8, skip: str = "") -> list[str]:
        """The first paired values computed from initializer ``name`` (through values
        without a partner, a Cast or a Transpose say; ``skip``: a value neither found nor
        followed)."""
        cand, by_onnx = self.candidate, self.pairing.by_onnx
        consumers = self._consumers
        if consumers is None:
            consumers = {}
            for k, n in enumerate(cand.nodes):
                for i in cand.node_inputs(n):
                    consumers.setdefault(i, []).append(k)
            self._consumers = consumers
        found: list[str] = []
        frontier, seen = [name], {name, skip}
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
        want = ref_env.get(consumer.ep_name or "")
        weight = self.pairing.by_onnx.get(wrec.onnx_name)
        value = self.pairing.by_onnx.get(consumer.onnx_name)
        # the parameter the consumer's torch twin reads (another, equal one where the
        # exporter stored equal parameters once): the fold is looked for from it
        param = self._stands_for(wrec, consumer.onnx_name) if wrec.kind == KIND_WEIGHT else None
        folded = (
            self.folding.folded(param or weight.fx_name, value.fx_name)
            if weight is not None and value is not None
            else ()
        )
        # a parameter's consumer (not a folded one's, nor a computed constant's) is probed
        # with that parameter, and its own error may be the weight's
        param = None if folded else param
        probed: list[bool | None] = []  # the probe's answer, once asked

        def probe() -> bool | None:
            if not probed:
                probed.append(self._consumer_with_torch_weight(wrec, consumer, ref_env, param))
            return probed[0]

        first = settle_weight(
            wrec,
            consumer,
            want,
            probe,
            tuple(self._in_user_words(n) for n in folded),
            self._by_tolerance(want),
            lambda: self._rows_that_differ(wrec),
            self.own_error,
            self._float_initializers(consumer) if folded else (),
        )
        if weight is not None and param is not None:
            text = readers_text(wrec.onnx_name or "", weight.fx_name, self._readers(wrec))
            wrec.comment = _join(wrec.comment, text)
            if probed and probed[0] is True:
                explain_reader(consumer, wrec.onnx_name or "", param, weight.fx_name, probe)
        return first

    def _explain(self, wrec: Record, consumer: Record, ref_env: dict[str, Any]) -> None:
        """Probes ``consumer``, a reader of weight ``wrec`` after the one that settled it,
        with the torch parameter its torch twin reads (``judge/weights.explain_reader``)."""
        weight = self.pairing.by_onnx.get(wrec.onnx_name)
        value = self.pairing.by_onnx.get(consumer.onnx_name)
        if consumer.passed2 is not False or weight is None or value is None:
            return
        if wrec.kind != KIND_WEIGHT:
            return  # a computed constant: its readers' twins read the same fx value
        param = self._stands_for(wrec, consumer.onnx_name)
        if self.folding.folded(param, value.fx_name):
            # the exporter folded fx nodes into it on this reader's way (or this reader's
            # twin reads the weight only through other computations): not this case
            return
        explain_reader(
            consumer,
            wrec.onnx_name or "",
            param,
            weight.fx_name,
            lambda: self._consumer_with_torch_weight(wrec, consumer, ref_env, param),
        )

    def _readers(self, wrec: Record) -> list[tuple[str, str]]:
        """Each node reading initializer ``wrec`` (through values without a partner) and
        the torch parameter its torch twin reads in its place."""
        cand, found = self.candidate, []
        for o in self.consumer_outputs(wrec.onnx_name or ""):
            k = cand.producer.get(o)
            if k is not None:
                found.append((cand.node_name(k), self._stands_for(wrec, o)))
        return found

    def _stands_for(self, wrec: Record, value: str | None) -> str:
        """The torch parameter the torch twin of ONNX value ``value`` reads where its
        node reads weight ``wrec``: the one the weight pairs with, or, when the exporter
        stored equal parameters once, the equal parameter the twin reads instead."""
        weight = self.pairing.by_onnx.get(wrec.onnx_name)
        pair = self.pairing.by_onnx.get(value) if value else None
        if weight is None:
            return ""
        if pair is None or wrec.kind != KIND_WEIGHT:
            return weight.fx_name
        read = self.folding.weights_read(pair.fx_name, getattr(self.reference, "weights", ()))
        if not read or weight.fx_name in read:
            return weight.fx_name
        try:
            want = self.reference.leaf_value(weight.fx_name)
            return next((q for q in read if _equal(self.reference.leaf_value(q), want)), "") or (
                weight.fx_name
            )
        except Exception:  # a parameter that cannot be read: the one it pairs with
            return weight.fx_name

    def _float_initializers(self, consumer: Record) -> tuple[str, ...]:
        """The float initializers the node computing ``consumer`` reads, in its input
        order: a folded consumer's weights, those paired with no torch parameter too (the
        bias the exporter made from a BatchNorm)."""
        cand, k = self.candidate, consumer.onnx_id_node
        if k is None or not 0 <= k < len(cand.nodes):
            return ()
        inits = cand.initializers
        return tuple(
            n
            for n in cand.node_inputs(cand.nodes[k])
            if n in inits and getattr(inits[n], "data_type", None) in ONNX_FLOAT_TYPES
        )

    def _rows_that_differ(self, wrec: Record) -> str | None:
        """Where weight ``wrec`` differs from its torch parameter, by rows of its first
        axis (" in rows 12-63 of 64"): None when that cannot be said."""
        pair = self.pairing.by_onnx.get(wrec.onnx_name)
        try:
            got = np.asarray(self.candidate.initializer(wrec.onnx_name), dtype=np.float64)
            want = as_candidate(pair, self.reference.leaf_value(pair.fx_name))
            want = np.asarray(want.detach().double().cpu() if hasattr(want, "detach") else want)
        except Exception:  # no torch twin to read, or not numbers: nothing to say
            return None
        if got.shape != want.shape or got.ndim < 1 or not got.size:
            return None
        atol = wrec.atol if wrec.atol is not None else 0.0
        rtol = wrec.rtol if wrec.rtol is not None else 0.0
        off = ~np.isclose(got, want, rtol=rtol, atol=atol, equal_nan=True)
        return describe_rows(np.flatnonzero(off.reshape(len(off), -1).any(axis=1)), len(off))

    def _in_user_words(self, fx_name: str) -> str:
        """An fx node as the user knows it: their node's name and its module."""
        try:
            d = self.reference.describe(fx_name)
        except Exception:  # a reference that cannot describe it: the prepared name
            return fx_name
        name = d.get("ep_user_name") or fx_name
        return f"{name} ({d['ep_module']})" if d.get("ep_module") else name

    def _by_tolerance(self, want: Any) -> bool:
        """Whether atol/rtol decide a value like ``want`` (no verdict policy for its
        dtype, no compare function)."""
        judge = self.judge
        if judge is None or want is None:
            return True
        if judge.compare is not None:
            return False
        return judge.policy is None or judge.policy.conditions(value_dtype_name(want)) is None

    def _consumer_with_torch_weight(
        self, wrec: Record, consumer: Record, ref_env: dict[str, Any], param: str | None = None
    ) -> bool | None:
        """Whether the consumer agrees with torch when fed the torch parameter (``param``,
        the one its torch twin reads; the weight's partner when None) instead of the
        differing weight (None when that cannot be tried)."""
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
        torch_value = self.torch_constants.get(wrec.onnx_name)
        if torch_value is None:
            if wrec.kind != KIND_WEIGHT:
                return None
            torch_value = self.reference.leaf_value(param or pair.fx_name)
        torch_value = cand.as_runner_value(as_candidate(pair, torch_value))
        fed = [torch_value if n == wrec.onnx_name else v for n, v in zip(names, inputs)]
        try:
            outputs = cand.call(k, fed)
        except Exception:
            return None
        got = outputs[list(cand.nodes[k].output).index(consumer.onnx_name)]
        e, g = comparable(as_candidate(out, ref_env[out.fx_name]), got)
        if e is None:
            return None
        d = compare(e, g, self.atol, self.rtol, judge=self.judge)
        return None if d.error else bool(d.passed)


def describe_rows(rows: np.ndarray, total: int, most: int = 3) -> str | None:
    """Sorted row numbers in words: " in rows 12-63 of 64", " in 40 of 64 rows" when
    they make more than ``most`` runs; None for none or all."""
    if not len(rows) or len(rows) == total:
        return None
    breaks = np.flatnonzero(np.diff(rows) != 1)
    starts = [int(rows[0])] + [int(rows[b + 1]) for b in breaks]
    ends = [int(rows[b]) for b in breaks] + [int(rows[-1])]
    if len(starts) > most:
        return f" in {len(rows)} of {total} rows"
    runs = [str(a) if a == b else f"{a}-{b}" for a, b in zip(starts, ends)]
    word = "row" if len(rows) == 1 else "rows"
    return f" in {word} {', '.join(runs)} of {total}"


def _equal(a: Any, b: Any) -> bool:
    """Whether two torch parameters hold the same values (what makes the exporter store
    them once)."""
    return (
        isinstance(a, torch.Tensor)
        and isinstance(b, torch.Tensor)
        and a.shape == b.shape
        and a.dtype == b.dtype
        and bool(torch.equal(a, b.to(a.device)))
    )


def _scalars(got: Any, want: Any) -> str | None:
    """A one-element constant's two values, in words ("-inf where torch has -1.8e+308"):
    what differs is then plain (a bound that overflowed its dtype, say)."""
    try:
        if int(got.size if hasattr(got, "size") and not callable(got.size) else got.numel()) != 1:
            return None
        g = float(got.reshape(-1)[0])
        w = float(want.reshape(-1)[0])
    except Exception:  # not a number on one side: nothing plain to say
        return None
    return f"{g:.4g} where torch has {w:.4g}"


__all__ = ["WeightBlame", "describe_rows"]
