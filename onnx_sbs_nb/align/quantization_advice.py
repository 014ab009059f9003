"""What the quantization advisor returns: the quantizable nodes ranked by the output SQNR
their quantization costs, the exclusion list in onnxruntime's format, and the output SQNR
before and after, as text, JSON or the re-quantized model."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx

from ..errors import SbsInputError
from ..files import json_safe, save_onnx_atomic, write_json_atomic
from ..records import Record
from .contract import AnswerContract

# a node whose exclusion buys less at the outputs is not advised
LITTLE_DB = 1.0
# below this gain the advice says little is gained: less than half the noise power removed
LITTLE_GAIN_DB = 3.0
# below this output SQNR (an error a tenth of the outputs' size) quantization costs much
LOW_SQNR_DB = 20.0
# where the quantized models run: how a quantized model is deployed (the default session,
# whose optimizers fuse the QDQ pairs into integer kernels and may quantize an excluded node
# again) or the QDQ graph computed as written, in float (the same on every CPU)
EXECUTIONS = {
    "deployed": "a default onnxruntime CPU session (graph optimizations on, as deployed: QDQ "
    "fused into integer kernels, on this CPU)",
    "as-written": "onnxruntime with graph optimizations off (the QDQ graph computed as "
    "written, in float; not how a default session runs it)",
}


@dataclass
class QuantNode:
    """One node the quantizer touches, and what excluding it buys at the outputs."""

    node: str  # its name in the float model (what ``nodes_to_exclude`` takes)
    op_type: str
    # output SQNR (dB) of the model quantized with this node alone excluded, minus the
    # fully quantized model's (None: not tried, see ``tried``)
    gain_db: float | None
    sqnr_excluded: float | None  # output SQNR (dB) with this node alone excluded
    # SQNR (dB) of its output value in the fully quantized model against the float model's
    # (what onnxruntime's qdq_loss_debug calls xmodel_err; None: the quantizer removed it)
    value_sqnr: float | None
    # its own SQNR: the noise it adds to what its inputs carry (noise powers subtracted),
    # the cheap measure that picks the nodes to try when there are too many
    own_sqnr: float | None
    tried: bool  # whether the model was quantized with it excluded
    fx_node: str | None = None  # the fx node it lowers (exporter metadata)
    module: str | None = None  # its module path, e.g. "layers.3"
    # the nodes excluded with it so that a default session keeps it in float (a Gemm/Conv
    # fed by a DequantizeLinear is quantized again by onnxruntime's WeightBiasQuantization:
    # its input's producer goes too); measured and advised together
    with_nodes: list[str] = field(default_factory=list)
    # a default session quantizes it again whatever else is excluded (fed by a graph
    # input's QDQ pair): excluding it buys nothing deployed
    requantized: bool = False

    @property
    def group(self) -> list[str]:
        return [self.node, *self.with_nodes]


@dataclass
class QuantizationAdvice(AnswerContract):
    """What :func:`advise_quantization` found.  A run kind that answers at once (it
    compares whole models' outputs, so it holds no node records)."""

    KIND = "quantization"
    LABEL = "the quantization advice"

    def answer(self) -> str | None:
        return self.to_text().splitlines()[0]

    mode: str  # "dynamic" or "static"
    settings: dict[str, Any]  # the quantizer's arguments (format, per_channel, types...)
    quantizable: int  # nodes the quantizer touches
    nodes: list[QuantNode]  # the candidates, ranked by gain (best first), untried last
    nodes_to_exclude: list[str]  # the advice, in the order chosen
    op_types_to_quantize: list[str]  # the op types quantized (onnxruntime's argument)
    before: float  # output SQNR (dB) of the model quantized as asked
    after: float  # output SQNR (dB) quantized again with nodes_to_exclude
    outputs_before: dict[str, float]  # per graph output
    outputs_after: dict[str, float]
    budget: int  # the most nodes the advice may exclude
    target_db: float | None  # the output SQNR that stops the search (None: the budget)
    samples: int  # inputs the SQNR is measured on (and calibrated on, for static)
    quantizations: int  # how many times the model was quantized
    elapsed: float = 0.0
    execution: str = "deployed"  # where the SQNRs were measured (a key of EXECUTIONS)
    # the same two models measured in the other execution: {"execution", "before", "after"}
    other: dict[str, Any] = field(default_factory=dict)
    # advised nodes a default session quantizes again (WeightBiasQuantization)
    requantized: list[str] = field(default_factory=list)
    # the advice without the nodes excluded only to keep a Conv/Gemm float in a default
    # session, deployed with that session's WeightBiasQuantization off instead:
    # {"nodes_to_exclude", "disabled_optimizers", "sqnr_db"} ({}: none)
    alternative: dict[str, Any] = field(default_factory=dict)

    def alternative_text(self) -> str | None:
        """The alternative, when it keeps LITTLE_DB more than the advice does deployed."""
        alt = self.alternative
        deployed = self.after if self.execution == "deployed" else self.other.get("after")
        if not alt or deployed is None or alt["sqnr_db"] < deployed + LITTLE_DB:
            return None
        return (
            f"or nodes_to_exclude = {alt['nodes_to_exclude']!r}, deployed with "
            f"InferenceSession(..., disabled_optimizers={alt['disabled_optimizers']!r}) (the "
            "optimizer that quantizes them again; the other fusions stay): "
            f"{_db(alt['sqnr_db'])} in that session"
        )

    model: onnx.ModelProto | None = field(default=None, repr=False)  # quantized with the advice
    steps: list[dict[str, Any]] = field(default_factory=list)  # the greedy steps taken
    records: list[Record] = field(default_factory=list, repr=False)

    @property
    def gain(self) -> float:
        return self.after - self.before

    @property
    def little_gained(self) -> bool:
        """Excluding nodes (within the budget) buys less than 3 dB at the outputs."""
        return not self.nodes_to_exclude or self.gain < LITTLE_GAIN_DB

    def why_little(self) -> str:
        """Why excluding nodes buys little: the noise is spread, the best exclusion needs more
        nodes than the budget, a session quantizes the node again, or (the outputs lose
        much) it sits in a value several quantized nodes share."""
        best = next((n for n in self.nodes if n.gain_db is not None), None)
        alone = ""
        if best is not None:
            what = best.node + (f" with {', '.join(best.with_nodes)}" if best.with_nodes else "")
            alone = f" (the best single exclusion, {what}, buys {_db(best.gain_db)})"
        head = f"little is gained by excluding nodes (under {LITTLE_GAIN_DB:g} dB){alone}"
        if best is not None and (best.gain_db or 0.0) >= LITTLE_GAIN_DB:
            if len(best.group) > self.budget and best.node not in self.nodes_to_exclude:
                return (
                    f"{head}: it needs {len(best.group)} nodes excluded (a default session "
                    "quantizes the node again unless its input's producer stays in float too), "
                    f"over the budget of {self.budget}: pass budget={len(best.group)}, or "
                    f"exclude {best.node} alone and deploy with InferenceSession(..., "
                    "disabled_optimizers=['WeightBiasQuantization']) (not measured here)"
                )
        if self.after >= LOW_SQNR_DB:
            return f"{head}: the quantization noise is spread, no node's own quantization dominates"
        return (
            f"{head}, yet the outputs keep only {_db(self.after)}: the error likely sits in a "
            "value several quantized nodes share (its QuantizeLinear/DequantizeLinear pair stays "
            "while any of them is quantized), such as an activation with outlier channels; try a "
            "larger budget, per_channel, or that tensor in 16 bits (extra_options "
            "TensorQuantOverrides)"
        )

    def disagreement(self) -> str | None:
        """What the other execution makes of the advised exclusions, when it gains otherwise."""
        o = self.other
        if not o or not self.nodes_to_exclude:
            return None
        gain = o["after"] - o["before"]
        if abs(gain - self.gain) < LITTLE_DB:
            return None
        where = "in a default session" if o["execution"] == "deployed" else "run as written"
        why = (
            f" (a default session quantizes {', '.join(self.requantized)} again: onnxruntime's "
            "WeightBiasQuantization optimizer quantizes the weights of a Conv/Gemm fed by a "
            "DequantizeLinear, per tensor)"
            if self.requantized
            else ""
        )
        return (
            f"the executions disagree: {where} the same exclusion gains {_db(gain)} "
            f"({_db(o['before'])} -> {_db(o['after'])}){why}"
        )

    def quantize_kwargs(self) -> dict[str, Any]:
        """The arguments to add to ``quantize_dynamic`` / ``quantize_static``."""
        return {
            "nodes_to_exclude": list(self.nodes_to_exclude),
            "op_types_to_quantize": list(self.op_types_to_quantize),
        }

    def to_dict(self) -> dict[str, Any]:
        d = {
            "mode": self.mode,
            "settings": dict(self.settings),
            "nodes_to_exclude": list(self.nodes_to_exclude),
            "op_types_to_quantize": list(self.op_types_to_quantize),
            "sqnr_before_db": self.before,
            "sqnr_after_db": self.after,
            "gain_db": self.gain,
            "little_gained": self.little_gained,
            "why_little": self.why_little() if self.little_gained else None,
            "outputs_before_db": dict(self.outputs_before),
            "outputs_after_db": dict(self.outputs_after),
            "quantizable": self.quantizable,
            "budget": self.budget,
            "target_db": self.target_db,
            "samples": self.samples,
            "quantizations": self.quantizations,
            "nodes": [asdict(n) for n in self.nodes],
            "steps": list(self.steps),
            "elapsed": self.elapsed,
            "execution": self.execution,
            "other_execution": dict(self.other) or None,
            "disagreement": self.disagreement(),
            "requantized_in_session": list(self.requantized),
            "alternative": dict(self.alternative) or None,
        }
        return json_safe(d)

    def to_text(self, limit: int = 15) -> str:
        how = ", ".join(f"{k}={v}" for k, v in self.settings.items() if v not in (None, False))
        lines = [
            f"quantization advice ({self.mode}{', ' + how if how else ''}): output SQNR "
            f"{_db(self.before)} quantized as asked, {_db(self.after)} with "
            f"{len(self.nodes_to_exclude)} node(s) excluded (gain {_db(self.gain)}; "
            f"{self.quantizable} nodes quantized, budget {self.budget}, "
            f"{self.quantizations} quantizations on {self.samples} input(s))",
            f"  output SQNRs measured in {EXECUTIONS.get(self.execution, self.execution)}",
        ]
        other = self.disagreement()
        if other:
            lines.append(f"  {other}")
        elif self.requantized:
            lines.append(
                f"  a default session quantizes {', '.join(self.requantized)} again "
                "(onnxruntime's WeightBiasQuantization: a Conv/Gemm fed by a DequantizeLinear)"
            )
        if self.little_gained:
            lines.append(f"  {self.why_little()}")
        lines.append("  nodes by the output SQNR excluding them buys, best first:")
        missing = False
        for k, n in enumerate(self.nodes[:limit], 1):
            where = ", ".join(
                x for x in (n.fx_node and f"fx {n.fx_node}", n.module and f"in {n.module}") if x
            )
            gain = f"gain {_db(n.gain_db)}" if n.tried else "not tried"
            if n.with_nodes:
                gain += f" (with {', '.join(n.with_nodes)} excluded too)"
            if n.requantized:
                gain += " (a default session quantizes it again: fed by an input's QDQ pair)"
            missing = missing or n.value_sqnr is None
            lines.append(
                f"  {k:>3}. {n.node} ({n.op_type}){' ' + where if where else ''}: {gain}, "
                f"its value's SQNR {_db(n.value_sqnr)}, own {_db(n.own_sqnr)}"
            )
        if len(self.nodes) > limit:
            lines.append(f"       ... and {len(self.nodes) - limit} more")
        lines.append(
            "  (values' SQNR: the graph as written, where each value exists"
            + (
                "; n/a: the quantized graph holds no float value of that node's output, an "
                "integer op replaced it)"
                if missing
                else ")"
            )
        )
        if self.nodes_to_exclude:
            lines.append(f"  nodes_to_exclude = {self.nodes_to_exclude!r}")
            alt = self.alternative_text()
            if alt:
                lines.append(f"  {alt}")
        return "\n".join(lines)


def _db(x: float | None) -> str:
    if x is None:
        return "n/a"
    return "exact" if math.isinf(x) and x > 0 else f"{x:.1f} dB"


def write_quantization_advice(advice: QuantizationAdvice, path: Any) -> None:
    """The advice as JSON (``nodes_to_exclude``, the ranked nodes, the SQNRs), written whole
    or not at all; a link at ``path`` is replaced, not followed."""
    write_json_atomic(path, advice.to_dict())


def save_quantized_model(advice: QuantizationAdvice, path: Any) -> None:
    """The model quantized with the advised exclusion list, written whole or not at all."""
    if advice.model is None:
        raise SbsInputError("the advice holds no model to save")
    save_onnx_atomic(advice.model, path)
