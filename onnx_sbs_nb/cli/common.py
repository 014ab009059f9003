"""What the subcommands share: exit codes, the report paths checked before anything runs,
the reports written (each whole or not at all), and the Ctrl-C that waits for them."""

from __future__ import annotations

import argparse
import contextlib
import pathlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

from ..files import writable_location
from ..records import Record
from ..reports.html import BundleMissingError
from ..reports.report import REPORT_SUFFIXES, write_report

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2
EXIT_INCOMPLETE = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # as a shell reports a command ended by SIGPIPE

DEFAULT_JSONL = "onnx_sbs_run.jsonl"


class CliError(Exception):
    """Bad input found by the command line itself; the message says what to fix."""


_OUT_HELP = (
    f"report files; the format follows the suffix ({', '.join(REPORT_SUFFIXES)}); "
    "NAME.node_data.json: per-node errors for Model Explorer; `-o a.html b.xlsx` and "
    "`-o a.html -o b.xlsx` both write every file"
)


def add_outputs(p: argparse.ArgumentParser) -> None:
    # "extend": a repeated -o adds its files (argparse's default kept only the last -o)
    p.add_argument(
        "-o", "--output", nargs="+", action="extend", default=[], metavar="FILE", help=_OUT_HELP
    )


def check_outputs(outputs: Sequence[str]) -> list[pathlib.Path]:
    """The report paths, checked before anything runs (a suffix we write, a writable place)."""
    paths = [_path(o, "report") for o in outputs]
    for p in paths:
        if p.suffix.lower() not in REPORT_SUFFIXES:
            raise CliError(
                f"cannot write {str(p)!r}: the report format follows the suffix, "
                f"use one of {', '.join(REPORT_SUFFIXES)}"
            )
        why = writable_location(p)
        if why:
            raise CliError(why)
    return paths


def _path(value: str, what: str) -> pathlib.Path:
    if "\x00" in value or not value:
        raise CliError(f"{what} path {value!r} is not a path")
    return pathlib.Path(value)


def jsonl_path(outputs: Sequence[pathlib.Path]) -> pathlib.Path:
    """Where records stream to: the .jsonl among the outputs, else next to the first one."""
    for p in outputs:
        if p.suffix.lower() == ".jsonl":
            return p
    if outputs:
        return outputs[0].with_suffix(".jsonl")
    return pathlib.Path(DEFAULT_JSONL)


def write_reports(
    records: list[Record],
    outputs: Sequence[pathlib.Path],
    summary: Any,
    stream: TextIO,
    streamed: pathlib.Path | None = None,
    title: str = "",
    model: Any = None,
) -> bool:
    """Writes each report (whole or not at all); False if one could not be written."""
    ok = True
    for p in outputs:
        if streamed is not None and p.resolve() == streamed.resolve():
            continue  # the records streamed to this file during the run
        try:
            write_report(records, p, summary, title=title, model=model)
        except (BundleMissingError, OSError) as e:
            # a problem with one report must not cost the user the others
            print(f"onnx-sbs: cannot write {p}: {e}", file=sys.stderr)
            ok = False
            continue
        except Exception as e:  # a writer's own failure: the other reports are still written
            print(f"onnx-sbs: cannot write {p}: {type(e).__name__}: {e}", file=sys.stderr)
            ok = False
            continue
        print(f"wrote {p}", file=stream)
    return ok


@contextlib.contextmanager
def interrupts_wait() -> Iterator[Callable[[], bool]]:
    """While reports are written, a first Ctrl-C waits for them to be whole (a second one
    abandons them: each report is still whole or absent).  Yields "was there one?"."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield lambda: False
        return

    def on_interrupt(signum: int, frame: Any) -> None:
        seen.append(signum)
        if len(seen) > 1:
            raise KeyboardInterrupt
        print("onnx-sbs: finishing the reports (Ctrl-C again abandons them)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_interrupt)
    try:
        yield lambda: bool(seen)
    finally:
        signal.signal(signal.SIGINT, previous)


def check_paths(
    files: Sequence[tuple[str, str]], outputs: Sequence[str]
) -> tuple[list[pathlib.Path], list[pathlib.Path]]:
    """The input files exist; returns the outputs, checked: (reports, node-data files)."""
    for flag, value in files:
        if not _path(value, flag).is_file():
            raise CliError(f"{flag} {value!r}: no such file")
    reports, node_data = split_node_data(outputs)
    checked = check_outputs(reports)
    for p in node_data:
        why = writable_location(p)
        if why:
            raise CliError(why)
    why = writable_location(jsonl_path(checked or node_data))
    if why:
        raise CliError(f"{why} (the records stream there: add a .jsonl to -o)")
    return checked, node_data


def split_node_data(outputs: Sequence[str]) -> tuple[list[str], list[pathlib.Path]]:
    """(report files, Model Explorer node-data files: the ``.json`` ones)."""
    reports, node_data = [], []
    for o in outputs:
        p = _path(o, "output")
        if p.suffix.lower() == ".json":
            if p.is_dir():
                raise CliError(f"{o!r} is a folder: give a file name such as run.node_data.json")
            node_data.append(p)
        else:
            reports.append(o)
    return reports, node_data


def verdict_exit_code(verdict: str) -> int:
    if verdict == "pass":
        return EXIT_PASS
    if verdict == "fail":
        return EXIT_FAIL
    return EXIT_INCOMPLETE  # stopped or incomplete: no verdict on the whole model


def _printable(text: str) -> str:
    from ..align.blame.summary import _printable as printable

    return printable(text)


def _name(obj: Any) -> str:
    """A short label for a path or an in-memory model in a report title."""
    if isinstance(obj, str | pathlib.Path):
        return pathlib.Path(obj).name
    return type(obj).__name__
