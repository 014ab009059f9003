"""Quantization noise: a quantized model's value off by what its quantization explains.

A model quantized to int8 (onnxruntime's ``quantize_static`` / ``quantize_dynamic``)
computes every quantized value to within a few of its quantization steps, so every value
after the first quantization fails a float tolerance: that is what quantizing means, not
the model's fault.  The measure is the SQNR (``err_snr``, 10·log10 of the signal's energy
over the error's): rounding a value to ``b`` bits over its range gives about
``6.02·b + 1.76`` dB on a uniform signal, less on a peaked one (the range is set by the
largest values), and a few quantized ops in a row lose a few dB more.  A value whose SQNR
stays above :func:`noise_floor` (``6.02·b − 28``: 20 dB for int8, 12 dB at least), and whose
own rerun on the torch values of its inputs (the node's quantization of those values as
the model quantizes them, with its own scales and zero points; a rerun that quantizes
nothing, a float node's, proves an error of its own) stays above :func:`own_noise_floor`
(``6.02·b − 20``: one node's quantization, none accumulated), is *quantization noise*:
status ``quantization_noise``, failing nothing.  A value under the first floor whose own
error is noise and whose rerun's sources (:func:`rerun_sources`) failed nothing amplifies
their noise (cos of a quantized timestep): noise too, said amplified.

A wrong scale (x2) makes the value's error as large as the value (about 0 dB); a zero
point off by 10 shifts it by ten steps, a swapped op (Sub for Add) by a whole operand:
their own reruns fall below the own floor, they stay failures and the culprit rules name
them.  The floor cannot tell a fault smaller than the noise around it from that noise.
"""

from __future__ import annotations

import math
from collections.abc import Container
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ...records import QUANTIZATION_AMPLIFIED, STATUS_FAIL, STATUS_QUANTIZATION_NOISE, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from ..pairing.quantized import QUANT_OPS
from .context import STAGE_AFTER, RuleContext

QUANTIZATION_NOISE_NOTE = (
    "quantization noise: SQNR {snr} dB{own}, above the {floor:.0f} dB that {bits}-bit "
    "quantization allows for (6.02·bits − 28, 12 at least): the model's own scales and zero points "
    "explain the error, no fault of the export"
)

AMPLIFIED_NOISE_NOTE = (
    QUANTIZATION_AMPLIFIED + ": SQNR {snr} dB, under the {floor:.0f} dB that "
    "{bits}-bit quantization allows for, but the node's own error is quantization noise"
    "{own} and the values it is computed from are quantization noise too: it amplifies "
    "their noise (a loss of accuracy of the quantized model), no fault of the export"
)

_BITS = {
    onnx.TensorProto.INT8: 8,
    onnx.TensorProto.UINT8: 8,
    onnx.TensorProto.INT16: 16,
    onnx.TensorProto.UINT16: 16,
    onnx.TensorProto.INT4: 4,
    onnx.TensorProto.UINT4: 4,
    onnx.TensorProto.FLOAT8E4M3FN: 8,
    onnx.TensorProto.FLOAT8E5M2: 8,
}


def quantization_bits(graph: onnx.GraphProto) -> int | None:
    """The bit width of the narrowest quantized values of ``graph`` (its quantized
    initializers and zero points; ``DynamicQuantizeLinear`` makes uint8, ``MatMulNBits``
    its ``bits``), None when it quantizes nothing."""
    inits = {i.name: i.data_type for i in graph.initializer}
    found: list[int] = []
    for node in graph.node:
        if node.op_type not in QUANT_OPS:
            continue
        if node.op_type == "DynamicQuantizeLinear":
            found.append(8)
        if node.op_type == "MatMulNBits":
            bits = [a.i for a in node.attribute if a.name == "bits"]
            found.append(bits[0] if bits else 4)
        found.extend(_BITS[inits[i]] for i in node.input if inits.get(i) in _BITS)
    return min(found) if found else None


