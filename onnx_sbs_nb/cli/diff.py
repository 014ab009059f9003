"""``onnx-sbs diff``: two ONNX models of one program, node by node."""

from __future__ import annotations

import argparse
from typing import Any

from ..notebook.run_args import add_run_arguments, options_from_args
from .common import _name, add_outputs, check_paths
from .consume import report_run


def add_diff_command(sub: Any) -> None:
    diff = sub.add_parser("diff", help="compare two ONNX models of one program, node by node")
    diff.add_argument("a", help="the reference ONNX model (.onnx)")
    diff.add_argument("b", help="the ONNX model compared with it (.onnx)")
    diff.add_argument(
        "--inputs",
        required=True,
        help="inputs of model a saved with torch.save: tuple (in input order) or dict by name",
    )
    add_outputs(diff)
    add_run_arguments(diff)
    diff.add_argument("--no-progress", action="store_true", help="no progress bar")


def cmd_diff(args: argparse.Namespace) -> int:
    """Two ONNX models side by side; exit codes as ``onnx-sbs run``."""
    files = (("a", args.a), ("b", args.b), ("--inputs", args.inputs))
    outputs, node_data = check_paths(files, args.output)  # before torch loads: at once
    from ..align.two_models import two_model_run

    run = two_model_run(args.a, args.b, args.inputs, options_from_args(args))
    title = f"onnx-sbs diff: {_name(args.b)} vs {_name(args.a)}"
    return report_run(
        run, outputs, title, progress=not args.no_progress, node_data=node_data, source=args.b
    )[0]
