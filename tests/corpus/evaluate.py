"""One run of the engine on a zoo model (faithful or faulted), reduced to what the corpus
checks and the report prints: pairing counts, failing records, what the summary names."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.records import (
    KIND_OUTPUT,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
    STATUS_WEIGHT_DIFFERS,
)

from .faults import Fault, ort_outputs, pick_fault
from .naming import Named, named_correctly, what_summary_names
from .zoo import Exported

UNPAIRED = (STATUS_UNPAIRED_EP, STATUS_UNPAIRED_ONNX)


@dataclass
class BadRecord:
    """A record that failed: what the integrator needs to see."""

    step: int
    kind: str
    ep_name: str | None
    onnx_name: str | None
    onnx_op_type: str | None
    status: str
    err_abs: float | None
    err_abs2: float | None
    passed: bool | None
    passed2: bool | None
    paired_by: str
    ep_shape_type: str | None
    onnx_shape_type: str | None
    error: str | None
    comment: str | None
    own_inputs_from: str | None = None
    onnx_fx_node: str | None = None

    def line(self) -> str:
        def f(v):
            return "-" if v is None else f"{v:.3g}"

        msg = (self.error or "").replace("\n", " ")[:160]
        com = (self.comment or "").replace("\n", " ")[:100]
        return (
            f"step {self.step} [{self.kind}] ep={self.ep_name} onnx={self.onnx_name} "
            f"({self.onnx_op_type}) status={self.status} paired_by={self.paired_by} "
            f"err={f(self.err_abs)} own={f(self.err_abs2)} passed={self.passed} "
            f"passed2={self.passed2} shapes={self.ep_shape_type}|{self.onnx_shape_type}"
            + (f" error={msg!r}" if msg else "")
            + (f" comment={com!r}" if com else "")
            + (f" own_inputs_from={self.own_inputs_from}" if self.own_inputs_from else "")
            + (f" fx={self.onnx_fx_node}" if self.onnx_fx_node else "")
        )


@dataclass
class Outcome:
    model: str
    fault: Fault | None
    verdict: str
    records: int
    paired: int
    unpaired_ep: int
    unpaired_onnx: int
    bad: list[BadRecord]
    named: Named | None
    correct: bool | None  # faults: the summary named the injected node
    seconds: float
    summary_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # ONNX graph outputs whose record compared values (err_abs set)
    compared_outputs: frozenset[str] = frozenset()
    coverage: str = ""  # the summary's Coverage.to_text()

    @property
    def faithful_ok(self) -> bool:
        return self.verdict == "pass" and not self.bad and self.named is None


def feeds_of(ex: Exported) -> dict[str, np.ndarray]:
    inits = {i.name for i in ex.onx.graph.initializer}
    names = [i.name for i in ex.onx.graph.input if i.name not in inits]
    flat = [a for a in torch.utils._pytree.tree_leaves(ex.args) if isinstance(a, torch.Tensor)]
    # bfloat16 goes as float32 (numpy has no bfloat16; faults.ort_outputs casts it back)
    return {
        n: (a.float() if a.dtype == torch.bfloat16 else a).detach().numpy()
        for n, a in zip(names, flat)
    }


def _bad_records(records) -> list[BadRecord]:
    out = []
    for r in records:
        if r.status in UNPAIRED:
            continue
        # a weight the exporter changed while its consumers agree is reported, not failing
        differs = r.status == STATUS_WEIGHT_DIFFERS
        if r.drifted:  # its node agrees on torch's inputs: carried, judged where it's made
            continue
        if r.failed or (r.passed is False and not differs) or r.passed2 is False:
            out.append(
                BadRecord(
                    r.step,
                    r.kind,
                    r.ep_name,
                    r.onnx_name,
                    r.onnx_op_type,
                    r.status,
                    r.err_abs,
                    r.err_abs2,
                    r.passed,
                    r.passed2,
                    r.paired_by,
                    r.ep_shape_type,
                    r.onnx_shape_type,
                    r.error,
                    r.comment,
                    getattr(r, "own_inputs_from", None),
                    getattr(r, "onnx_fx_node", None),
                )  # fmt: skip
            )
    return out


def run(ex: Exported, model: onnx.ModelProto, fault: Fault | None = None) -> Outcome:
    t0 = time.perf_counter()
    records = list(run_aligned(ex.ep, model, ex.args, rerun_with_torch_inputs=True))
    s = summarize(records, node_inputs=model)
    named = what_summary_names(s, model)
    correct = None if fault is None else named_correctly(s, model, fault.target)
    return Outcome(
        model=ex.entry.name,
        fault=fault,
        verdict=s.verdict,
        records=len(records),
        paired=sum(r.status not in UNPAIRED for r in records),
        unpaired_ep=sum(r.status == STATUS_UNPAIRED_EP for r in records),
        unpaired_onnx=sum(r.status == STATUS_UNPAIRED_ONNX for r in records),
        bad=_bad_records(records),
        named=named,
        correct=correct,
        seconds=time.perf_counter() - t0,
        summary_text=s.to_text(),
        compared_outputs=frozenset(
            r.onnx_name for r in records if r.kind == KIND_OUTPUT and r.err_abs is not None
        ),
        coverage=s.coverage.to_text(),
    )


FAULT_KINDS = ("weight", "attribute", "op")
_ROTATION = ("shallow", "middle", "deep")


def fault_plan(index: int) -> list[tuple[str, str]]:
    """(kind, depth) of the three faults of the index-th zoo model: each kind alone, at
    three different depths, rotated across models so each kind meets every depth."""
    return [(k, _ROTATION[(index + j) % 3]) for j, k in enumerate(FAULT_KINDS)]


def choose_fault(ex: Exported, kind: str, depth: str) -> tuple[Fault, onnx.ModelProto]:
    feeds = feeds_of(ex)
    reference = ort_outputs(ex.onx, feeds)
    assert reference is not None, f"{ex.entry.name}: onnxruntime cannot run the faithful model"
    picked = pick_fault(ex.onx, feeds, kind, depth, ex.entry.attribute_ops, reference)
    if picked is None:
        raise LookupError(f"{ex.entry.name}: no {kind} fault at depth {depth} changes the output")
    return picked


def entry_by_name(name: str):
    """The zoo entry of that name, in the first zoo (zoo.py) or the second to the sixth
    (zoo_vision_and_program_features.py ... zoo_speech_video_and_recurrent.py)."""
    from .zoo import ZOO_BY_NAME
    from .zoo_decoder_variants_and_mobile_vision import ZOO5_BY_NAME
    from .zoo_decoders_encoders_vision import ZOO4_BY_NAME
    from .zoo_kv_cache_and_popular_exports import ZOO3_BY_NAME
    from .zoo_speech_video_and_recurrent import ZOO6_BY_NAME
    from .zoo_vision_and_program_features import ZOO2_BY_NAME

    zoos = (ZOO_BY_NAME, ZOO2_BY_NAME, ZOO3_BY_NAME, ZOO4_BY_NAME, ZOO5_BY_NAME, ZOO6_BY_NAME)
    for zoo in zoos:
        if name in zoo:
            return zoo[name]
    raise KeyError(name)


class ZooSession:
    """Exports each zoo model once, picks each fault once, runs each case once."""

    def __init__(self) -> None:
        self._exported: dict[str, Exported] = {}
        self._faults: dict[tuple[str, str, str], tuple[Fault, onnx.ModelProto]] = {}
        self._outcomes: dict[tuple[str, str], Outcome] = {}

    def exported(self, name: str) -> Exported:
        from .zoo import export_entry

        if name not in self._exported:
            self._exported[name] = export_entry(entry_by_name(name))
        return self._exported[name]

    def fault(self, name: str, kind: str, depth: str) -> tuple[Fault, onnx.ModelProto]:
        key = (name, kind, depth)
        if key not in self._faults:
            self._faults[key] = choose_fault(self.exported(name), kind, depth)
        return self._faults[key]

    def faithful(self, name: str) -> Outcome:
        key = (name, "faithful")
        if key not in self._outcomes:
            ex = self.exported(name)
            self._outcomes[key] = run(ex, ex.onx)
        return self._outcomes[key]

    def faulted(self, name: str, kind: str, depth: str) -> Outcome:
        key = (name, f"{kind}-{depth}")
        if key not in self._outcomes:
            fault, bad = self.fault(name, kind, depth)
            self._outcomes[key] = run(self.exported(name), bad, fault)
        return self._outcomes[key]
