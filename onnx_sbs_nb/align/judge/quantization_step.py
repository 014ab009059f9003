"""Quantization step: a quantized value judged element by element against its own grid.

Rounding to nearest with scale ``s`` (per tensor, per axis or per block; zero point
``z``) puts every element within ``s/2`` of the float value it quantizes, plus float
rounding, plus how far the value lies beyond the range the grid holds (``(qmin − z)·s``
to ``(qmax − z)·s``: what clipping takes).  The SQNR of a whole tensor hides a fault on a
part of it (one channel of N costs ~10·log10(N) dB); this bound does not:

- a quantized **weight** (a ``DequantizeLinear`` of an initializer, a float view of an
  integer or ``MatMulNBits`` weight, ``pairing/float_views.py``): its error is its own,
  and any element further from the torch weight than half its step is a fault (a
  channel's scale x2, a zero point off, flipped nibbles), whatever the SQNR: the record
  fails, decided here, before :class:`~.quantization_noise.QuantizationNoise` can call it
  noise.  Two tiers, as GPTQ (rounding with error feedback) moves elements by more than
  half a step on purpose (onnxruntime's GPTQ, int4 blocks of 32, on the tests' MLP: 24 to
  32% of elements, up to 7.7 steps, blocks down to 10.3 dB, under the 12 dB floor):

  1. a weight otherwise round to nearest (at most :data:`RTN_STRAYS` of its elements
     beyond half a step; GPTQ's are some 25%): any element beyond is a fault;
  2. else only an element in a unit sharing one scale (a channel, a block) whose values
     are off as a whole: a gain ``Σ g·e / Σ e²`` off 1 by more than :data:`GAIN_TOLERANCE`
     (a scale x1.3, x2, a sign flipped) or a mean error beyond :data:`MEAN_TOLERANCE`
     steps (a zero point off).  GPTQ's units measured: gains 0.86 to 1.09, mean errors
     0.34 step at most (the MLP); 0.84 to 1.16, 0.39 step (the corpus' two-layer
     decoder, 15 weights, blocks of 16); round to nearest's 0.96 to 1.04, 0.2 step.  Otherwise the weight
     is another algorithm's rounding: a comment says so, and the SQNR floor decides.

  A weight that is round to nearest once each unit is divided by its own gain has a
  scale off by that gain, however small (x1.03 moves most elements of an int8 weight
  several steps): a fault; GPTQ's moves are not undone by any one gain per unit.
  A lone element a few steps off in a GPTQ weight is beyond what this can tell from the
  algorithm's own moves: not claimed;
- a quantized **activation** whose own rerun (the node on torch's inputs, quantized as
  the model does) stays within half its own output step: that own error is the rounding
  the quantization must make, not the node's: its own error passes (``passed2``), as
  ``ties.py`` passes a TopK tie, and the node is no culprit that "makes the error".

The grid is read off the node computing the value (``ctx.node_inputs``): a
``DequantizeLinear``'s scale, zero point, axis and block size; a ``MatMulNBits`` weight
view's scales, zero points, bits and block size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ...records import QUANTIZATION_STEP_FAULT, STATUS_FAIL, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_AFTER, RuleContext
from .judging import as_expected, comparable, in_layout_of

#: how far past half a step an element may be (the scale itself is rounded to float)
STEP_SLACK = 1e-3
#: the share of a weight's elements beyond half a step up to which it is round to nearest
#: with faults (tier 1): a channel of 64 off is 1.6%; GPTQ moves some 25% (docstring)
RTN_STRAYS = 0.01
#: how far off 1 a unit's gain may be from another algorithm's rounding (GPTQ: 0.16)
GAIN_TOLERANCE = 0.25
#: how far its mean error may be, in steps (GPTQ: 0.39; a zero point off by one: 1)
MEAN_TOLERANCE = 0.75

# by dtype name: int4/uint4 are ml_dtypes' (what onnx gives an int4 initializer as)
_INT_RANGES = {
    "int4": (-8, 7),
    "uint4": (0, 15),
    "int8": (-128, 127),
    "uint8": (0, 255),
    "int16": (-32768, 32767),
    "uint16": (0, 65535),
    "int32": (-(2**31), 2**31 - 1),
}

STEP_FAULT_NOTE = QUANTIZATION_STEP_FAULT + (
    ": {bad} of {size} elements are further from the torch value than half their own "
    "quantization step (round to nearest keeps every element within it), up to "
    "{steps:.1f} steps at element {index} of the model's value{where}{how}: a wrong "
    "scale, zero point or packing, not quantization noise"
)
#: why tier 2 fails a unit (module docstring)
STEP_UNIT_NOTE = (
    ", whose values are off as a whole (gain {gain:.2f}, mean error {mean:+.2f} steps: "
    "no rounding, GPTQ's included, moves a block by that much)"
)
STEP_SCALED_NOTE = (
    ", whose values are round to nearest once divided by their gain {gain:.4g} (mean error "
    "{mean:+.2f} steps): its scale is off by that factor, which no rounding does"
)
STEP_OTHER_ROUNDING_NOTE = (
    "not round to nearest (GPTQ/HQQ-style rounding): {bad} of {size} elements beyond half "
    "their step, up to {steps:.1f} steps, but every block's gain (worst {gain:.2f}) and "
    "mean error (worst {mean:.2f} steps) within the block's noise"
)
STEP_ROUNDING_NOTE = (
    "its own error {own} is within half its output's quantization step {step}: the "
    "rounding its quantization makes, not an error of its own"
)


@dataclass
class Grid:
    """The quantization grid of a value, per element (broadcast to the value's shape)."""

    step: np.ndarray  # |scale|
    low: np.ndarray  # the least and greatest values it holds
    high: np.ndarray
    axis: int | None = None  # the axis the scales vary along (None: one scale)
    block: int = 0  # ... by blocks of this many elements (0: one per index)
    # a MatMulNBits view [K, N]: blocks along K, one scale per column n
    label: str = "channel"

    def where(self, index: tuple[int, ...]) -> str:
        """Which channel or block of scales element ``index`` belongs to."""
        if self.axis is None:
            return ""
        k = index[self.axis]
        if self.block:
            other = [i for a, i in enumerate(index) if a != self.axis]
            of = f"{self.label} {other[0]}, " if len(other) == 1 else ""
            b = k // self.block
            return f" ({of}block {b} of {self.block} elements along axis {self.axis})"
        return f" ({self.label} {k} along axis {self.axis})"


def _array(value: Any) -> np.ndarray | None:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if value.dtype == torch.bfloat16:
            return value.float().numpy()
        try:
            return value.numpy()
        except TypeError:
            # a torch low-bit type numpy has none of (int4 from the torch runner): its
            # integer range is unknown here, so the value is left to the other rules
            return None
    return np.asarray(value)


def _attr(node: Any, name: str, default: int) -> int:
    return next((a.i for a in node.attribute if a.name == name), default)


def _spread(a: np.ndarray, shape: tuple[int, ...], axis: int | None, block: int) -> np.ndarray:
    """Per-tensor, per-axis or blocked parameters ``a`` broadcast to ``shape``."""
    if a.size == 1:
        return np.broadcast_to(a.reshape(()), shape)
    assert axis is not None
    if block:
        return np.repeat(a, block, axis=axis).take(range(shape[axis]), axis=axis)
    dims = [1] * len(shape)
    dims[axis] = a.size
    return np.broadcast_to(a.reshape(dims), shape)


def _grid(step_s: np.ndarray, z: Any, qmin: int, qmax: int, **kw: Any) -> Grid:
    # float32 (not 64): a large model's weights are judged one after another, each grid
    # as large as its weight; the bound holds to float32's rounding (``_weight_fault``)
    s = step_s.astype(np.float32)
    ends = ((np.float32(qmin) - z) * s, (np.float32(qmax) - z) * s)
    return Grid(np.abs(s), np.minimum(*ends), np.maximum(*ends), **kw)


def dequantize_grid(node: Any, inputs: list[Any], shape: tuple[int, ...]) -> Grid | None:
    """The grid of a ``DequantizeLinear``'s output of ``shape``, None when it cannot be
    read (a float8 input, parameters of a shape it does not know)."""
    x, scale = _array(inputs[0]), _array(inputs[1])
    zp = _array(inputs[2]) if len(inputs) > 2 else None
    if x is None or scale is None or x.dtype.name not in _INT_RANGES or x.shape != shape:
        return None
    qmin, qmax = _INT_RANGES[x.dtype.name]
    axis: int | None = None
    block = 0
    if scale.size > 1:
        axis = _attr(node, "axis", 1) % max(len(shape), 1)
        block = _attr(node, "block_size", 0)
    try:
        s = _spread(scale, shape, axis, block)
        z = _spread(zp.astype(np.float32), shape, axis, block) if zp is not None else 0.0
    except (ValueError, IndexError):
        return None
    return _grid(s, z, qmin, qmax, axis=axis, block=block)


def nbits_grid(node: Any, inputs: list[Any], shape: tuple[int, ...]) -> Grid | None:
    """The grid of a ``MatMulNBits`` weight view (``[K, N]``, ``float_views.py``): block
    ``b`` of column ``n`` has scale ``scales[n, b]``, its zero point packed ``bits`` to a
    byte (``2**(bits-1)`` without one); None for group indices or float zero points."""
    k, n = _attr(node, "K", 0), _attr(node, "N", 0)
    bits, block = _attr(node, "bits", 4), _attr(node, "block_size", 0)
    if shape != (k, n) or not block or len(inputs) < 3 or 8 % bits:
        return None
    if len(inputs) > 4 and inputs[4] is not None and node.input[4]:
        return None  # act-order group indices: blocks are not contiguous
    blocks = -(-k // block)
    scales = _array(inputs[2])
    if scales is None or scales.size != n * blocks:
        return None
    scales = scales.reshape(n, blocks)
    zp = _array(inputs[3]) if len(inputs) > 3 and node.input[3] else None
    if zp is None:
        z = np.full((n, blocks), 2 ** (bits - 1), np.float32)
    elif zp.dtype == np.uint8:
        per_byte = 8 // bits
        row = -(-blocks // per_byte)
        if zp.size != n * row:
            return None
        packed = zp.reshape(n, row, 1)
        shifts = np.arange(per_byte, dtype=np.uint8) * bits
        z = ((packed >> shifts) & ((1 << bits) - 1)).reshape(n, row * per_byte)[:, :blocks]
    else:
        return None  # float zero points: not a grid of integers
    s = np.repeat(scales, block, axis=1)[:, :k].T  # [K, N]
    z = np.repeat(z.astype(np.float32), block, axis=1)[:, :k].T
    return _grid(s, z, 0, 2**bits - 1, axis=0, block=block, label="column")


def grid_of(ctx: RuleContext, shape: tuple[int, ...]) -> Grid | None:
    """The grid of the value being judged (``ctx.name``), from the node computing it."""
    if ctx.node_inputs is None:
        return None
    found = ctx.node_inputs(ctx.name)
    if found is None or found[1] is None:
        return None
    node, inputs = found
    if node.op_type == "DequantizeLinear" and len(inputs) >= 2:
        return dequantize_grid(node, inputs, shape)
    if node.op_type == "MatMulNBits" and node.output[0].endswith("_float_view"):
        return nbits_grid(node, inputs, shape)
    return None


def _is_weight(ctx: RuleContext) -> bool:
    """Whether the value dequantizes a constant (its error is its own): no node computes
    the node's quantized input (an initializer)."""
    found = ctx.node_inputs(ctx.name) if ctx.node_inputs is not None else None
    if found is None:
        return False
    node = found[0]
    if node.op_type == "MatMulNBits":
        return True  # a weight view (grid_of checked)
    return ctx.node_inputs(node.input[0]) is None


class QuantizationStep:
    """A failing quantized weight with an element beyond half its step fails, decided
    here; an activation whose own error is within half its output's step passes its own
    error (module docstring)."""

    name = "quantization_step"
    stage = STAGE_AFTER
    own_error = False

    def inert(self, ctx: RuleContext) -> bool:
        return ctx.quant_bits is None  # not a quantized model (set with the run's judge)

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.quant_bits is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if record.status != STATUS_FAIL or ctx.pair is None:
            return False
        want, have = comparable(as_expected(ctx.pair, expected), got)
        want = in_layout_of(ctx.pair, want, have)
        if want is None:
            return False
        e, g = _array(want), _array(have)
        if e is None or g is None or e.shape != g.shape:
            return False
        grid = grid_of(ctx, tuple(g.shape))
        if grid is None:
            return False
        if _is_weight(ctx):
            if ctx.folded_weight is not None and ctx.folded_weight(ctx.name):
                return False  # folded by design: its consumer judges it (weight_blame.py)
            return _weight_fault(record, e.astype(np.float32), g, grid, _eps(have))
        _own_rounding(record, grid)
        return False


def _eps(value: Any) -> float:
    """The relative rounding of ``value``'s float type (float32's at least: the judge
    computes in it); a bfloat16 or float16 weight is rounded by its type's."""
    dtype = getattr(value, "dtype", None)
    if isinstance(dtype, torch.dtype):
        own = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    else:
        own = (
            np.finfo(dtype).eps if dtype is not None and np.issubdtype(dtype, np.floating) else 0.0
        )
    return max(float(own), float(np.finfo(np.float32).eps))


def _units(grid: Grid, shape: tuple[int, ...]) -> np.ndarray:
    """Per element, the index of the unit sharing its scale: the tensor, a channel along
    ``grid.axis``, or a block of ``grid.block`` along it within one index of the rest."""
    if grid.axis is None or not shape:
        return np.zeros(shape, np.int64)
    idx = np.indices(shape)
    along = idx[grid.axis]
    if not grid.block:
        return along
    rest = tuple(np.delete(idx, grid.axis, axis=0))
    other = np.ravel_multi_index(rest, tuple(np.delete(shape, grid.axis))) if rest else 0
    return other * (-(-shape[grid.axis] // grid.block)) + along // grid.block


def _unit_stats(
    e: np.ndarray, g: np.ndarray, grid: Grid, units: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per unit: its gain ``Σ g·e / Σ e²`` (1 where ``e`` is all zero) and its mean error
    in steps."""
    flat = units.reshape(-1)
    e64, g64 = e.reshape(-1).astype(np.float64), g.reshape(-1).astype(np.float64)
    step = grid.step.reshape(-1)
    ee = np.bincount(flat, e64 * e64)
    with np.errstate(divide="ignore", invalid="ignore"):
        gain = np.where(ee > 0, np.bincount(flat, e64 * g64) / ee, 1.0)
        off = np.where(step > 0, (g64 - e64) / step, 0.0)
    mean = np.bincount(flat, off) / np.maximum(np.bincount(flat), 1)
    return gain, mean


def _allowed(e: np.ndarray, g: np.ndarray, grid: Grid, eps: float, gain: Any = 1.0) -> Any:
    """How far each element of ``g`` may be from ``e`` (half its step, what clipping to
    the grid takes, float rounding) on the grid scaled by ``gain``, and the clipping."""
    low, high = grid.low / gain, grid.high / gain
    clipped = np.maximum(0.0, np.maximum(low - e, e - high))
    allowed = 0.5 * grid.step / np.abs(gain) * (1 + STEP_SLACK) + clipped
    return allowed + eps * (np.abs(e) + np.abs(g)), clipped


def _round_to_nearest_but_scales(
    e: np.ndarray, g: np.ndarray, grid: Grid, eps: float, units: np.ndarray, gain: np.ndarray
) -> bool:
    """Whether ``g`` is round to nearest once each unit is divided by its gain: its
    scales are off, its rounding is not (another algorithm's rounding, GPTQ's, moves
    elements that no one gain per unit brings back within half a step)."""
    per = gain[units]
    if np.any(per == 0):
        return False
    rescaled = g / per
    allowed, _ = _allowed(e, rescaled, grid, eps, per)
    return float((np.abs(rescaled - e) > allowed).mean()) <= RTN_STRAYS


def _weight_fault(record: Record, e: np.ndarray, g: np.ndarray, grid: Grid, eps: float) -> bool:
    """Fails ``record`` (and returns True) when an element of weight ``g`` is further from
    ``e`` than half its step, what clipping takes and float rounding (``eps``) allow, and
    the weight is otherwise round to nearest or the element's unit is off as a whole
    (module docstring: the two tiers); another algorithm's rounding gets a comment."""
    g = g.astype(np.float32)
    err = np.abs(g - e)
    allowed, clipped = _allowed(e, g, grid, eps)
    bad = err > allowed
    if not bad.any():
        return False
    with np.errstate(divide="ignore", invalid="ignore"):
        steps = np.where(grid.step > 0, (err - clipped) / grid.step, np.inf)
    stats = None
    if bad.mean() > RTN_STRAYS:  # tier 2: only the units off as a whole
        units = _units(grid, g.shape)
        gain, mean = _unit_stats(e, g, grid, units)
        off = ((np.abs(gain - 1) > GAIN_TOLERANCE) | (np.abs(mean) > MEAN_TOLERANCE))[units]
        scaled = _round_to_nearest_but_scales(e, g, grid, eps, units, gain)
        if scaled:
            off[:] = True  # a scale off by a little (x1.03) is still a wrong scale
        if not (bad & off).any():
            note = STEP_OTHER_ROUNDING_NOTE.format(
                bad=int(bad.sum()),
                size=g.size,
                steps=float(np.max(np.where(bad, steps, 0.0))),
                gain=float(gain[np.argmax(np.abs(gain - 1))]),
                mean=float(np.max(np.abs(mean))),
            )
            record.comment = _join(record.comment, note)
            return False
        bad &= off
        stats = units, gain, mean, scaled
    worst = np.unravel_index(int(np.argmax(np.where(bad, steps, -1.0))), g.shape)
    index = tuple(int(i) for i in worst)
    how = ""
    if stats is not None:
        unit = stats[0][worst]
        note = STEP_SCALED_NOTE if stats[3] else STEP_UNIT_NOTE
        how = note.format(gain=float(stats[1][unit]), mean=float(stats[2][unit]))
    record.status = STATUS_FAIL
    record.comment = _join(
        record.comment,
        STEP_FAULT_NOTE.format(
            bad=int(bad.sum()),
            size=g.size,
            steps=float(steps[worst]),
            index=list(index),
            where=grid.where(index),
            how=how,
        ),
    )
    return True


def _own_rounding(record: Record, grid: Grid) -> None:
    """An own error (largest, ``err_abs2``) within half the smallest step of the value's
    grid passes: it is the rounding of the node's output."""
    own = record.err_abs2
    if record.passed2 is not False or own is None or not grid.step.size:
        return
    step = float(np.min(grid.step))
    if not own <= 0.5 * step * (1 + STEP_SLACK):
        return
    record.passed2 = True
    record.comment = _join(
        record.comment, STEP_ROUNDING_NOTE.format(own=f"{own:.3g}", step=f"{step:.3g}")
    )


__all__ = [
    "GAIN_TOLERANCE",
    "MEAN_TOLERANCE",
    "RTN_STRAYS",
    "STEP_FAULT_NOTE",
    "STEP_OTHER_ROUNDING_NOTE",
    "STEP_ROUNDING_NOTE",
    "Grid",
    "QuantizationStep",
    "dequantize_grid",
    "grid_of",
    "nbits_grid",
]