def noise_bits(candidate: onnx.GraphProto, reference: Any) -> int | None:
    """The bit width the noise rule judges with: the candidate's (:func:`quantization_bits`)
    when the reference computes in float, None when the reference quantizes too (a torch
    program with quantize/dequantize ops, a quantized ONNX model): both sides then round on
    the same grid, and a step between them is a difference, not noise."""
    bits = quantization_bits(candidate)
    if bits is None:
        return None
    model = getattr(reference, "model", None)
    if isinstance(model, onnx.ModelProto) and quantization_bits(model.graph) is not None:
        return None
    gm = getattr(reference, "graph_module", None)
    if gm is not None and any(
        n.op == "call_function" and "quantize" in str(n.target) for n in gm.graph.nodes
    ):
        return None
    return bits


def quantized_lowerings(graph: onnx.GraphProto, paired: Container[str]) -> frozenset[str]:
    """The paired values whose own rerun (from the torch values of the paired values it
    reads) goes through a quantization node: only their own error can be quantization
    noise; a float node rerun on torch's values alone (a Relu after a dequantized value)
    quantizes nothing, and any error of its own is its fault."""
    through: set[str] = set()
    for node in graph.node:  # in topological order
        if node.op_type in QUANT_OPS or any(
            i in through and i not in paired for i in node.input if i
        ):
            through.update(o for o in node.output if o)
    return frozenset(v for v in through if v in paired)


# the least floor at any width: 6.02·b − 28 is below zero at 4 bits, which would take any
# error for noise; faithful int4 weight-only models measure 22-25 dB
MIN_FLOOR_DB = 12.0


def noise_floor(bits: int) -> float:
    """The SQNR (dB) under which a value's error is more than ``bits``-bit quantization
    noise (module docstring), never below :data:`MIN_FLOOR_DB`."""
    return max(6.02 * bits - 28.0, MIN_FLOOR_DB)


def own_noise_floor(bits: int) -> float:
    """The SQNR (dB) under which a node's *own* error (its rerun on the torch values of
    its inputs) is more than ``bits``-bit quantization noise: ``6.02·b − 20``, never below
    :data:`MIN_FLOOR_DB`.  A rerun rounds one node's inputs and output to the grid once,
    ``6.02·b + 1.76`` dB on a uniform signal and up to ~20 dB less on a peaked one; the
    8 dB the value's floor leaves on top are for the many quantized ops a value goes
    through, none of which an own rerun holds.  Faithful int8 reruns measure 33-55 dB
    (tests/corpus/test_quantized_corpus.py), a zero point 10 steps off on a narrow
    value 25 dB: under this floor, over the value's."""
    return max(6.02 * bits - 20.0, MIN_FLOOR_DB)


def rerun_sources(graph: onnx.GraphProto, paired: Container[str]) -> dict[str, frozenset[str]]:
    """For each paired value, the paired values its own rerun starts from (their torch
    values): the nearest paired values up each input, through unpaired ones."""
    empty: frozenset[str] = frozenset()
    up: dict[str, frozenset[str]] = {}
    found: dict[str, frozenset[str]] = {}
    for node in graph.node:  # in topological order
        srcs: set[str] = set()
        for i in node.input:
            if i:
                srcs.update((i,) if i in paired else up.get(i, empty))
        frozen = frozenset(srcs)
        for o in node.output:
            if o:
                up[o] = frozen
                if o in paired:
                    found[o] = frozen
    return found


PAIR_MISMATCH_NOTE = "not the pair's rounding"


