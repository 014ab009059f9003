"""A node that raised in a runner other than onnxruntime, run again by onnxruntime.

The ONNX reference evaluator's own kernels have gaps onnxruntime has not (its
ConvTranspose with ``group > 1`` raises a numpy ValueError), as may the torch evaluator:
such a failure is the tool's runner's, not the model's.  A user's own runner is the
runtime under test: its failure stays a finding (an error of the node).  Where onnxruntime
runs the same node on the same inputs, the node's error message says so
(:data:`~onnx_sbs_nb.records.ONNXRUNTIME_RUNS_IT`) and the judge makes the
value not computed (the run incomplete), no culprit (``judge/failed.py``,
:class:`RunnerCannot`).  Where onnxruntime fails too, the error stays the model's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ...convert import to_numpy
from ...records import ONNXRUNTIME_RUNS_IT
from .runners import OnnxruntimeRunner, ReferenceRunner, TorchRunner

# one onnxruntime runner for the second opinions of a process (its sessions are cached
# by node signature like any runner's); no torch fallback: onnxruntime itself must run it
_ORT: list[OnnxruntimeRunner] = []


def second_opinion(side: Any, idx: int, inputs: Sequence[Any] | None) -> str:
    """The suffix of the error message of node ``idx`` of ``side`` (an OnnxSide), which
    raised in its runner: :data:`ONNXRUNTIME_RUNS_IT` when the runner is one of the
    tool's evaluators (reference, torch) and onnxruntime runs the node on the same
    inputs, else ``""``."""
    if inputs is None or not isinstance(side.runner, ReferenceRunner | TorchRunner):
        return ""
    try:
        if not _ORT:
            _ORT.append(OnnxruntimeRunner(fallback=False))
        fn = _ORT[0].prepare(side.nodes[idx], side.ctx)
        fn([None if v is None else to_numpy(v) for v in inputs])
    except Exception:
        return ""  # onnxruntime cannot run it either (or not here): the model's error
    return ONNXRUNTIME_RUNS_IT


__all__ = ["second_opinion"]
