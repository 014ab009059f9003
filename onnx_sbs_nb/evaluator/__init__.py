"""Torch evaluator of ONNX models: ``TorchOnnxEvaluator``, ``compile_node``, ``supported_ops``."""

from .registry import supported_ops

__all__ = [
    "MissingKernelError",
    "NodeError",
    "TorchOnnxEvaluator",
    "UnknownAttributeError",
    "compile_node",
    "supported_ops",
]

_LAZY = {
    "TorchOnnxEvaluator": "evaluator",
    "compile_node": "evaluator",
    "MissingKernelError": "compiled",
    "NodeError": "compiled",
    "UnknownAttributeError": "attributes",
}


def __getattr__(name: str):
    # importing torch kernels is deferred until an evaluator is actually needed
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
