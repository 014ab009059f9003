"""``onnx-sbs report`` (reports again from a records file), ``demo`` (a model with a
known bug, found), ``replay`` (a replay bundle run again) and ``notebook`` (an executed
notebook as an offline HTML report)."""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
from typing import Any

from .common import (
    _OUT_HELP,
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_INTERRUPTED,
    EXIT_PASS,
    CliError,
    _path,
    check_outputs,
    interrupts_wait,
    verdict_exit_code,
    write_reports,
)
from .run import run_report_summary

DEMO_REPORTS = ("report.html", "report.xlsx", "report.csv")


def add_report_commands(sub: Any) -> None:
    rep = sub.add_parser("report", help="rebuild reports from a records file (.jsonl)")
    rep.add_argument("records", help="records written by `onnx-sbs run` (.jsonl, .csv, .xlsx)")
    rep.add_argument(
        "-o", "--output", nargs="+", action="extend", required=True, metavar="FILE", help=_OUT_HELP
    )

    demo = sub.add_parser("demo", help="build a small model with a known bug and find it")
    demo.add_argument("-o", "--output", default="onnx_sbs_demo", metavar="DIR", help="folder")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")

    rp = sub.add_parser(
        "replay", help="run a replay bundle's node again, executing nothing from the bundle"
    )
    rp.add_argument("bundle", help="a replay bundle folder (written by --replay-dir)")

    nb = sub.add_parser("notebook", help="an executed notebook as an offline HTML report")
    nb.add_argument("notebook", help="executed notebook (.ipynb) holding SbsWidget outputs")
    nb.add_argument("-o", "--output", required=True, metavar="FILE", help="HTML file to write")


def cmd_report(args: argparse.Namespace) -> int:
    from ..align.blame.summary import summarize
    from ..reports.report import read_records_file

    outputs = check_outputs(args.output)
    found = read_records_file(_path(args.records, "records"))
    summary = summarize(found.records, completion=found.completion)
    title = f"onnx-sbs: {pathlib.Path(args.records).name}"
    with interrupts_wait():
        written = write_reports(found.records, outputs, summary, sys.stdout, title=title)
    print(summary.to_text())
    if not written:
        return EXIT_BAD_INPUT
    return verdict_exit_code(summary.verdict)


def cmd_demo(args: argparse.Namespace) -> int:
    """Exit 0 when the run names the node broken on purpose, 1 when it does not."""
    from ..align.engine.options import RunOptions
    from .demo import write_demo

    folder = pathlib.Path(args.output)
    if folder.exists() and not folder.is_dir():
        raise CliError(f"{str(folder)!r} is a file: give a folder for the demo files")
    print(f"building the demo model into {folder}/ ...")
    files = write_demo(folder)
    print(f"the ONNX node {files.culprit!r} was made wrong on purpose; finding it:")
    names = list(DEMO_REPORTS)
    if importlib.util.find_spec("openpyxl") is None:
        # an install without it (a dependency now, but older environments) still runs
        names.remove("report.xlsx")
        print("skipping report.xlsx: writing Excel files needs openpyxl (pip install openpyxl)")
    outputs = [folder / name for name in (*names, "report.jsonl")]
    code, summary = run_report_summary(
        files.ep,
        files.onnx,
        files.inputs,
        outputs,
        RunOptions(own_error=True),
        progress=not args.no_progress,
    )
    if code == EXIT_INTERRUPTED:
        return code
    found = summary.culprit
    print(f"open {folder / 'report.html'} in a browser to explore the run")
    if found is not None and found.onnx_name == files.culprit_output:
        print(f"found it: {files.culprit!r} ({found.onnx_op_type}) is the culprit: {found.why}")
        return EXIT_PASS
    print(f"the run did not single out {files.culprit!r}: this is a bug in onnx-sbs")
    return EXIT_FAIL


def cmd_replay(args: argparse.Namespace) -> int:
    """A replay bundle read by the package (its replay.py is for bundles you wrote)."""
    from ..align.post.replay_load import load_replay

    print(load_replay(args.bundle).to_text())
    return EXIT_PASS


def cmd_notebook(args: argparse.Namespace) -> int:
    from ..reports.notebook import export_notebook

    src = pathlib.Path(args.notebook)
    if not src.is_file():
        raise CliError(f"notebook {str(src)!r} does not exist")
    out = pathlib.Path(args.output)
    if out.suffix.lower() not in (".html", ".htm"):
        raise CliError(f"{str(out)!r}: the notebook report is HTML, name it report.html")
    result = export_notebook(src, out)
    print(
        f"wrote {out}: {result.views} SbsWidget view(s) rendered from the saved state, "
        f"{result.fallbacks} widget output(s) shown through their static fallback"
    )
    return EXIT_PASS
