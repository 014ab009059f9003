"""How one pair is judged: values brought into the candidate's layout, the comparisons
filled into a record, and the inputs of a node's own-error run.

Shared by the run loop (``loop.py``) and the post-run actions (``actions.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import torch

from ...compare.diff import Diff
from ...compare.value_facts import ARRAY_TYPES
from ...dtypes import dtype_name
from ...records import (
    JUDGED_BY_NOTE,
    STATUS_CHECK_ERROR,
    STATUS_DTYPE_MISMATCH,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_SHAPE_MISMATCH,
    Record,
)
from ...records import join_comments as _join
from ..pairing.onnx_pairing import cast_value
from ..pairing.pairs import Pair
from ..pairing.values import (
    TRANSFORM_AS_REAL,
    TRANSFORM_PERMUTE,
    TRANSFORM_RESHAPE,
    TRANSFORM_TRANSPOSE,
)


class SbsMismatchError(AssertionError):
    """Raised with ``exc=True`` at the first pair that fails the tolerance."""

    def __init__(self, record: Record):
        self.record = record
        super().__init__(
            f"fx node {record.ep_name!r} ({record.ep_target}) and ONNX value "
            f"{record.onnx_name!r} ({record.onnx_op_type}) disagree: status={record.status}, "
            f"err_abs={record.err_abs}, atol={record.atol}, rtol={record.rtol}"
            + (f", error: {record.error}" if record.error else "")
        )


def as_candidate(pair: Pair, value: Any) -> Any:
    """A reference value in the candidate's layout and type (a folded transposition
    undone, a cast made)."""
    value = as_expected(pair, value)
    return value if pair.cast_to is None else cast_value(value, pair.cast_to)


def as_expected(pair: Pair, value: Any) -> Any:
    """A reference value to compare with: in the candidate's layout, its own type (a
    cast pair is compared in the coarser type of the two)."""
    if not isinstance(value, torch.Tensor):
        return value
    if pair.transform == TRANSFORM_TRANSPOSE:
        return value.t()
    if pair.transform == TRANSFORM_PERMUTE:
        return value.permute(pair.perm)
    if pair.transform == TRANSFORM_AS_REAL:
        return torch.view_as_real(value.resolve_conj()) if value.is_complex() else value
    if pair.transform == TRANSFORM_RESHAPE:
        if pair.squeeze is not None:
            return _resqueezed(value, pair.squeeze)
        if pair.shape is not None:
            try:
                return value.reshape(pair.shape)
            except RuntimeError:
                return value  # not the size the pair was made for: the comparison says so
    return value


def in_layout_of(pair: Pair, expected: Any, got: Any) -> Any:
    """``expected`` in the shape of ``got`` for a pair that is one value in two shapes
    (a reshape a graph tool moved), where their sizes agree; else unchanged."""
    if pair.transform != TRANSFORM_RESHAPE or not isinstance(expected, torch.Tensor):
        return expected
    shape = tuple(getattr(got, "shape", ()))
    if tuple(expected.shape) == shape or expected.numel() != int(np.prod(shape, dtype=np.int64)):
        return expected
    return expected.reshape(shape)


def _resqueezed(value: torch.Tensor, axes: tuple[tuple[int, ...], tuple[int, ...]]) -> Any:
    fx_ones, onnx_ones = axes
    if value.dim() <= max(fx_ones, default=-1):
        return value  # not the shape the pair was made for: the comparison says so
    value = value.squeeze(fx_ones) if fx_ones else value
    for axis in onnx_ones:
        if axis > value.dim():
            break
        value = value.unsqueeze(axis)
    return value


def fill_first_comparison(rec: Record, d: Diff) -> None:
    rec.atol, rec.rtol = d.atol, d.rtol
    rec.err_abs, rec.err_rel, rec.err_nan = d.err_abs, d.err_rel, d.err_nan
    rec.err_h01, rec.err_h001 = d.err_h01, d.err_h001
    rec.err_cos, rec.err_snr, rec.err_l2 = d.err_cos, d.err_snr, d.err_l2
    rec.err_p50, rec.err_p99, rec.err_ulp = d.err_p50, d.err_p99, d.err_ulp
    if d.extra:
        rec.extra = d.extra
    rec.passed = d.passed
    _note_judge(rec, d)
    if d.error:  # the user's compare function failed on this pair: not the model's error
        rec.status = STATUS_CHECK_ERROR
        rec.error = d.error
    elif d.shape_mismatch:
        rec.status = STATUS_SHAPE_MISMATCH
        rec.comment = _join(rec.comment, d.note)
    elif d.dtype_mismatch:
        rec.status = STATUS_DTYPE_MISMATCH
        rec.comment = _join(rec.comment, d.note)
    else:
        rec.status = STATUS_OK if d.passed else STATUS_FAIL
        if not d.passed and d.note:  # a verdict policy's reason ("beyond the verdict ...")
            rec.comment = _join(rec.comment, d.note)


def fill_own_error(rec: Record, d: Diff, own_device: str) -> None:
    rec.err_abs2, rec.err_rel2, rec.err_nan2 = d.err_abs, d.err_rel, d.err_nan
    rec.err_h012, rec.err_h0012 = d.err_h01, d.err_h001
    rec.err_dev2 = 0.0 if rec.ep_device in (None, own_device) else 1.0
    rec.passed2 = d.passed
    _note_judge(rec, d)


def _note_judge(rec: Record, d: Diff) -> None:
    """A comparison failed by the user's verdict or compare function says so (once): the
    culprit's why cites it rather than atol/rtol."""
    if d.passed is False and d.decided and JUDGED_BY_NOTE not in (rec.comment or ""):
        rec.comment = _join(rec.comment, f"{JUDGED_BY_NOTE}{d.decided}")


_SCALARS = (bool, int, float, torch.SymInt, torch.SymFloat, torch.SymBool)


def comparable(expected: Any, got: Any) -> tuple[Any, Any]:
    """Both sides as array-likes, or (None, None) when they are not comparable tensors."""
    if isinstance(expected, _SCALARS):
        try:
            expected = np.asarray(
                expected if isinstance(expected, bool | int | float) else expected.node.hint
            )
        except Exception:
            return None, None
        if hasattr(got, "reshape") and getattr(got, "size", None) is not None:
            n = got.numel() if isinstance(got, torch.Tensor) else got.size
            if n == 1:
                got = got.reshape(())
    if not isinstance(expected, ARRAY_TYPES) or not isinstance(got, ARRAY_TYPES):
        return None, None
    return expected, got


def proto_shape_type(t: onnx.TensorProto) -> str:
    try:
        name = dtype_name(t.data_type)
    except TypeError:
        name = onnx.TensorProto.DataType.Name(t.data_type).lower()
    return f"{name}[{'x'.join(str(d) for d in t.dims)}]"
