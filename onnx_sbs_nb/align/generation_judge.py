"""How generation parity runs the ONNX model and judges one step's logits and cache.

A float model's step is judged against the dtype's tolerance.  A quantized model (one with
quantization ops, :func:`~onnx_sbs_nb.align.pairing.quantized.is_quantized`) fails every
float tolerance from step 0 on: that is what quantizing means.  Its step is judged as the
``quantization_noise`` rule judges a value: the SQNR of the step's logits and of each cache
output it writes against the noise floor of the model's bit width
(:func:`~onnx_sbs_nb.align.judge.quantization_noise.noise_floor`); under it the step errs
beyond what the quantization explains.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from ..compare.diff import compare
from ..convert import to_numpy
from ..errors import SbsInputError
from .judge.quantization_noise import noise_floor, quantization_bits
from .pairing.quantized import is_quantized

_tree = torch.utils._pytree


def _session_refusal(e: Exception) -> SbsInputError:
    """onnxruntime's refusal to build a session, worded as the run's model check words it
    (:func:`~onnx_sbs_nb.align.source.model_check.check_onnxruntime_builds`), naming the
    node it names."""
    text = " ".join(str(e).split())
    if "[ONNXRuntimeError] :" in text:
        text = text.split("[ONNXRuntimeError] :", 1)[1].strip()
    text = re.sub(r"^\d+ : [A-Z_]+ : ", "", text).rstrip(". ")
    if len(text) > 400:
        text = text[:397] + "..."
    node = re.search(r"[Nn]ode \(([^)]+)\)", text)
    where = f" at node {node.group(1)!r}" if node else ""
    return SbsInputError(
        f"onnxruntime cannot build a session for the ONNX model{where}: {text}. The model "
        "cannot run as it is, so it cannot decode: export it again (run_aligned on the "
        "first step's inputs compares it node by node with another runner)"
    )


class OnnxDecoder:
    """The ONNX model as one onnxruntime session, fed the flattened keyword inputs."""

    def __init__(self, model: onnx.ModelProto, out_spec: Any) -> None:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 3
        try:
            self.session = ort.InferenceSession(
                model.SerializeToString(), so, providers=["CPUExecutionProvider"]
            )
        except Exception as e:  # noqa: BLE001  (onnxruntime raises its own types)
            raise _session_refusal(e) from None
        inits = {i.name for i in model.graph.initializer}
        self.inputs = [i.name for i in model.graph.input if i.name not in inits]
        self.output_names = [o.name for o in model.graph.output]
        self.out_spec = out_spec

    def __call__(self, kwargs: dict[str, Any]) -> Any:
        flat = [v for v in _tree.tree_leaves(kwargs) if isinstance(v, torch.Tensor)]
        if len(flat) != len(self.inputs):
            raise SbsInputError(
                f"the ONNX model takes {len(self.inputs)} inputs, the step's inputs flatten "
                f"to {len(flat)} tensors: is it the export of this program and cache?"
            )
        feeds = {n: to_numpy(v.detach()) for n, v in zip(self.inputs, flat)}
        try:
            outs = self.session.run(None, feeds)
        except Exception as e:  # noqa: BLE001  (onnxruntime raises its own types)
            shapes = {n: tuple(v.shape) for n, v in feeds.items()}
            raise SbsInputError(
                f"onnxruntime cannot run the ONNX model on the next step's inputs {shapes} "
                f"({str(e).splitlines()[0][:200]}): a model exported with fixed sizes cannot "
                "grow its cache: export with dynamic batch, sequence and past dimensions"
            ) from None
        return _tree.tree_unflatten([torch.from_numpy(np.asarray(o)) for o in outs], self.out_spec)


@dataclass
class StepJudge:
    """One step's verdict: float tolerance, or the noise floor of a quantized model."""

    atol: float | None = None
    rtol: float | None = None
    #: the quantized model's narrowest bit width (None: a float model)
    bits: int | None = None

    @classmethod
    def for_model(cls, model: onnx.ModelProto, atol: float | None, rtol: float | None):
        bits = quantization_bits(model.graph) if is_quantized(model.graph) else None
        # quantization ops whose width cannot be read: int8, the common case
        return cls(atol, rtol, bits if bits is not None or not is_quantized(model.graph) else 8)

    @property
    def floor(self) -> float | None:
        """The SQNR (dB) under which a quantized step errs beyond quantization noise."""
        return None if self.bits is None else noise_floor(self.bits)

    def judge(self, expected: torch.Tensor, got: torch.Tensor) -> Any:
        """``compare``'s diff, its ``passed`` replaced by the noise floor when quantized."""
        d = compare(expected.detach(), got, atol=self.atol, rtol=self.rtol)
        if self.bits is not None:
            d.passed = d.err_snr is not None and bool(d.err_snr >= self.floor)
        return d

    def cache(self, step: Any, t_cache: Any, o_cache: Any, names: list[str]) -> None:
        """The cache each side wrote, leaf by leaf (they flatten alike: one program): the
        largest error, whether every leaf passes, the ONNX output that errs most (the
        lowest SQNR, when quantized), the lowest SQNR."""
        t_leaves = [v for v in _tree.tree_leaves(t_cache) if isinstance(v, torch.Tensor)]
        o_leaves = [v for v in _tree.tree_leaves(o_cache) if isinstance(v, torch.Tensor)]
        if not t_leaves or len(t_leaves) != len(o_leaves):
            return
        names = names[-len(t_leaves) :]
        worst, worst_key, passed, snrs = None, None, True, []
        err_max = -1.0
        for name, a, b in zip(names, t_leaves, o_leaves):
            d = self.judge(a, b)
            passed = passed and bool(d.passed)
            err = d.err_abs if d.err_abs is not None else float("inf")
            err_max = max(err_max, err)
            snr = d.err_snr if d.err_snr is not None else float("inf")
            snrs.append(snr)
            key = -snr if self.bits is not None else err
            if worst_key is None or key > worst_key:
                worst, worst_key = name, key
        step.cache_passed, step.cache_worst, step.cache_err_abs = passed, worst, err_max
        step.cache_snr = min(snrs)
