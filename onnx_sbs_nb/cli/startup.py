"""What ``onnx-sbs`` decides before torch loads: whether the command line will run a
command at all.

``--help``, a usage error or a missing file is answered from the parser and the file
system alone (a tenth of a second, ``benchmarks/bench_cli_startup.py``); a command that
runs imports the engine first, in one go (``__main__`` freezes those modules out of the
garbage collector's walks, ``cli/gc.py``).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
from collections.abc import Sequence

from .main import CliError, _path, build_parser, run_files


def runs_a_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` parses to a command that will run (not --help, not a usage
    error, not a missing file); parsed quietly, as :func:`onnx_sbs_nb.cli.main.main`
    parses it again and answers."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            args = build_parser().parse_args(argv)
        except SystemExit:
            return False
    try:
        _files_exist(args)
    except CliError:
        return False  # main says which file is missing, as fast as a usage error
    return True


def _files_exist(args: argparse.Namespace) -> None:
    """The model and input files that ``run`` and ``diff`` name exist (CliError)."""
    if args.command == "run":
        args = copy.copy(args)  # run_files fills the flags from the positionals
        run_files(args)
        files = [args.ep, args.onnx, *args.inputs]
    elif args.command == "diff":
        files = [args.a, args.b, args.inputs]
    else:
        return
    for f in files:
        if not _path(f, "input").exists():
            raise CliError(f"{f!r}: no such file")


def import_engine() -> None:
    """The heavy modules every running command needs (torch, onnx, onnxruntime), imported
    at once so that ``__main__`` freezes them out of the garbage collector's walks."""
    import onnxruntime  # noqa: F401

    from ..align.engine import options  # noqa: F401  (torch and onnx come with it)


__all__ = ["import_engine", "runs_a_command"]
