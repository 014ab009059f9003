"""What a preparation gives: the program the exporter lowers, and how it was had."""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Values of PreparedProgram.source
PREPARED_BY_EXPORTER = "exporter"  # the exporter's preparation, re-traced here
PREPARED_REPRODUCED = "reproduced"  # .reproduce, checked against the ONNX model's metadata
PREPARED_FROM_ONNX_PROGRAM = "onnx_program"  # the ONNXProgram carried its prepared program
PREPARED_FALLBACK = "fallback"  # private API unavailable: plain run_decompositions()


@dataclass
class PreparedProgram:
    program: torch.export.ExportedProgram
    source: str
    note: str = ""  # a limit of the run the user should know about
    # why the fast reproduction was not used (empty when it was, or was not tried)
    detail: str = ""
