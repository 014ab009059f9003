"""Ill-conditioned rounding: a node whose own error is what its dtype's rounding gives on
these inputs, whichever runtime computes it.

LayerNorm of values with a large offset (raw sensor readings, timestamps: ``3000 + 0.01 *
noise``) loses most of float32's digits to cancellation; a long CumSum or a dot product
over large terms of both signs does too.  Torch and the ONNX runtime then both round far
from the exact result, each its own way, and their difference fails any tolerance set
for well-conditioned values, though neither is wrong (trial 3, finding 05: the ONNX side
was 3x *closer* to the float64 truth than torch, and the tool said it "makes the error").

The rule proves it for a node that fails its own-error check in the reference's own
float dtype (a lower-precision node is ``precision_loss.py``'s), all of whose inputs are
torch's values or its parameters, unchanged:

1. the node, computed exactly (float64, the torch evaluator) on torch's inputs, gives the
   reference value ``y``;
2. the *band*: how far ``y`` moves when each input moves by a few units of its dtype's
   roundoff (random signs, two draws): what rounding alone can do to this computation
   on these inputs;
3. the band alone fails the record's tolerance (the computation is ill-conditioned here),
   and torch's value and the node's own value both lie within a few bands of ``y``.

A wrong op or a wrong attribute is caught by 3 wherever the computation is
well-conditioned (the band is then below any tolerance); where it is not, a fault smaller
than the rounding cannot be told from it, and the record says so.
"""

from __future__ import annotations

from typing import Any

import torch

from ...compare.tolerances import default_tolerance
from ...compare.value_facts import value_dtype_name
from ...convert import to_torch
from ...records import ILL_CONDITIONED_NOTE, STATUS_FAIL, STATUS_PRECISION_LOSS, Record
from ...records import join_comments as _join
from ..pairing.pairs import Pair
from .context import STAGE_AFTER, RuleContext
from .judging import as_expected

_NOTE = (
    ILL_CONDITIONED_NOTE + ": {dtype} rounding alone moves the exact result of {op} by up "
    "to {band} here (computed in float64 on torch's inputs); torch's value is {t_err} from "
    "it, this node's {o_err}: both round, neither is wrong, and a fault smaller than the "
    "rounding cannot be told apart"
)
# units of roundoff each input moves by, and how many bands from the exact result a
# rounded value may lie (intermediate roundings add up beyond one input's)
_ULPS, _BANDS, _DRAWS = 2.0, 4.0, 2
# how far the node's float64 result may lie from torch's own op in float64: a small share
# of float32's rounding band, and float64's own relative rounding
_FUNCTION_SHARE, _TINY = 0.01, 1e-12


class IllConditioned:
    """A node failing its own check by rounding its dtype cannot avoid on these inputs
    gets status ``precision_loss`` with the ill-conditioned note: no culprit."""

    name = "ill_conditioned"
    stage = STAGE_AFTER
    own_error = False

    def applies(self, pair: Pair, ctx: RuleContext) -> bool:
        return ctx.precision_inputs is not None and ctx.has_own

    def judge(self, record: Record, expected: Any, got: Any, ctx: RuleContext) -> bool:
        if record.status != STATUS_FAIL or record.passed2 is not False:
            return False
        if not isinstance(expected, torch.Tensor) or expected.dtype not in (
            torch.float32,
            torch.float64,
        ):
            return False
        found = ctx.precision_inputs(ctx.name)
        if found is None or not found.all_exact:
            return False
        if any(
            f is not r and (f is None or r is None or not torch.equal(f, r))
            for f, r in zip(found.fed, found.rounded)
        ):
            return False  # a weight that is not its torch parameter: no rounding alone
        if any(
            e is not None and e.is_floating_point() and e.dtype != expected.dtype
            for e in found.exact
        ):
            return False  # inputs of other float types: precision_loss.py's, not this
        value = found.value()
        want = as_expected(ctx.pair, expected)
        if not isinstance(value, torch.Tensor) or value.shape != want.shape:
            return False
        try:
            exact = self._exact(found, found.exact)
            band = torch.zeros_like(exact)
            gen = torch.Generator().manual_seed(0)
            for _ in range(_DRAWS):
                moved = self._exact(found, [_nudge(e, gen) for e in found.exact])
                band = torch.maximum(band, (moved - exact).abs())
        except Exception:
            return False  # the evaluator cannot run it in float64: no verdict
        if exact.shape != want.shape or not torch.isfinite(band).all():
            return False
        if not torch.isfinite(exact).all():
            return False  # NaN or infinities: compared as patterns, no rounding to speak of
        # the right function: torch's own op in float64 on the same inputs (a changed
        # attribute or op differs from it far beyond float64's rounding, a small part
        # of float32's band)
        truth = ctx.precision_inputs.torch_exact(ctx.fx_name)
        if truth is None or truth.shape != exact.shape or not torch.isfinite(truth).all():
            return False
        if bool(((truth - exact).abs() > _FUNCTION_SHARE * band + _TINY * truth.abs()).any()):
            return False
        atol, rtol = default_tolerance(value_dtype_name(expected))
        atol = record.atol if record.atol is not None else atol
        rtol = record.rtol if record.rtol is not None else rtol
        # 3. rounding alone can fail the tolerance here...
        if not bool((band > atol + rtol * exact.abs()).any()):
            return False
        # ... and both sides lie within a few bands of the exact result
        reach = _BANDS * band + atol
        t_off = (want.double() - exact).abs()
        o_off = (value.double() - exact).abs()
        if bool((t_off > reach).any()) or bool((o_off > reach).any()):
            return False
        record.status = STATUS_PRECISION_LOSS
        record.comment = _join(
            record.comment,
            _NOTE.format(
                dtype=value_dtype_name(expected),
                op=record.onnx_op_type or "the op",
                band=f"{float(band.max()):.3g}",
                t_err=f"{float(t_off.max()):.3g}",
                o_err=f"{float(o_off.max()):.3g}",
            ),
        )
        return True

    @staticmethod
    def _exact(found: Any, inputs: list[Any]) -> torch.Tensor:
        f64 = [None if x is None else (x.double() if x.is_floating_point() else x) for x in inputs]
        return to_torch(found.run_exact(found.node, f64)[found.output]).double()


def _nudge(x: torch.Tensor | None, gen: torch.Generator) -> torch.Tensor | None:
    """``x`` moved by ``_ULPS`` units of its dtype's roundoff, each element by a random
    sign (float64, so that the move is not rounded away)."""
    if x is None or not x.is_floating_point():
        return x
    u = torch.finfo(x.dtype).eps / 2
    sign = torch.randint(0, 2, x.shape, generator=gen, dtype=torch.int8).double() * 2 - 1
    return x.double() * (1 + _ULPS * u * sign)


__all__ = ["ILL_CONDITIONED_NOTE", "IllConditioned"]
