"""Torch evaluator of ONNX models: ``TorchOnnxEvaluator``, ``compile_node``, ``supported_ops``."""

from .registry import supported_ops

__all__ = ["TorchOnnxEvaluator", "compile_node", "supported_ops"]


def __getattr__(name: str):
    if name in ("TorchOnnxEvaluator", "compile_node", "MissingKernelError"):
        from . import evaluator

        return getattr(evaluator, name)
    raise AttributeError(name)
