"""Saturation: a QuantizeLinear of a static quantization clips its input to the range its
calibration fixed, ``[(qmin - z) s, (qmax - z) s]``.  Inputs beyond that range (the model
run on values unlike those it was calibrated on) make an error no rounding explains: the
clipped elements lose all they exceed the range by.  The value its DequantizeLinear gives
is paired with the torch value quantized (``pairing/quantized.py``), so that torch value
says which of its elements lie outside the range: a failing record names the clipping
node and the share it clips, the fact the user acts on (recalibrate, or check the inputs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...records import CLIPS_NOTE, STATUS_FAIL, Record
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
        found[dq.output[0]] = ClipRange(q.name or q.output[0], lo, hi, step)
    return found


def clipped_share(expected: Any, r: ClipRange) -> float | None:
    """The share of the torch value's elements beyond the range by more than half a step."""
    x = expected.detach().cpu().float().numpy() if hasattr(expected, "detach") else expected
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return None
    out = (x < r.lo - r.step / 2) | (x > r.hi + r.step / 2)
    return float(out.mean())


def clips_text(r: ClipRange, share: float, value: str) -> str:
    pct = f"{100 * share:.0f}" if share >= 0.01 else f"{100 * share:.2g}"
    return (
        f"{r.node} clips {pct}% of {value}'s elements{CLIPS_MARKER}[{r.lo:.3g}, {r.hi:.3g}]: "
        "recalibrate on inputs like these, or check the inputs' distribution"
    )


class Saturation:
    """A failing value of a QDQ pair whose torch twin lies partly outside the pair's
    range: the record says which node clips how much (it decides no verdict)."""

    name = "saturation"
    stage = STAGE_AFTER
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.name in ctx.clip_ranges

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if record.status != STATUS_FAIL:
            return False
        r = ctx.clip_ranges[ctx.name]
        share = clipped_share(expected, r)
        if share:
            record.comment = _join(record.comment, clips_text(r, share, ctx.fx_name))
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
    "clipped_share",
    "clips_text",
    "ranges_of",
]
