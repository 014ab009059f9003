"""What the precision advisor returns: the nodes it advises to keep in float32, the
outputs before and after, and the advice as JSON or as the converted model."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import onnx

from ..errors import SbsInputError
from ..files import json_safe, save_onnx_atomic, write_json_atomic
from ..records import Record
from .contract import AnswerContract


@dataclass
class AdvisedNode:
    """One node of the float32 model whose own error in low precision exceeds tolerance."""

    node: str  # its name in the float32 model (what node_block_list takes)
    op_type: str
    value: str  # the value of the float32 model measured
    # max |candidate - reference| of the node rerun on reference inputs (None: not measured)
    own_error: float | None
    relative_error: float | None  # own_error / max |reference value| (inf: overflow)
    scale: float | None  # max |reference value|
    overflow: bool  # the float32 value does not fit the low-precision type
    # why it is named: "fails" (it does not run in the type), "overflow" (its values),
    # "inputs_overflow" (its inputs' values do not fit), "error" (its own error), "feeds"
    # (added in a later round: it feeds a blocked node, whose error comes from rounding
    # this node's output), "largest" (the outputs disagree and no node fails: its own
    # error, within tolerance, is the largest relative to its values' size)
    reason: str = "error"
    error: str | None = None  # what the runtime said, for "fails"
    atol: float = 0.0  # the absolute tolerance it was measured against
    fx_node: str | None = None  # the fx node it lowers (exporter metadata)
    module: str | None = None  # its module path, e.g. "layers.0.mlp"
    round: int = 0  # the conversion round that found it (0: the first conversion)

    @property
    def why(self) -> str:
        if self.reason == "fails":
            return f"it does not run in the type: {self.error}"
        if self.reason == "overflow":
            return f"its values reach {self.scale:.3g}, beyond the type's largest finite value"
        if self.reason == "inputs_overflow":
            return "its inputs' values do not fit the type (they overflow to infinity)"
        if self.reason == "precision_loss":
            return (
                f"precision loss: own error {_num(self.own_error)}, its inputs' rounding "
                "amplified by the op (computed exactly on them it agrees)"
            )
        if self.reason == "feeds":
            return "it feeds a node kept in float32 whose error comes from rounding its inputs"
        if self.reason == "largest":
            return (
                f"own error {_num(self.own_error)}, {_percent(self.relative_error or 0.0)} of "
                "its values' size: within tolerance, the largest of those the outputs amplify"
            )
        return (
            f"own error {self.own_error:.3g}, {_percent(self.relative_error)} of its values' size"
        )


@dataclass
class OutputError:
    """The largest error over the model's outputs against the float32 model's."""

    err_abs: float | None
    err_rel: float | None
    passed: bool
    error: str | None = None  # the model did not run (the runtime's message)


@dataclass
class PrecisionAdvice(AnswerContract):
    """What :func:`advise_precision` found: the ranked nodes, the block list, the outputs'
    error before and after, and the advised model.  A run kind that answers at once:
    its records are those of the last conversion it measured."""

    KIND = "precision"
    LABEL = "the precision advice"

    def answer(self) -> str | None:
        return self.to_text().splitlines()[0]

    dtype: str
    atol: float
    rtol: float
    nodes: list[AdvisedNode]  # ranked, worst first
    node_block_list: list[str]
    op_block_list: list[str]  # the op types of the named nodes, to add to the converter's
    kept: list[str]  # nodes the given conversion already kept in float32
    before: OutputError  # the conversion as given (or made without a block list)
    after: OutputError | None  # converted again with node_block_list (None: no need)
    rounds: int
    compared: int  # low-precision nodes whose own error was measured
    converted_here: bool  # whether the first candidate was converted by the advisor
    keep_io_types: bool
    elapsed: float = 0.0
    model: onnx.ModelProto | None = field(default=None, repr=False)  # the advised model
    # the records of the first round: the float32 model against the conversion as given
    records: list[Record] = field(default_factory=list, repr=False)
    # when the advised conversion still disagrees: why, naming the node and its op
    unresolved: str | None = None

    @property
    def agrees(self) -> bool:
        """The advised conversion's outputs agree with the float32 model's."""
        return (self.after or self.before).passed

    @property
    def verdict(self) -> str:
        return "agrees" if self.agrees else "disagrees"

    def convert_kwargs(self) -> dict[str, Any]:
        """The arguments of ``convert_float_to_float16`` for the advised model.

        ``advice.model`` is that conversion with two repairs onnxconverter-common 1.16
        needs: the weights of the blocked nodes stay float32 (it converts and clamps them
        to +-1e4 too), and graph outputs keep their float32 type (it leaves a blocked
        node's output in float16)."""
        return {"keep_io_types": self.keep_io_types, "node_block_list": list(self.node_block_list)}

    def to_dict(self) -> dict[str, Any]:
        d = {
            "dtype": self.dtype,
            "verdict": self.verdict,
            "atol": self.atol,
            "rtol": self.rtol,
            "node_block_list": list(self.node_block_list),
            "op_block_list": list(self.op_block_list),
            "keep_io_types": self.keep_io_types,
            "kept": list(self.kept),
            "nodes": [{**asdict(n), "why": n.why} for n in self.nodes],
            "before": asdict(self.before),
            "after": asdict(self.after) if self.after is not None else None,
            "rounds": self.rounds,
            "compared": self.compared,
            "converted_here": self.converted_here,
            "elapsed": self.elapsed,
            "unresolved": self.unresolved,
        }
        return json_safe(d)

    def to_text(self, limit: int = 20) -> str:
        lines = [
            f"precision advice ({self.dtype}): {self.verdict.upper()} - "
            f"{len(self.node_block_list)} node(s) to keep in float32 of {self.compared} "
            f"measured (tolerance atol {self.atol:g}, rtol {self.rtol:g})"
        ]
        lines.append(
            f"  outputs as converted{'' if self.converted_here else ' (given)'}: "
            f"{_out_text(self.before)}"
        )
        if self.after is not None:
            lines.append(f"  outputs with the block list: {_out_text(self.after)}")
        if self.nodes:
            lines.append("  nodes to keep in float32, worst first:")
            for k, n in enumerate(self.nodes[:limit], 1):
                where = ", ".join(
                    x for x in (n.fx_node and f"fx {n.fx_node}", n.module and f"in {n.module}") if x
                )
                lines.append(
                    f"  {k:>3}. {n.node} ({n.op_type}){' ' + where if where else ''}: {n.why}"
                )
            if len(self.nodes) > limit:
                lines.append(f"       ... and {len(self.nodes) - limit} more")
            lines.append(f"  node_block_list = {self.node_block_list!r}")
            lines.append(f"  op types: {', '.join(self.op_block_list)}")
        else:
            lines.append(f"  no node's own error in {self.dtype} exceeds the tolerance")
        if self.kept:
            lines.append(f"  kept in float32 by the given conversion: {len(self.kept)} node(s)")
        if self.unresolved:
            lines.append(f"  why it still disagrees: {self.unresolved}")
        return "\n".join(lines)


def _percent(x: float) -> str:
    return "overflow" if not math.isfinite(x) else f"{100 * x:.3g}%"


def _out_text(o: OutputError) -> str:
    if o.error:
        return f"FAILED to run ({o.error})"
    return f"{'agree' if o.passed else 'DISAGREE'} (max abs error {_num(o.err_abs)}, rel {_num(o.err_rel)})"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def write_advice(advice: PrecisionAdvice, path: Any) -> None:
    """The advice as JSON (``node_block_list``, ``op_block_list``, the ranked nodes...),
    written whole or not at all; a link at ``path`` is replaced, not followed."""
    write_json_atomic(path, advice.to_dict())


def save_advised_model(advice: PrecisionAdvice, path: Any) -> None:
    """The model converted with the advised block list, written whole or not at all."""
    if advice.model is None:
        raise SbsInputError("the advice holds no model to save")
    save_onnx_atomic(advice.model, path)
