"""The same ONNX model run two ways (two devices, or two runtimes), node by node.

"Does my model give the same numbers on CUDA as on CPU?" is the question here.  It is the
engine's one loop (``run.py``) with an ONNX model on both sides: the reference runtime and
device on one, the candidate on the other, every value paired with its namesake.  Each
record holds the propagated error (``err_abs``: the candidate on its own values) and the
node's own error (``err_abs2``: the candidate node on the reference's inputs).  The ``ep_*``
fields describe the reference run, the ``onnx_*`` fields the candidate run.
"""

from __future__ import annotations

from typing import Any

from ..device import device_name
from .contract import MODEL_ACTIONS, RecordStream, RunContract
from .engine.loop import SideBySideRun
from .engine.options import RunOptions
from .engine.runners import make_runner
from .engine.sides import OnnxSide
from .pairing.same_model import same_model_pairing
from .source.loading import SbsInputError, load_onnx_model
from .source.model_check import check_model


class TwoDeviceRun(SideBySideRun, RunContract):
    """One ONNX model on two runtimes or devices, every value paired with its namesake."""

    KIND = "two_devices"
    LABEL = "one ONNX model on two devices"
    APPLIES = MODEL_ACTIONS
    NOT_HERE = "it runs one ONNX model twice, with no torch program to rerun a node in"


def run_onnx_on_two_devices(
    onx: Any,
    feeds: dict[str, Any],
    *,
    reference: tuple[Any, str] = ("onnxruntime", "cpu"),
    candidate: tuple[Any, str] = ("torch", "cuda"),
    atol: float | None = None,
    rtol: float | None = None,
) -> RecordStream:
    """Yields one Record per ONNX value, comparing the candidate run with the reference.

    ``reference`` / ``candidate``: (runner, device), e.g. ("torch", "cpu") and
    ("torch", "cuda"), or ("onnxruntime", "cpu") and ("torch", "cpu").  The iterator
    returned holds the run (a :class:`TwoDeviceRun`) as ``.run``.
    """
    model = load_onnx_model(onx)
    model = check_model(
        model
    )  # a model that cannot run is refused, not run into not-computed records
    (r_runner, r_dev), (c_runner, c_dev) = reference, candidate
    r_dev, c_dev = device_name(r_dev), device_name(c_dev)
    g = model.graph
    inits = {i.name for i in g.initializer}
    missing = [i.name for i in g.input if i.name not in inits and i.name not in feeds]
    if missing:
        raise SbsInputError(f"feeds lack the model inputs {missing}: pass a dict name -> tensor")
    options = RunOptions(atol=atol, rtol=rtol, own_error=True)
    ref = OnnxSide(model, make_runner(r_runner, r_dev), r_dev, feeds)
    cand = OnnxSide(model, make_runner(c_runner, c_dev), c_dev, feeds)
    return RecordStream(TwoDeviceRun(ref, cand, same_model_pairing(model), options))


__all__ = ["TwoDeviceRun", "run_onnx_on_two_devices", "same_model_pairing"]
