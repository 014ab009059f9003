"""The names the run options accept, without the engine that understands them.

The command line builds its flags' ``choices`` from these: ``onnx-sbs --help`` and an
argument error must answer before torch and onnx are imported (seconds), so the names
live here, below the engine, which imports them from here too.
"""

from __future__ import annotations

RUNNER_NAMES = ("onnxruntime", "reference", "torch")
RESET_ALL = "all"
# onnxruntime's graph optimization levels, as ``optimize=`` / ``--optimize`` spell them
OPTIMIZE_LEVELS = ("basic", "extended", "layout", "all")

__all__ = ["OPTIMIZE_LEVELS", "RESET_ALL", "RUNNER_NAMES"]
