"""What the precision-loss rule (``judge/precision_loss.py``) needs of a run: a candidate
node's inputs as the reference has them (exact), the same rounded to the types the node
reads, and the node's value on the rounded ones (its own-error value, made here when the
run made none).

Only nodes whose every input is known exactly qualify: a reference partner (a weight's
partner is the torch parameter, so a changed weight is not taken for rounding), or a
constant or graph input of the model without one.  An input computed from reference
values through nodes without partners carries their error: no exact value, no verdict.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import onnx
import torch

from ...convert import to_torch
from ..judge.judging import as_candidate, as_expected
from ..pairing.pairs import Pairing
from .runners import TorchRunner
from .sides import OnnxSide


@dataclass
class RoundedInputs:
    """Candidate node ``node`` seen from the reference (``output``: which of its outputs
    is judged)."""

    node: onnx.NodeProto
    exact: list[torch.Tensor | None]  # the reference's values of its inputs
    rounded: list[torch.Tensor | None]  # ... in the types the node reads
    # what its own-error run feeds it: ``rounded``, but the model's own weights
    fed: list[torch.Tensor | None]
    output: int
    run_exact: Any  # callable: the node on float64 inputs (the torch evaluator)
    # every input is known exactly (False: one was computed from torch values through
    # the nodes of the same lowering: good for a rerun, not for a rounding verdict)
    all_exact: bool
    # callable: its output run on ``fed`` in its own types (None: it failed to run),
    # made only when asked (a rerun where the run made none)
    value: Any


_DEPTH = 4  # nodes of one lowering recomputed to feed a rerun


class PrecisionInputs:
    """``ctx.precision_inputs`` of a run: ``self(name)`` gives the :class:`RoundedInputs`
    of the node computing candidate value ``name``, None where an input is not known
    exactly.  The engine sets ``ref_env`` and ``own`` before each pair is judged."""

    def __init__(
        self, candidate: OnnxSide, pairing: Pairing, unproven: set[str], reference: Any = None
    ) -> None:
        self.candidate, self.pairing, self.unproven = candidate, pairing, unproven
        self.reference = reference
        self.ref_env: dict[str, Any] = {}
        self.own: dict[Any, Any] = {}
        self._exact = TorchRunner("cpu")

    def __call__(self, name: str) -> RoundedInputs | None:
        cand = self.candidate
        idx = cand.producer.get(name)
        if idx is None:
            return None
        node = cand.nodes[idx]
        exact: list[torch.Tensor | None] = []
        rounded: list[torch.Tensor | None] = []
        fed: list[torch.Tensor | None] = []
        all_exact = True
        for i in cand.graph.inputs[idx]:
            pair = self.pairing.by_onnx.get(i) if i else None
            if not i:
                e = r = f = None
            elif pair is not None and i not in self.unproven and pair.fx_name in self.ref_env:
                ref = self.ref_env[pair.fx_name]
                if not isinstance(ref, torch.Tensor | type(None)):
                    ref = to_torch(ref) if hasattr(ref, "dtype") else None
                if ref is None:
                    return None
                e, r = as_expected(pair, ref), to_torch(as_candidate(pair, ref))
                f = to_torch(cand.initializer(i)) if i in cand.initializers else r
            elif i in cand.initializers:
                e = r = f = to_torch(cand.initializer(i))
            elif i in cand.feeds:
                e = r = f = to_torch(cand.leaf_value(i))
            else:
                f = self._within(i, cand.lowering[idx], _DEPTH)
                if f is None:
                    return None
                e = r = f
                all_exact = False
            if e is not None and (not isinstance(e, torch.Tensor) or e.shape != r.shape):
                return None
            exact.append(e)
            rounded.append(r)
            fed.append(f)
        outputs = list(node.output)
        k = outputs.index(name)
        return RoundedInputs(
            node,
            exact,
            rounded,
            fed,
            k,
            self._run,
            all_exact,
            partial(self._value, idx, name, fed),
        )

    def _within(self, name: str, lowering: Any, depth: int) -> torch.Tensor | None:
        """Value ``name`` (no torch twin) computed from torch values through the nodes of
        lowering ``lowering`` that make it (a SiLU's Sigmoid before its Mul), as an
        own-error run computes it; None beyond ``depth`` nodes or another lowering (whose
        error it would carry)."""
        cand = self.candidate
        idx = cand.producer.get(name)
        if idx is None or depth <= 0 or lowering is None or cand.lowering[idx] != lowering:
            return None
        feeds = []
        for i in cand.graph.inputs[idx]:
            pair = self.pairing.by_onnx.get(i) if i else None
            if not i:
                feeds.append(None)
            elif i in cand.initializers:
                feeds.append(cand.initializer(i))
            elif pair is not None and i not in self.unproven and pair.fx_name in self.ref_env:
                feeds.append(cand.as_runner_value(as_candidate(pair, self.ref_env[pair.fx_name])))
            elif i in cand.feeds:
                feeds.append(cand.leaf_value(i))
            else:
                v = self._within(i, lowering, depth - 1)
                if v is None:
                    return None
                feeds.append(cand.as_runner_value(v))
        try:
            values = cand.call(idx, feeds)
        except Exception:
            return None
        v = values[list(cand.nodes[idx].output).index(name)]
        return None if v is None else to_torch(v)

    def _value(self, idx: int, name: str, fed: list[Any]) -> torch.Tensor | None:
        """The own-error value of ``name``: the run's where it made one (on the same
        inputs), else the node run here on ``fed``."""
        from .own_error import NotComputed

        got = self.own.get(name)
        if got is not None and not isinstance(got, NotComputed):
            return to_torch(got)
        cand = self.candidate
        try:
            feeds = [None if r is None else cand.as_runner_value(r) for r in fed]
            values = cand.call(idx, feeds)
        except Exception:
            return None
        v = values[list(cand.nodes[idx].output).index(name)]
        return None if v is None else to_torch(v)

    def torch_exact(self, fx_name: str) -> torch.Tensor | None:
        """Torch's own op of fx node ``fx_name`` computed in float64 on the run's torch
        values of its inputs (what the program computes, with no rounding of its own):
        None where the reference is no torch program or the op cannot run in float64."""
        by_name = getattr(self.reference, "by_name", None)
        node = by_name.get(fx_name) if by_name is not None else None
        if node is None or node.op != "call_function":
            return None
        env = self.ref_env

        def value(a: Any) -> Any:
            if isinstance(a, torch.fx.Node):
                v = env.get(a.name)
                if v is None and a.op == "placeholder":
                    v = self.reference.leaf_value(a.name)
                if v is None:
                    raise KeyError(a.name)
                return v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
            return a

        try:
            args = torch.fx.node.map_aggregate(node.args, value)
            kwargs = torch.fx.node.map_aggregate(node.kwargs, value)
            out = node.target(*args, **kwargs)
        except Exception:  # an op without a float64 kernel, a missing value: no answer
            return None
        if isinstance(out, tuple | list):
            out = out[0] if out else None
        return out if isinstance(out, torch.Tensor) and out.dtype == torch.float64 else None

    def _run(self, node: onnx.NodeProto, inputs: list[torch.Tensor | None]) -> list[Any]:
        return self._exact.prepare(node, self.candidate.ctx)(inputs)


__all__ = ["PrecisionInputs", "RoundedInputs"]
