"""``onnx-sbs``: run a side-by-side comparison from a terminal or a CI job.

Exit codes: 0 every pair passes, 1 a pair fails its tolerance (or a node fails to run),
2 bad input (a missing or hostile file, a wrong option, a report that cannot be written),
3 the run did not compare the whole model (it ended with an error; ``report`` of a
stopped or cut-short run), 130 interrupted (Ctrl-C: the reports of what was computed are
still written, and say STOPPED).

This module is the parser and the dispatch; each subcommand is a module of its own
(``run.py``, ``diff.py``, ``precision.py``, ``report.py``), what they share is in
``common.py`` and how a run is consumed in ``consume.py``.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import SbsInputError
from ..reports.html import BundleMissingError
from ..reports.report import ReportFormatError
from .common import (
    DEFAULT_JSONL,
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_FAIL,
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_PASS,
    CliError,
    _path,
    check_outputs,
    check_paths,
    jsonl_path,
    verdict_exit_code,
    write_reports,
)
from .consume import report_run, write_node_data_files
from .diff import add_diff_command, cmd_diff
from .generate import add_generate_command, cmd_generate
from .precision import add_precision_command, cmd_precision
from .quantize import add_quantize_command, cmd_quantize
from .report import (
    DEMO_REPORTS,
    add_report_commands,
    cmd_demo,
    cmd_notebook,
    cmd_replay,
    cmd_report,
)
from .run import (
    add_run_command,
    bisect_after_run,
    cmd_run,
    many_inputs,
    run_and_report,
    run_files,
    run_many_and_report,
    run_report_summary,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        # argparse exits with 2 too; this keeps the usage line and names the command.
        self.print_usage(sys.stderr)
        self.exit(EXIT_BAD_INPUT, f"onnx-sbs: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="onnx-sbs",
        description="Run a torch ExportedProgram and its ONNX export side by side, node by node.",
    )
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    add_run_command(sub)
    add_diff_command(sub)
    add_precision_command(sub)
    add_quantize_command(sub)
    add_generate_command(sub)
    add_report_commands(sub)  # report, demo, replay, notebook
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit code (argparse's own exits included)."""
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help (0) or a usage error (2), already printed
            return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
        # looked up at each call: a test may stand in for one command
        commands = {
            "run": cmd_run,
            "diff": cmd_diff,
            "report": cmd_report,
            "demo": cmd_demo,
            "notebook": cmd_notebook,
            "precision": cmd_precision,
            "quantize-advice": cmd_quantize,
            "generate": cmd_generate,
            "replay": cmd_replay,
        }
        return commands[args.command](args)
    except KeyboardInterrupt:
        # before the run started (loading, preparing) or after it: nothing to keep
        print("onnx-sbs: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # `onnx-sbs ... | head`: the reader has what it wanted; say nothing more, and keep
        # Python from failing again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except (CliError, ReportFormatError, BundleMissingError, OSError) as e:
        print(f"onnx-sbs: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except SbsInputError as e:
        # the engine's own input checks (unreadable model, wrong inputs, no CUDA, ...)
        print(f"onnx-sbs: error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


__all__ = [
    "DEFAULT_JSONL",
    "DEMO_REPORTS",
    "EXIT_BAD_INPUT",
    "EXIT_BROKEN_PIPE",
    "EXIT_FAIL",
    "EXIT_INCOMPLETE",
    "EXIT_INTERRUPTED",
    "EXIT_PASS",
    "CliError",
    "_path",
    "bisect_after_run",
    "build_parser",
    "check_outputs",
    "check_paths",
    "jsonl_path",
    "main",
    "many_inputs",
    "report_run",
    "run_and_report",
    "run_files",
    "run_many_and_report",
    "run_report_summary",
    "verdict_exit_code",
    "write_node_data_files",
    "write_reports",
]
