"""Saturation: a QuantizeLinear of a static quantization clips its input to the range its
calibration fixed, ``[(qmin - z) s, (qmax - z) s]``.  Inputs beyond that range (the model
run on values unlike those it was calibrated on) make an error no rounding explains: the
clipped elements lose all they exceed the range by.  The value its DequantizeLinear gives
is paired with the torch value quantized (``pairing/quantized.py``), so that torch value
says which of its elements lie outside the range: a failing record names the clipping
node and the share it clips, the fact the user acts on (recalibrate, or check the inputs).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...records import CLIPS_EXPLAIN_NOTE, CLIPS_NOTE, STATUS_FAIL, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_AFTER, RuleContext

CLIPS_MARKER = CLIPS_NOTE  # the culprit's why finds the note in the record's comment by it

# the integer range of each zero point type (onnx.TensorProto data types)
_LIMITS = {
    onnx.TensorProto.UINT8: (0, 255),
    onnx.TensorProto.INT8: (-128, 127),
    onnx.TensorProto.UINT16: (0, 65535),
    onnx.TensorProto.INT16: (-32768, 32767),
}


@dataclass(frozen=True)
class ClipRange:
    """The range a QuantizeLinear represents; values beyond it are clipped."""

    node: str  # the QuantizeLinear's name
    lo: float
    hi: float
    step: float  # its scale: within half a step of the range an element only rounds
    source: str = ""  # the value it quantizes (the QuantizeLinear's input)


def clip_ranges(graph: onnx.GraphProto) -> dict[str, ClipRange]:
    """The clip range of each DequantizeLinear output that dequantizes a QuantizeLinear's
    (an activation's QDQ pair), where the scale and zero point are per-tensor initializers."""
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output if o}
    found: dict[str, ClipRange] = {}
    for dq in graph.node:
        if dq.op_type != "DequantizeLinear" or not dq.input or not dq.output:
            continue
        q = producer.get(dq.input[0])
        if q is None or q.op_type != "QuantizeLinear" or len(q.input) < 2:
            continue
        scale = inits.get(q.input[1])
        zp = inits.get(q.input[2]) if len(q.input) > 2 and q.input[2] else None
        if scale is None or (len(q.input) > 2 and q.input[2] and zp is None):
            continue
        s = numpy_helper.to_array(scale)
        z = numpy_helper.to_array(zp) if zp is not None else np.zeros((), np.uint8)
        limits = _LIMITS.get(zp.data_type if zp is not None else onnx.TensorProto.UINT8)
        if limits is None or s.size != 1 or z.size != 1:
            continue  # per-axis or another type: not said
        step, zero = float(s.reshape(())), int(z.reshape(()))
        lo, hi = (limits[0] - zero) * step, (limits[1] - zero) * step
        found[dq.output[0]] = ClipRange(q.name or q.output[0], lo, hi, step, q.input[0])
    return found


def _as_array(value: Any) -> np.ndarray | None:
    """A value as float64 numbers, None when it is no tensor (an own-error value that
    could not be computed)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().float().numpy()
    if not hasattr(value, "shape"):
        return None
    try:
        return np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        return None


def clipped_share(expected: Any, r: ClipRange) -> float | None:
    """The share of the torch value's elements beyond the range by more than half a step."""
    x = _as_array(expected)
    if x is None or x.size == 0:
        return None
    out = (x < r.lo - r.step / 2) | (x > r.hi + r.step / 2)
    return float(out.mean())


def clipped_excess(expected: Any, r: ClipRange) -> float:
    """The most any element lies beyond the range: what clipping takes off it."""
    x = _as_array(expected)
    if x is None or x.size == 0:
        return 0.0
    return float(max(np.max(r.lo - x), np.max(x - r.hi), 0.0))


def clips_text(r: ClipRange, share: float, value: str) -> str:
    pct = f"{100 * share:.0f}" if share >= 0.01 else f"{100 * share:.2g}"
    return (
        f"{r.node} clips {pct}% of {value}'s elements{CLIPS_MARKER}[{r.lo:.3g}, {r.hi:.3g}]: "
        "recalibrate on inputs like these, or check the inputs' distribution"
    )


