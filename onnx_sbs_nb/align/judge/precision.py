"""Inherited precision: a float32 value computed from float16 values carries their rounding.

A float16 model keeps islands of float32 (an RMSNorm upcasts its input, a softmax runs in
float32).  Torch and the ONNX runtime round each float16 step in their own way, and that
difference, a float16 ulp or so, enters the island: there it is far above the float32
tolerance, though neither side made a float32 error.  So a value is judged with the
loosest default tolerance of the float values it is computed from (itself included), on
the torch side: the program, not the export, says where the model computes in low
precision (an export that casts to float16 where the program does not still fails).

Inputs, weights and constants are leaves: both sides hold them exactly (weights are
compared on their own).
"""

from __future__ import annotations

from typing import Any

import torch

from ...compare.diff import Diff, compare
from ...compare.tolerances import default_tolerance
from ...compare.value_facts import value_dtype_name
from ...records import Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_COMPARED, RuleContext
from .judging import fill_first_comparison

_NO_DTYPES: tuple[str, ...] = ()
INHERITED_NOTE = (
    "within the {dtype} tolerance it inherits: it is computed from {dtype} values, "
    "which the two runtimes round each their own way"
)


def _float_dtypes(val: Any) -> tuple[str, ...]:
    """The names of the float dtypes of an fx node's value (a tensor or a tuple of them)."""
    if isinstance(val, torch.Tensor):
        dtype = val.dtype
        return (str(dtype).replace("torch.", ""),) if dtype.is_floating_point else _NO_DTYPES
    if isinstance(val, list | tuple):
        names: tuple[str, ...] = ()
        for v in val:
            names += _float_dtypes(v)
        return names
    return _NO_DTYPES


def looser_dtype(a: str | None, b: str | None) -> str | None:
    """The float dtype name of the two whose default tolerance is the looser."""
    if a is None:
        return b
    if b is None:
        return a
    return a if default_tolerance(a) >= default_tolerance(b) else b


def inherited_precision(nodes: list[torch.fx.Node]) -> dict[str, str]:
    """fx node name -> the float dtype whose default tolerance its value inherits, for the
    nodes where that tolerance is looser than the one of their own dtype (nodes in
    topological order, as an fx graph holds them)."""
    floor: dict[str, str | None] = {}
    looser: dict[str, str] = {}
    for node in nodes:
        if node.op in ("placeholder", "get_attr"):
            continue
        own = _float_dtypes(node.meta.get("val"))
        loosest = None
        for name in own:
            loosest = looser_dtype(loosest, name)
        for a in node.all_input_nodes:
            loosest = looser_dtype(loosest, floor.get(a.name))
        floor[node.name] = loosest
        if (
            loosest is not None
            and own
            and all(default_tolerance(loosest) > default_tolerance(name) for name in own)
        ):
            looser[node.name] = loosest
    return looser


def onnx_inherited_precision(
    model: Any, inputs: list[tuple[str, ...]], outputs: list[tuple[str, ...]]
) -> dict[str, str]:
    """ONNX value name -> the float dtype whose default tolerance its value inherits, for
    the values where that is looser than their own dtype's: a model converted to float16
    (weights stored in it, float32 kept at its inputs and outputs, or around blocked ops)
    computes its float32 values from float16 ones.  ``inputs``/``outputs``: the names
    each node reads and writes, in the model's order."""
    from ..pairing.values import onnx_value_types

    types = onnx_value_types(model)
    floor: dict[str, str | None] = {}
    for init in model.graph.initializer:
        floor[init.name] = _onnx_float(init.data_type)
    looser: dict[str, str] = {}
    for ins, outs in zip(inputs, outputs):
        loosest = None
        for name in ins:
            loosest = looser_dtype(loosest, floor.get(name))
        for o in outs:
            if not o:
                continue
            own = _onnx_float(types[o][0]) if o in types else None
            floor[o] = looser_dtype(loosest, own)
            if (
                loosest is not None
                and own is not None
                and default_tolerance(loosest) > default_tolerance(own)
            ):
                looser[o] = loosest
    return looser


def _onnx_float(elem_type: int) -> str | None:
    from ...dtypes import ONNX_TO_TORCH

    dtype = ONNX_TO_TORCH.get(elem_type)
    if dtype is None or not dtype.is_floating_point:
        return None
    return str(dtype).replace("torch.", "")


def made_it_pass(d: Diff, expected: Any, got: Any, atol: float | None, rtol: float | None) -> bool:
    """Whether a comparison that passed with an inherited tolerance would fail with the
    one of the values' own dtype (``atol``/``rtol``: the run's, None for the defaults)."""
    own_atol, own_rtol = default_tolerance(value_dtype_name(expected))
    own_atol = own_atol if atol is None else atol
    own_rtol = own_rtol if rtol is None else rtol
    if (d.atol, d.rtol) == (own_atol, own_rtol) or not d.err_abs or d.err_abs <= own_atol:
        return False
    return not compare(expected, got, atol, rtol).passed


class InheritedPrecision:
    """A value that passed only with the looser tolerance of the low-precision values it
    is computed from (``ctx.inherited``) says so."""

    name = "inherited_precision"
    stage = STAGE_COMPARED
    own_error = True

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.inherited is not None and ctx.diff is not None and ctx.diff.passed

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        d = ctx.diff
        if not made_it_pass(d, expected, got, ctx.atol, ctx.rtol):
            return False
        record.comment = _join(record.comment, INHERITED_NOTE.format(dtype=ctx.inherited))
        fill_first_comparison(record, d)
        return True
