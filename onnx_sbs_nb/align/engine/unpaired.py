"""The records of values without a partner: a reference value the candidate does not
compute, a candidate value or initializer the reference has no twin of (and either side's
value that failed to compute).  Their status says why; no verdict rule decides them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ...compare.value_facts import shape_type
from ...convert import device_of
from ...records import (
    KIND_NODE,
    KIND_OUTPUT,
    KIND_WEIGHT,
    STATUS_ERROR,
    STATUS_NOT_COMPARED,
    STATUS_NOT_COMPUTED,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
    STATUS_UNPAIRED_OUTPUT,
    UNPAIRED,
    Record,
)
from ..judge.failed import runner_lacks, runner_note
from ..judge.judging import proto_shape_type
from ..pairing.pairs import Pairing
from .sides import OnnxSide


def unpaired_initializers(ref: Any, cand: OnnxSide, pairing: Pairing) -> Iterator[Record]:
    """Initializers without a partner (and no twin on the reference): listed up front."""
    by_onnx = pairing.by_onnx
    for name in cand.initializers:
        if name not in by_onnx and name not in ref.graph.available:
            yield Record(
                **cand.describe_candidate(name),
                onnx_shape_type=proto_shape_type(cand.initializers[name]),
                kind=KIND_WEIGHT,
                paired_by=UNPAIRED,
                status=STATUS_UNPAIRED_ONNX,
            )


def reference_only_record(
    ref: Any,
    name: str,
    value: Any,
    elapsed: float | None,
    ref_errors: dict[str, str],
    missing: set[str],
) -> Record:
    """The record of reference value ``name``, which has no partner."""
    kind = ref.kind_of(name)
    if name in ref_errors:
        status = STATUS_NOT_COMPUTED if name in missing else STATUS_ERROR
    elif kind == KIND_OUTPUT:
        status = STATUS_UNPAIRED_OUTPUT
    else:
        status = STATUS_UNPAIRED_EP
    rec = Record(
        **ref.describe(name),
        ep_shape_type=shape_type(value) if value is not None else None,
        ep_time_run=elapsed,
        ep_device=device_of(value) if value is not None else None,
        kind=kind,
        paired_by=UNPAIRED,
        status=status,
        error=ref_errors.get(name),
    )
    if status == STATUS_UNPAIRED_OUTPUT:
        rec.comment = "no output of the ONNX model computes this output of the program"
    elif kind == KIND_WEIGHT:
        rec.comment = "no initializer holds it (unused, or folded into another by the exporter or an optimizer)"
    return rec


def candidate_only_record(
    cand: OnnxSide,
    name: str,
    cand_env: dict[str, Any],
    elapsed: float | None,
    cand_errors: dict[str, str],
    missing: set[str],
) -> Record:
    """The record of candidate value ``name``, which has no partner."""
    lacks = runner_lacks(cand_errors.get(name))
    if name in cand_errors:
        status = STATUS_NOT_COMPUTED if name in missing or lacks else STATUS_ERROR
    elif name in cand.graph_outputs:
        status = STATUS_UNPAIRED_OUTPUT
    else:
        status = STATUS_UNPAIRED_ONNX
    rec = Record(
        **cand.describe_candidate(name),
        onnx_shape_type=shape_type(cand_env[name]) if name in cand_env else None,
        onnx_time_run=elapsed,
        onnx_device=device_of(cand_env[name]) if name in cand_env else None,
        kind=KIND_OUTPUT if name in cand.graph_outputs else KIND_NODE,
        paired_by=UNPAIRED,
        status=status,
        error=cand_errors.get(name),
    )
    if status == STATUS_UNPAIRED_OUTPUT:
        rec.comment = "this output of the ONNX model matches no output of the program"
    elif lacks:
        rec.comment = runner_note(cand_errors.get(name))
    return rec


# the comments of a graph output with no twin in a run of two ONNX models (onnx-sbs diff)
UNMATCHED_CANDIDATE_OUTPUT = (
    "this output of the candidate model matches no output of the reference model: not compared"
)
UNMATCHED_REFERENCE_OUTPUT = (
    "no output of the candidate model matches this output of the reference model: not compared"
)


def unmatched_output_of_two_models(rec: Record) -> None:
    """In a run of two ONNX models, a graph output with no twin is not compared: the models
    may name or order their outputs apart, so nothing is said of either (the run is
    incomplete, never a fail, no culprit)."""
    if rec.status != STATUS_UNPAIRED_OUTPUT:
        return
    rec.status = STATUS_NOT_COMPARED
    rec.comment = (
        UNMATCHED_REFERENCE_OUTPUT if rec.onnx_name is None else UNMATCHED_CANDIDATE_OUTPUT
    )


__all__ = [
    "UNMATCHED_CANDIDATE_OUTPUT",
    "UNMATCHED_REFERENCE_OUTPUT",
    "candidate_only_record",
    "reference_only_record",
    "unmatched_output_of_two_models",
    "unpaired_initializers",
]
