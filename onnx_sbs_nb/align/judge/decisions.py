"""A decision flipped by a near tie: ArgMax, ArgMin or TopK indices that differ from
torch's while the node, run on torch's inputs, chooses as torch does.

Where two candidates of torch's input are closer to each other than the difference the
ONNX input carries there within tolerance (float rounding upstream), each side picks
the one its own input puts first: both are right, and no fault of the export made the
indices differ.  The values after the decision then differ by whole rows (another
embedding row, another expert), far beyond any tolerance: the model is unstable on
these inputs, which the record says (status ``precision_loss``, as an ill-conditioned
computation's rounding, ``conditioning.py``) and the summary names as the origin of the
divergence (``blame/decisions.py``).

The evidence, for every row whose indices differ: in torch's input, the value torch
chose and the value the ONNX node chose are no further apart than the two inputs differ
at those two places (what can flip the order), and those differences are within the
input's tolerance (else an error upstream flipped it: the blame goes there).  A node
that chooses otherwise on torch's inputs (a wrong axis, ``select_last_index``) is no
near tie: its own rerun fails, or, without one, the rule reruns it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx

from ...compare.tolerances import default_tolerance
from ...compare.value_facts import value_dtype_name
from ...convert import to_numpy
from ...records import NEAR_TIE_NOTE, STATUS_FAIL, STATUS_PRECISION_LOSS, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_AFTER, RuleContext
from .ties import flipped_rows, same_choice

# the index-producing decisions: op type -> (default axis, the output holding indices)
DECISIONS: dict[str, tuple[int, int]] = {"ArgMax": (0, 0), "ArgMin": (0, 0), "TopK": (-1, 1)}
# float64 slack on a gap: the two differences and the gap are each rounded once
_SLACK = 4 * float(np.finfo(np.float64).eps)


@dataclass(frozen=True)
class NearTie:
    """What a flipped decision rests on: rows that differ, of all rows; the largest gap
    between the two choices in torch's input; the largest difference of the inputs
    there; the input's tolerance there."""

    rows: int
    total: int
    gap: float
    diff: float | None  # None: the ONNX input was not at hand, the tolerance bounds it
    tol: float

    def note(self, op: str) -> str:
        apart = (
            "equal in torch's input (a tie)"
            if self.gap == 0
            else f"{self.gap:.3g} apart in torch's input (a near tie)"
        )
        within = (
            f"within the {self.diff:.3g} the ONNX input differs from torch's there "
            f"(its tolerance {self.tol:.3g})"
            if self.diff is not None
            else f"within the input's tolerance {self.tol:.3g}"
        )
        return (
            f"{NEAR_TIE_NOTE}: the indices differ on {self.rows} of {self.total} rows, where "
            f"torch's choice and this node's are {apart}, {within}: rounding flips the "
            f"choice, and {op} run on torch's inputs chooses as torch does: no fault of the "
            "export, but the values that read the indices differ"
        )


def _axis(node: onnx.NodeProto, default: int) -> tuple[int, bool]:
    """The node's axis and whether its indices keep it (ArgMax ``keepdims``)."""
    axis, keep = default, True
    for a in node.attribute:
        if a.name == "axis":
            axis = a.i
        elif a.name == "keepdims":
            keep = bool(a.i)
    return axis, keep


