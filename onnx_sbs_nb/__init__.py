"""onnx_sbs_nb: run a torch ExportedProgram and its ONNX export side by side, node by node."""

from __future__ import annotations

from typing import Any

from .records import RECORD_FIELDS, Record, RunStatus

__version__ = "0.1.0"

# Heavy or optional parts load on first use, so `import onnx_sbs_nb` stays cheap and the
# engine never pulls in the widget, pandas or plotly.
_LAZY = {
    "run_aligned": ("onnx_sbs_nb.align.run", "run_aligned"),
    "AlignedRun": ("onnx_sbs_nb.align.run", "AlignedRun"),
    "aligned_over_inputs": ("onnx_sbs_nb.align.run", "aligned_over_inputs"),
    "ManyInputsRun": ("onnx_sbs_nb.align.many_inputs", "ManyInputsRun"),
    "run_aligned_onnx": ("onnx_sbs_nb.align.two_models", "run_aligned_onnx"),
    "run_onnx_on_two_devices": ("onnx_sbs_nb.align.devices", "run_onnx_on_two_devices"),
    "bisect_optimizers": ("onnx_sbs_nb.align.bisect", "bisect_optimizers"),
    "RunOptions": ("onnx_sbs_nb.align.engine.options", "RunOptions"),
    "advise_precision": ("onnx_sbs_nb.align.precision_advisor", "advise_precision"),
    "generation_parity": ("onnx_sbs_nb.align.generation", "generation_parity"),
    "advise_quantization": ("onnx_sbs_nb.align.quantization_advisor", "advise_quantization"),
    "write_quantization_advice": (
        "onnx_sbs_nb.align.quantization_advice",
        "write_quantization_advice",
    ),
    "save_quantized_model": ("onnx_sbs_nb.align.quantization_advice", "save_quantized_model"),
    "TorchOnnxEvaluator": ("onnx_sbs_nb.evaluator.evaluator", "TorchOnnxEvaluator"),
    "supported_ops": ("onnx_sbs_nb.evaluator.registry", "supported_ops"),
    "summarize": ("onnx_sbs_nb.align.blame.summary", "summarize"),
    "Summary": ("onnx_sbs_nb.align.blame.summary", "Summary"),
    "ReplayConfig": ("onnx_sbs_nb.align.post.replay", "ReplayConfig"),
    "load_replay": ("onnx_sbs_nb.align.post.replay_load", "load_replay"),
    "save_culprit_bundle": ("onnx_sbs_nb.reports.culprit_bundle", "save_culprit_bundle"),
    "save_observed_inputs": ("onnx_sbs_nb.align.source.observed", "save_observed_inputs"),
    "SbsSession": ("onnx_sbs_nb.notebook.session", "SbsSession"),
    "SbsWidget": ("onnx_sbs_nb.notebook.widget", "SbsWidget"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        mod, attr = _LAZY[name]
        value = getattr(importlib.import_module(mod), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'onnx_sbs_nb' has no attribute {name!r}")


def __dir__() -> list[str]:
    # the lazy API is part of the module: dir() and completion list it before first use
    return sorted({*globals(), *_LAZY})


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext onnx_sbs_nb` registers the `%sbs` magic."""
    from .notebook.magic import load_ipython_extension as _load

    _load(ipython)


__all__ = ["RECORD_FIELDS", "Record", "RunStatus", "load_ipython_extension", *_LAZY]
