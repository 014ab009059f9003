"""The engine's side of judging a pair: its record made, its two values read from the
run's values, and the verdict rules (``judge/``) told what they need to know of the run
(errors, notes, inherited precision, TopK inputs, the own-error values)."""

from __future__ import annotations

from collections.abc import Callable, Container
from functools import partial
from typing import Any

from ...records import Record
from ..judge.context import STAGE_AFTER, RuleContext
from ..judge.judging import as_expected
from ..judge.precision import looser_dtype
from ..judge.quantization_noise import (
    mismatched_pairs,
    noise_bits,
    quantized_lowerings,
    rerun_sources,
)
from ..judge.saturation import interior_ranges, ranges_of
from ..judge.unordered import OrderFree, SetOrder
from ..judge.verdict import Verdicts
from ..pairing.pairs import Pairing
from .options import RunOptions
from .own_error import OwnErrors
from .precision_inputs import PrecisionInputs
from .side import ReferenceSide
from .sides import OnnxSide


class PairJudge:
    """Judges the pairs of one run, one at a time (:meth:`record`)."""

    def __init__(
        self,
        reference: ReferenceSide,
        candidate: OnnxSide,
        pairing: Pairing,
        options: RunOptions,
        undefined: Container[str],
        random: Container[str],
        unproven: set[str],
        own: OwnErrors,
    ) -> None:
        self.reference, self.candidate, self.pairing = reference, candidate, pairing
        self.own = own
        policy = options.judge  # verdict= / compare= (verdict_policy.py), or None
        # the verdict rules (judge/rules.py) and what they know of the run
        self.ctx = RuleContext(
            undefined=undefined,
            random=random,
            atol=options.atol,
            rtol=options.rtol,
            policy=policy,
            own_policy=policy.own if policy else None,
            unproven=unproven,
            quant_bits=noise_bits(candidate.model.graph, reference),
        )
        if self.ctx.quant_bits is not None:
            self.ctx.quantized = quantized_lowerings(candidate.model.graph, pairing.by_onnx)
            self.ctx.rerun_sources = rerun_sources(candidate.model.graph, pairing.by_onnx)
            self.ctx.clip_ranges = ranges_of(candidate.model.graph)
            self.ctx.pair_mismatch = mismatched_pairs(candidate.model.graph, pairing.by_onnx)
            self.ctx.interior_clips = interior_ranges(
                candidate.model.graph, self.ctx.clip_ranges, pairing.by_onnx
            )
        self.verdicts = Verdicts(self.ctx)
        # a failing node's inputs exact and rounded (judge/precision_loss.py)
        self.precision = PrecisionInputs(candidate, pairing, unproven, reference)
        self.ctx.precision_inputs = self.precision
        # a TopK's input, by its indices output, until those are compared (ties.py)
        self.tie_x: dict[str, tuple[int, Any]] = {}
        self.unordered: dict[str, OrderFree] = {}

    def defer_folded(self, folded_weight: Callable[[str], bool]) -> None:
        """Quantized weights whose torch twin the exporter folded (``weight_blame.py``):
        ``quantization_step.py`` leaves them to their consumer, and the own rerun of that
        consumer reads the model's weight (``own_error.py``), so goes through a
        quantization node: its own error may be quantization noise."""
        ctx = self.ctx
        ctx.folded_weight = folded_weight
        if ctx.quant_bits is None:
            return
        by_onnx = self.pairing.by_onnx
        inits = self.candidate.initializers
        folded = {n for n in by_onnx if n not in inits and folded_weight(n)}
        if folded:
            graph = self.candidate.model.graph
            ctx.quantized = quantized_lowerings(graph, set(by_onnx) - folded)

    def order_free(self, groups: dict[str, OrderFree], reordered: set[str]) -> None:
        """Values whose order is free, compared as sets; ``reordered`` gets those found
        the same (``judge/unordered.py``)."""
        self.unordered = groups
        self.ctx.reordered = reordered

    def _set_order(self, group: OrderFree, ref_env: dict, env: dict) -> SetOrder:
        key = group.key
        ref_key = None
        if key is not None and group.key_fx in ref_env:
            ref_key = as_expected(self.pairing.by_onnx[key], ref_env[group.key_fx])
        return SetOrder(group, ref_key, env.get(key) if key is not None else None)

    def start(
        self, cand_env: dict[str, Any], missing: Container[str], specialized: dict[str, Any]
    ) -> None:
        """A run starts: its candidate values, the values not computed for a missing
        input, and the values whose size a decomposition fixed (``specialized.py``)."""
        ctx = self.ctx
        ctx.missing, ctx.specialized = missing, specialized
        ctx.failing = set()  # the values failed in this run (quantization_noise.py)
        # the node computing a value and its inputs, for rules that look at them (a
        # partial of the candidate's method, not the run's: no reference cycle)
        ctx.node_inputs = partial(self.candidate.node_and_inputs, env=cand_env)

    def record(
        self, name, ref_env, cand_env, own, times, cand_times, ref_errors, cand_errors
    ) -> Record:
        """The record of pair ``name``, its verdict from the rules (``judge/rules.py``)."""
        rec = self._record(name, ref_env, cand_env, own, times, cand_times, ref_errors, cand_errors)
        if rec.failed:  # a failure of any kind (a value, a shape, the node's run)
            self.ctx.failing.add(name)
        return rec

    def _record(
        self, name, ref_env, cand_env, own, times, cand_times, ref_errors, cand_errors
    ) -> Record:
        cand, ref, ctx, verdicts = self.candidate, self.reference, self.ctx, self.verdicts
        pair = self.pairing.by_onnx[name]
        fx_name = pair.fx_name
        rec = Record(
            **ref.describe(fx_name),
            **cand.describe_candidate(name),
            ep_time_run=times.get(fx_name),
            onnx_time_run=cand_times.get(name),
            kind=pair.kind,
            paired_by=pair.rule,
        )
        ctx.start(name, pair)
        ctx.ref_error = ref_errors.get(fx_name)
        ctx.cand_error = cand_errors.get(name)
        ctx.note = cand.notes.get(name)
        rule = verdicts.before_values(rec, pair)
        if rule is not None:
            if rule.own_error:
                self.own.judge(rec, pair, name, ref_env.get(fx_name), own, ctx)
            return rec
        want = ref_env.get(fx_name)
        if want is None and fx_name in ref.graph.available:
            want = ref.leaf_value(fx_name)  # a weight of an ONNX reference
        got = cand_env[name] if name in cand_env else cand.initializer(name)
        ctx.inherited = looser_dtype(ref.inherited.get(fx_name), self.own.computed_in.get(name))
        ctx.tie = self.tie_x.pop(name, None) if self.tie_x else None
        group = self.unordered.get(name) if self.unordered else None
        if group is not None:
            ctx.unordered = self._set_order(group, ref_env, cand_env)
            ctx.own_unordered = self._set_order(group, ref_env, own)
        if verdicts.on_values(rec, pair, want, got).own_error:
            self.own.judge(rec, pair, name, want, own, ctx)
            ctx.has_own = name in own
            self.precision.ref_env, self.precision.own = ref_env, own
            ctx.own_values = own
            verdicts.first(STAGE_AFTER, rec, pair, want, got)
        return rec


__all__ = ["PairJudge"]