def mismatched_pairs(graph: onnx.GraphProto, paired: Container[str]) -> dict[str, str]:
    """For each paired value, what a QDQ pair in its own rerun does beyond rounding: a
    DequantizeLinear whose scale or zero point is not its QuantizeLinear's (the quantizer
    writes one pair of initializers for both) moves every element by as many steps,
    whatever the bit width (a uint16 zero point 100 off is 36 dB, over the 8-bit floor)."""
    inits = {i.name: i for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output if o}

    def value(name: str) -> np.ndarray | None:
        t = inits.get(name) if name else None
        return numpy_helper.to_array(t).astype(np.float64) if t is not None else None

    notes: dict[str, str] = {}
    for dq in graph.node:
        q = producer.get(dq.input[0]) if dq.op_type == "DequantizeLinear" and dq.input else None
        if q is None or q.op_type != "QuantizeLinear" or not dq.output:
            continue
        for k, what in ((1, "scale"), (2, "zero point")):
            a = value(q.input[k]) if len(q.input) > k else None
            b = value(dq.input[k]) if len(dq.input) > k else None
            if a is None or b is None or q.input[k] == dq.input[k]:
                continue
            if a.shape != b.shape or not np.array_equal(a, b):
                q_name = q.name or q.output[0]
                shown = f"{b.ravel()[0]:.6g} where {q_name} quantizes with {a.ravel()[0]:.6g}"
                if a.size == 1 and b.size == 1 and k == 2:
                    shown += f" ({b.ravel()[0] - a.ravel()[0]:+.0f} steps)"
                notes[dq.output[0]] = (
                    f"{dq.name or dq.output[0]} dequantizes with {what} {shown}: "
                    f"{PAIR_MISMATCH_NOTE}, a fault"
                )
    found: dict[str, str] = {}
    up: dict[str, tuple[str, ...]] = {}
    for node in graph.node:  # in topological order: the pairs inside each rerun
        inner: list[str] = []
        for i in node.input:
            if i and i not in paired:
                inner.extend(up.get(i, ()))
                if i in notes:
                    inner.append(notes[i])
        for o in node.output:
            if o:
                up[o] = tuple(dict.fromkeys(inner))
                if o in paired and (o in notes or inner):
                    found[o] = "; ".join(dict.fromkeys(([notes[o]] if o in notes else []) + inner))
    return found


class QuantizationNoise:
    """A failing value of a quantized model whose SQNR, and its own rerun's, stay above
    the noise floor of the model's bit width gets status ``quantization_noise``."""

    name = "quantization_noise"
    stage = STAGE_AFTER
    own_error = False

    def inert(self, ctx: RuleContext) -> bool:
        return ctx.quant_bits is None  # not a quantized model (set with the run's judge)

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.quant_bits is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if record.status != STATUS_FAIL or record.err_snr is None:
            return False
        if math.isnan(record.err_snr):  # no verdict of noise
            return False
        mismatch = ctx.pair_mismatch.get(ctx.name)
        if mismatch is not None:  # a pair that moves values is no noise, however small
            record.comment = _join(record.comment, mismatch)
            return False
        bits = ctx.quant_bits or 8
        floor = noise_floor(bits)
        own = ""
        if record.passed2 is False:
            if ctx.own_snr is None or not ctx.own_snr >= own_noise_floor(bits):
                return False  # its own error is beyond the noise: the node's fault
            if ctx.name not in ctx.quantized:
                return False  # its rerun quantizes nothing: its own error is its fault
            own = f", {ctx.own_snr:.1f} dB run on the torch values of its inputs"
        note = QUANTIZATION_NOISE_NOTE
        if not record.err_snr >= floor:
            # below the floor: noise only when the node adds no more than noise (its own
            # rerun) to values that are noise themselves, which it amplifies (cos of a
            # quantized timestep, a division by a small quantized value)
            if record.passed2 is None or not _inherits_noise(ctx):
                return False
            note = AMPLIFIED_NOISE_NOTE
        record.status = STATUS_QUANTIZATION_NOISE
        record.comment = _join(
            record.comment,
            note.format(snr=f"{record.err_snr:.1f}", own=own, floor=floor, bits=bits),
        )
        return True


def _inherits_noise(ctx: RuleContext) -> bool:
    """Whether the paired values the value's rerun starts from are known and none of
    them failed: the error it inherits is their quantization noise, no fault's."""
    sources = ctx.rerun_sources.get(ctx.name)
    return sources is not None and not any(s in ctx.failing for s in sources)


__all__ = [
    "AMPLIFIED_NOISE_NOTE",
    "PAIR_MISMATCH_NOTE",
    "QUANTIZATION_NOISE_NOTE",
    "QuantizationNoise",
    "noise_bits",
    "mismatched_pairs",
    "noise_floor",
    "own_noise_floor",
    "quantization_bits",
    "quantized_lowerings",
    "rerun_sources",
]
