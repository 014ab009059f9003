"""The run kinds, in one ordered registry, as the judge's rules are.

Each entry names a class keeping the run contract (``contract.py``: ``KIND``, its name
here; ``LABEL``, what views call it; ``APPLIES``, the actions that apply to its runs)
and the public function that starts it from what a user gives.  Adding a kind is one
class and one entry of :data:`RUN_KINDS`; ``tests/align/test_run_contract.py`` checks that
every entry's run keeps the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .bisect import OptimizerBlame, bisect_optimizers
from .contract import RecordsRun, Run
from .devices import TwoDeviceRun, run_onnx_on_two_devices
from .generation import GenerationParity, generation_parity
from .many_inputs import ManyInputsRun
from .precision_advice import PrecisionAdvice
from .precision_advisor import advise_precision
from .quantization_advice import QuantizationAdvice
from .quantization_advisor import advise_quantization
from .run import AlignedRun, aligned_over_inputs
from .two_models import TwoModelRun, two_model_run


@dataclass(frozen=True)
class RunKind:
    """One kind of run: the class its runs are, and how it starts."""

    run: type  # keeps the contract: KIND, LABEL, APPLIES
    start: Callable[..., Run]  # the run from a user's arguments (the public function)

    @property
    def name(self) -> str:
        return self.run.KIND

    @property
    def label(self) -> str:
        return self.run.LABEL

    @property
    def applies(self) -> frozenset[str]:
        return self.run.APPLIES


#: Every run kind, the commonest first.
RUN_KINDS: tuple[RunKind, ...] = (
    RunKind(AlignedRun, AlignedRun),  # run_aligned(ep, onx, args)
    RunKind(ManyInputsRun, aligned_over_inputs),  # run_aligned(ep, onx, inputs=[...])
    RunKind(TwoModelRun, two_model_run),  # run_aligned_onnx, onnx-sbs diff
    RunKind(TwoDeviceRun, run_onnx_on_two_devices),
    RunKind(OptimizerBlame, bisect_optimizers),  # onnx-sbs run --bisect
    RunKind(PrecisionAdvice, advise_precision),  # onnx-sbs precision
    RunKind(QuantizationAdvice, advise_quantization),  # onnx-sbs quantize-advice
    RunKind(GenerationParity, generation_parity),  # onnx-sbs generate
    RunKind(RecordsRun, RecordsRun),  # records alone: SbsSession.from_run([...])
)


def run_kind(name: str) -> RunKind:
    """The kind called ``name``."""
    for kind in RUN_KINDS:
        if kind.name == name:
            return kind
    raise KeyError(f"no run kind {name!r}: one of {[k.name for k in RUN_KINDS]}")


def start_run(name: str, *args: Any, **kwargs: Any) -> Run:
    """A run of the kind called ``name`` from a user's arguments."""
    return run_kind(name).start(*args, **kwargs)


__all__ = ["RUN_KINDS", "RunKind", "run_kind", "start_run"]