def interior_ranges(
    graph: onnx.GraphProto, ranges: Mapping[str, ClipRange], paired: Container[str]
) -> dict[str, tuple[ClipRange, ...]]:
    """For each paired value, the QDQ pairs its own rerun goes through that no pair of its
    own judges (a Linear on a 3-D input lowers to MatMul, a QDQ pair on the MatMul's
    output, and the bias Add: the pair sits inside, on a value no fx node computes)."""
    empty: frozenset[str] = frozenset()
    up: dict[str, frozenset[str]] = {}
    found: dict[str, tuple[ClipRange, ...]] = {}
    for node in graph.node:  # in topological order
        inner: set[str] = set()
        for i in node.input:
            if i and i not in paired:
                inner.update(up.get(i, empty))
                if i in ranges:
                    inner.add(i)
        frozen = frozenset(inner)
        for o in node.output:
            if o:
                up[o] = frozen
                if o in paired and frozen:
                    found[o] = tuple(ranges[d] for d in sorted(frozen))
    return found


def held_sources(graph: onnx.GraphProto, paired: Container[str]) -> dict[str, tuple[str, ...]]:
    """For each paired value, the values the QDQ pairs inside its own rerun quantize: the
    run keeps them until it is judged (``engine/plan.py``), for :class:`Saturation`."""
    inner = interior_ranges(graph, ranges_of(graph), paired)
    return {name: tuple(r.source for r in found) for name, found in inner.items()}


def _own_input(own: Mapping[Any, Any], name: str) -> Any:
    """The value ``name`` in the own-error rerun: recomputed from torch's values, or the
    torch twin's value when it has one."""
    value = own.get(("ref", name))
    return own.get(name) if value is None else value


class Saturation:
    """A failing value of a QDQ pair whose torch twin lies partly outside the pair's
    range, or one whose own rerun goes through a pair that clips the value it quantizes
    (recomputed from torch's values): the record says which node clips how much, and
    whether that clipping accounts for the node's own error (it decides no verdict)."""

    name = "saturation"
    stage = STAGE_AFTER
    own_error = False

    def inert(self, ctx: RuleContext) -> bool:
        # no QDQ pair in the model (both are set once, with the run's judge)
        return not ctx.clip_ranges and not ctx.interior_clips

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.name in ctx.clip_ranges or ctx.name in ctx.interior_clips

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if record.status != STATUS_FAIL:
            return False
        found: list[tuple[ClipRange, Any, str]] = []
        if ctx.name in ctx.clip_ranges:
            found.append((ctx.clip_ranges[ctx.name], expected, ctx.fx_name))
        own = ctx.own_values or {}
        for r in ctx.interior_clips.get(ctx.name, ()):
            found.append((r, _own_input(own, r.source), r.source))
        excess = 0.0
        for r, value, label in found:
            share = clipped_share(value, r)
            if share:
                record.comment = _join(record.comment, clips_text(r, share, label))
                excess = max(excess, clipped_excess(value, r))
        # the node's own error no larger than twice what clipping takes off: the
        # calibration's range makes it, not the export (blame/rules.py says so)
        own_err = record.err_abs2
        if record.passed2 is False and own_err is not None and excess and own_err <= 2 * excess:
            record.comment = _join(record.comment, CLIPS_EXPLAIN_NOTE)
        return False


def ranges_of(graph: onnx.GraphProto) -> Mapping[str, ClipRange]:
    """:func:`clip_ranges`, empty for a graph with no QuantizeLinear (the common case)."""
    if not any(n.op_type == "QuantizeLinear" for n in graph.node):
        return {}
    return clip_ranges(graph)


__all__ = [
    "CLIPS_MARKER",
    "ClipRange",
    "Saturation",
    "clip_ranges",
    "clipped_excess",
    "clipped_share",
    "clips_text",
    "held_sources",
    "interior_ranges",
    "ranges_of",
]