def near_tie(
    x_t: Any, x_o: Any, expected: Any, got: Any, axis: int, keep: bool, atol: float, rtol: float
) -> NearTie | None:
    """The evidence that indices ``got`` differ from torch's ``expected`` (over input
    ``x_t`` of torch, ``x_o`` of the ONNX run, None when not at hand) only by a near
    tie, None when they do not (or do not differ)."""
    x = np.asarray(to_numpy(x_t), dtype=np.float64)
    e, g = (np.asarray(to_numpy(v)) for v in (expected, got))
    if x.ndim == 0 or e.shape != g.shape or e.dtype.kind not in "iu" or g.dtype.kind not in "iu":
        return None
    axis %= x.ndim
    if not keep:
        e, g = np.expand_dims(e, axis), np.expand_dims(g, axis)
    if e.ndim != x.ndim or e.size == 0:
        return None
    n = x.shape[axis]
    if min(e.min(), g.min()) < 0 or max(e.max(), g.max()) >= n:
        return None
    rows, total = flipped_rows(e, g, axis)
    if not rows:
        return None
    differs = e != g
    a, b = np.take_along_axis(x, e, axis), np.take_along_axis(x, g, axis)
    gap = np.abs(a - b)[differs]
    tol_e = (atol + rtol * np.abs(a))[differs]
    tol_g = (atol + rtol * np.abs(b))[differs]
    diff = None
    if x_o is not None:
        xo = np.asarray(to_numpy(x_o), dtype=np.float64)
        if xo.shape != x.shape:
            return None
        d = np.abs(x - xo)
        d_e = np.take_along_axis(d, e, axis)[differs]
        d_g = np.take_along_axis(d, g, axis)[differs]
        if bool((d_e > tol_e).any() or (d_g > tol_g).any()):
            return None  # the input is off beyond tolerance there: an error upstream
        reach = d_e + d_g
        diff = float(max(d_e.max(), d_g.max()))
    else:
        reach = tol_e + tol_g
    if not bool((gap <= reach + _SLACK * np.abs(a[differs])).all()):
        return None
    return NearTie(rows, total, float(gap.max()), diff, float((tol_e + tol_g).max() / 2))


class NearTieFlip:
    """Indices of an ArgMax, ArgMin or TopK that fail while the node chooses as torch on
    torch's inputs, each flipped row a near tie within the input's tolerance: status
    ``precision_loss`` with the near-tie note, no culprit (see the module's doc)."""

    name = "near_tie"
    stage = STAGE_AFTER
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.precision_inputs is not None

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if record.status != STATUS_FAIL or record.passed2 is False:
            return False
        spec = DECISIONS.get(record.onnx_op_type or "")
        if spec is None:
            return False
        found = ctx.precision_inputs(ctx.name)
        if found is None or found.output != spec[1] or not found.exact:
            return False
        x_t = found.exact[0]
        if x_t is None or not x_t.is_floating_point():
            return False
        axis, keep = _axis(found.node, spec[0])
        if found.node.op_type == "TopK":
            keep = True
        if record.passed2 is None and not self._chooses_as_torch(found, x_t, expected, axis, keep):
            return False
        x_o = None
        if ctx.node_inputs is not None:
            main = ctx.node_inputs(ctx.name)
            if main is not None and main[1] is not None and main[1][0] is not None:
                x_o = main[1][0]
        atol, rtol = default_tolerance(value_dtype_name(x_t))
        atol = ctx.atol if ctx.atol is not None else atol
        rtol = ctx.rtol if ctx.rtol is not None else rtol
        try:
            tie = near_tie(x_t, x_o, expected, got, axis, keep, atol, rtol)
        except Exception:
            return False  # values of a layout this rule does not read: no verdict
        if tie is None:
            return False
        record.status = STATUS_PRECISION_LOSS
        record.comment = _join(record.comment, tie.note(record.onnx_op_type or "the node"))
        return True

    @staticmethod
    def _chooses_as_torch(found: Any, x_t: Any, expected: Any, axis: int, keep: bool) -> bool:
        """Without an own-error rerun: the node, run on torch's inputs, gives torch's
        indices (or indices that select the same values)."""
        try:
            value = found.value()
        except Exception:
            return False
        if value is None:
            return False
        v, e = np.asarray(to_numpy(value)), np.asarray(to_numpy(expected))
        if v.shape != e.shape:
            return False
        if np.array_equal(v, e):
            return True
        if not keep:
            v, e = np.expand_dims(v, axis), np.expand_dims(e, axis)
        return same_choice(x_t, e, v, axis)


__all__ = ["DECISIONS", "NearTie", "NearTieFlip", "near_tie"]
