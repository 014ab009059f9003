"""``onnx-sbs``: run a side-by-side comparison from a terminal or a CI job.

Exit codes: 0 every pair passes, 1 a pair fails its tolerance (or a node fails to run),
2 bad input (a missing or hostile file, a wrong option, a report that cannot be written),
3 the run did not compare the whole model (it ended with an error; ``report`` of a
stopped or cut-short run), 130 interrupted (Ctrl-C: the reports of what was computed are
still written, and say STOPPED).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import pathlib
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..completion import Completion
from ..errors import SbsInputError
from ..files import output_lock, planted_link, writable_location
from ..notebook.run_args import add_run_arguments, options_from_args
from ..records import Record
from ..reports.html import BundleMissingError
from ..reports.report import (
    REPORT_SUFFIXES,
    JsonlWriter,
    RecordsWriteError,
    ReportFormatError,
    read_jsonl,
    write_report,
)
from .precision import add_precision_command, cmd_precision

if TYPE_CHECKING:
    # torch and onnx come with the engine: a subcommand imports it when it runs, so
    # --help and argument errors answer at once (tests/test_rough_edges.py)
    from ..align.engine.options import RunOptions

EXIT_PASS = 0
EXIT_FAIL = 1
EXIT_BAD_INPUT = 2
EXIT_INCOMPLETE = 3
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141  # as a shell reports a command ended by SIGPIPE

DEFAULT_JSONL = "onnx_sbs_run.jsonl"
DEMO_REPORTS = ("report.html", "report.xlsx", "report.csv")


class CliError(Exception):
    """Bad input found by the command line itself; the message says what to fix."""


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

    run = sub.add_parser(
        "run",
        help="compare model.pt2 and model.onnx on the same inputs",
        usage="%(prog)s [-h] PROGRAM.pt2 MODEL.onnx INPUTS.pt [-o FILE ...] [options]",
    )
    # positionals as `diff` takes them, or the flags: a positional fills what no flag gave
    run.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="the exported program (.pt2), the ONNX model (.onnx) and the inputs (.pt), "
        "in this order (or --ep, --onnx, --inputs)",
    )
    run.add_argument("--ep", help="exported program (torch.export.save, .pt2)")
    run.add_argument("--onnx", help="ONNX model exported from it (.onnx)")
    run.add_argument(
        "--inputs",
        nargs="+",
        metavar="INPUTS",
        help="inputs saved with torch.save: tuple, dict or (args, kwargs); several files "
        "or a folder of .pt files: one run per input, the worst of each pair reported",
    )
    _add_outputs(run)
    add_run_arguments(run)
    run.add_argument(
        "--replay-culprit",
        action="store_true",
        help="write the culprit's replay bundle (the sub-model from the nearest values with "
        "a torch twin to the culprit, on those values) into --replay-dir, or a folder "
        "sbs_replays beside the reports, and replay it to check that it shows the error",
    )
    run.add_argument("--no-progress", action="store_true", help="no progress bar")
    _add_bisect(run)
    _add_diff_command(sub)
    add_precision_command(sub)

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
    return p


_OUT_HELP = (
    f"report files; the format follows the suffix ({', '.join(REPORT_SUFFIXES)}); "
    "NAME.node_data.json: per-node errors for Model Explorer; `-o a.html b.xlsx` and "
    "`-o a.html -o b.xlsx` both write every file"
)


def _add_outputs(p: argparse.ArgumentParser) -> None:
    # "extend": a repeated -o adds its files (argparse's default kept only the last -o)
    p.add_argument(
        "-o", "--output", nargs="+", action="extend", default=[], metavar="FILE", help=_OUT_HELP
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The console script; returns the exit code (argparse's own exits included)."""
    try:
        try:
            args = build_parser().parse_args(argv)
        except SystemExit as e:  # --help (0) or a usage error (2), already printed
            return e.code if isinstance(e.code, int) else EXIT_BAD_INPUT
        commands = {
            "run": cmd_run,
            "diff": cmd_diff,
            "report": cmd_report,
            "demo": cmd_demo,
            "notebook": cmd_notebook,
            "precision": cmd_precision,
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


# ---- outputs ---------------------------------------------------------------------------


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


# ---- run -------------------------------------------------------------------------------


def run_files(args: argparse.Namespace) -> None:
    """Fills ``args.ep/onnx/inputs`` from the positionals, in that order, where no flag
    gave them; exactly three files in all, or a CliError that says what is missing."""
    given = list(args.files)
    for flag in ("ep", "onnx", "inputs"):
        if getattr(args, flag) is None and given:
            value = given.pop(0)
            setattr(args, flag, [value] if flag == "inputs" else value)
    missing = [f"--{f}" for f in ("ep", "onnx", "inputs") if getattr(args, f) is None]
    if given or missing:
        what = (
            f"{len(given)} file(s) too many: {', '.join(map(repr, given))}"
            if given
            else f"missing {', '.join(missing)}"
        )
        raise CliError(
            f"{what}; run takes the exported program, the ONNX model and the inputs: "
            "`onnx-sbs run prog.pt2 model.onnx inputs.pt -o report.html` "
            "(or --ep/--onnx/--inputs; files after -o are reports)"
        )


def cmd_run(args: argparse.Namespace) -> int:
    run_files(args)
    many = many_inputs(args.inputs)
    inputs = many if many is not None else args.inputs
    args.inputs = inputs[0]  # one input file: the run (and --bisect) as before
    files = (("--ep", args.ep), ("--onnx", args.onnx), *(("--inputs", i) for i in inputs))
    outputs, node_data = check_paths(files, args.output)
    options = options_from_args(args)
    if options.replay_dir is not None:
        why = writable_location(options.replay_dir / "bundle")
        if why:
            raise CliError(f"--replay-dir: {why}")
    culprit_root = None
    if args.replay_culprit:
        culprit_root = options.replay_dir or (
            jsonl_path(list(outputs) or list(node_data)).parent / "sbs_replays"
        )
        why = None if options.replay_dir else planted_link(culprit_root)
        why = why or writable_location(pathlib.Path(culprit_root) / "bundle")
        if why:
            raise CliError(f"--replay-culprit: {why}")
    if many is not None:
        if args.bisect:
            raise CliError("--bisect takes one input: give one --inputs file")
        return run_many_and_report(
            args.ep,
            args.onnx,
            many,
            outputs,
            options,
            progress=not args.no_progress,
            node_data=node_data,
            culprit_root=culprit_root,
        )
    code = run_and_report(
        args.ep,
        args.onnx,
        args.inputs,
        outputs,
        options,
        progress=not args.no_progress,
        node_data=node_data,
        culprit_root=culprit_root,
    )
    if args.bisect and code != EXIT_INTERRUPTED:
        done = bisect_after_run(
            args.ep, args.onnx, args.inputs, options, progress=not args.no_progress
        )
        if done is None:
            return EXIT_INTERRUPTED
    return code


def run_and_report(
    ep: Any,
    onx: Any,
    inputs: Any,
    outputs: Sequence[pathlib.Path],
    options: RunOptions,
    *,
    progress: bool = True,
    stdout: TextIO | None = None,
    node_data: Sequence[pathlib.Path] = (),
    culprit_root: pathlib.Path | None = None,
) -> int:
    """Runs, streams records to the .jsonl, writes the other reports, prints the summary;
    with ``culprit_root``, writes the culprit's replay bundle there and replays it."""
    return run_report_summary(
        ep,
        onx,
        inputs,
        outputs,
        options,
        progress=progress,
        stdout=stdout,
        node_data=node_data,
        culprit_root=culprit_root,
    )[0]


def run_report_summary(
    ep: Any,
    onx: Any,
    inputs: Any,
    outputs: Sequence[pathlib.Path],
    options: RunOptions,
    *,
    progress: bool = True,
    stdout: TextIO | None = None,
    node_data: Sequence[pathlib.Path] = (),
    culprit_root: pathlib.Path | None = None,
) -> tuple[int, Any]:
    """:func:`run_and_report`, also returning the Summary."""
    from ..align.run import AlignedRun

    run = AlignedRun(ep, onx, inputs, options=options)
    title = f"onnx-sbs: {_name(onx)} vs {_name(ep)}"
    return report_run(
        run,
        outputs,
        title,
        progress=progress,
        stdout=stdout,
        node_data=node_data,
        source=onx,
        culprit_root=culprit_root,
    )


def many_inputs(given: Sequence[str]) -> list[str] | None:
    """The input files of a run over many inputs (several files, or the ``.pt`` files of
    a folder), None for a run over one input file."""
    if len(given) == 1 and not pathlib.Path(given[0]).is_dir():
        return None
    if len(given) > 1:
        return list(given)
    from ..align.many_inputs import input_files

    return [str(p) for p in input_files(given[0])]


def run_many_and_report(
    ep: Any,
    onx: Any,
    inputs: Sequence[str],
    outputs: Sequence[pathlib.Path],
    options: RunOptions,
    *,
    progress: bool = True,
    stdout: TextIO | None = None,
    node_data: Sequence[pathlib.Path] = (),
    culprit_root: pathlib.Path | None = None,
) -> int:
    """One run per input file, the program prepared and paired once; the records (one
    per pair, the worst input's) stream to the reports as :func:`run_and_report`'s do.
    With ``culprit_root``, the culprit's bundle is made on the input that shows it."""
    from ..align.run import aligned_over_inputs

    with _InputsProgress(len(inputs), enabled=progress) as bar:
        run = aligned_over_inputs(ep, onx, list(inputs), options, on_input=bar.update)
        title = f"onnx-sbs: {_name(onx)} vs {_name(ep)} over {len(inputs)} inputs"
        code, _ = report_run(
            run,
            outputs,
            title,
            progress=False,
            stdout=stdout,
            node_data=node_data,
            source=onx,
            culprit_root=culprit_root,
        )
    return code


class _InputsProgress:
    """A tqdm bar over the inputs of a run over many inputs (the engine has no tqdm)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.total = total
        self.enabled = enabled
        self.bar: Any = None

    def __enter__(self) -> _InputsProgress:
        return self

    def update(self, index: int, status: Any) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=self.total, unit="input", desc="onnx-sbs", file=sys.stderr)
        self.bar.update(index + 1 - self.bar.n)
        if self.bar.n >= self.total:
            # done before the summary prints: closed later, tqdm would draw it again below
            self.bar.close()

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def report_run(
    run: Any,
    outputs: Sequence[pathlib.Path],
    title: str,
    *,
    progress: bool = True,
    stdout: TextIO | None = None,
    node_data: Sequence[pathlib.Path] = (),
    source: Any = None,
    culprit_root: pathlib.Path | None = None,
) -> tuple[int, Any]:
    """Consumes a run: records stream to the .jsonl, then the reports and the summary.

    ``node_data``: Model Explorer files to write; ``source``: the candidate model as the
    user gave it (its path goes in the command that opens them); ``culprit_root``: where
    the culprit's replay bundle goes (none written without it).
    """

    stdout = stdout or sys.stdout
    jsonl = jsonl_path(list(outputs) or list(node_data))  # beside the files asked for
    options = getattr(run, "options", None)
    header = {
        "title": title,
        "nodes_total": run.status.total_onnx_nodes,
        "options": options.to_dict() if options is not None else None,
    }
    with output_lock(jsonl):  # another run writing the same files is refused
        return _report_run(
            run, jsonl, header, outputs, title, progress, stdout, node_data, source, culprit_root
        )


def _save_culprit_bundle(run: Any, root: pathlib.Path, summary: Any, stdout: TextIO) -> None:
    """--replay-culprit: the bundle, named on the summary's culprit (so the terminal and
    every report say where it is and whether it reproduces), or why there is none."""
    from ..reports.culprit_bundle import save_culprit_bundle

    try:
        bundle = save_culprit_bundle(run, root, summary)
    except Exception as e:  # a failed bundle does not cost the reports
        print(f"onnx-sbs: culprit bundle not written: {_printable(str(e))}", file=sys.stderr)
        return
    if bundle is None:
        print("culprit bundle: none (the run names no culprit ONNX node)", file=stdout)
    else:
        summary.culprit.bundle = bundle.brief()


def _report_run(
    run: Any,
    jsonl: pathlib.Path,
    header: dict[str, Any],
    outputs: Sequence[pathlib.Path],
    title: str,
    progress: bool,
    stdout: TextIO,
    node_data: Sequence[pathlib.Path],
    source: Any,
    culprit_root: pathlib.Path | None = None,
) -> tuple[int, Any]:
    from ..align.blame.summary import summarize

    interrupted = False
    error = None
    with JsonlWriter(jsonl, header=header) as writer, _Progress(run, enabled=progress) as bar:
        try:
            for rec in run:
                writer.write(rec)
                bar.update()
        except KeyboardInterrupt:
            interrupted = True
            run.stop()
        except RecordsWriteError:
            run.stop()
            raise  # the file keeps its complete lines; the message names it (exit 2)
        except SbsInputError:
            raise  # found while running (exit 2); the .jsonl stays without its trailer
        except Exception as e:  # the engine's own failure: what it computed is kept
            error = f"{type(e).__name__}: {e}"
            traceback.print_exc(file=sys.stderr)
        completion = Completion.of_run(run.status, ended=True, stopped=interrupted, error=error)
        writer.finish(completion)
    with interrupts_wait() as interrupted_again:
        # the other formats come from the streamed file, the record of the run that survives
        records = read_jsonl(jsonl)
        model = getattr(run, "model", None)
        summary = summarize(
            records,
            node_inputs=model if hasattr(model, "graph") else None,
            completion=completion,
            strict=bool(getattr(getattr(run, "options", None), "strict", False)),
        )
        print(f"records: {jsonl}", file=stdout)
        if culprit_root is not None and not interrupted:
            _save_culprit_bundle(run, culprit_root, summary, stdout)
        written = write_reports(
            records,
            outputs,
            summary,
            stdout,
            streamed=jsonl,
            title=title,
            model=model if hasattr(model, "graph") else None,
        )
        write_node_data_files(records, node_data, run, stdout, source)
        print(summary.to_text(), file=stdout)
        _print_replays(run.status.extra, stdout)
    if interrupted or interrupted_again():
        print("interrupted: the reports hold the records computed so far", file=stdout)
        return EXIT_INTERRUPTED, summary
    if not written:
        return EXIT_BAD_INPUT, summary
    return verdict_exit_code(summary.verdict), summary


def verdict_exit_code(verdict: str) -> int:
    if verdict == "pass":
        return EXIT_PASS
    if verdict == "fail":
        return EXIT_FAIL
    return EXIT_INCOMPLETE  # stopped or incomplete: no verdict on the whole model


def _print_replays(extra: dict[str, Any], stdout: TextIO) -> None:
    """The replay bundles written after the run, and the ones that could not be."""
    bundles = extra.get("replay_bundles") or []
    if bundles:
        print(f"replay bundles: {len(bundles)} written", file=stdout)
        for b in bundles:
            print(f"  {b}", file=stdout)
    for problem in extra.get("replay_errors") or []:
        print(f"onnx-sbs: replay bundle not written: {_printable(str(problem))}", file=sys.stderr)


def _printable(text: str) -> str:
    from ..align.blame.summary import _printable as printable

    return printable(text)


def _name(obj: Any) -> str:
    """A short label for a path or an in-memory model in a report title."""
    if isinstance(obj, str | pathlib.Path):
        return pathlib.Path(obj).name
    return type(obj).__name__


class _Progress:
    """A tqdm bar over ONNX nodes, driven by ``run.status`` (the engine has no tqdm)."""

    def __init__(self, run: Any, enabled: bool) -> None:
        self.run = run
        self.enabled = enabled
        self.bar: Any = None

    def __enter__(self) -> _Progress:
        return self

    def update(self) -> None:
        if not self.enabled:
            return
        st = self.run.status
        if self.bar is None:
            from tqdm.auto import tqdm

            # created on the first record: the engine knows the node count by then
            self.bar = tqdm(
                total=st.total_onnx_nodes or None, unit="node", desc="onnx-sbs", file=sys.stderr
            )
        if st.total_onnx_nodes and self.bar.total != st.total_onnx_nodes:
            self.bar.total = st.total_onnx_nodes
        self.bar.set_postfix(fail=st.failures, max_err=f"{st.max_err_abs:.2g}", refresh=False)
        # update() honours tqdm's mininterval, so a fast run does not flood the terminal
        self.bar.update(st.done_onnx_nodes - self.bar.n)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.n = self.run.status.done_onnx_nodes
            self.bar.refresh()
            self.bar.close()


# ---- deployment: Model Explorer node data, optimizer bisection, two models ------------


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


def write_node_data_files(
    records: list[Record],
    paths: Sequence[pathlib.Path],
    run: Any,
    stream: TextIO,
    source: Any = None,
) -> None:
    """Node data for Model Explorer, keyed by the nodes of the graph the run compared;
    an optimized graph is saved beside it (it exists nowhere else)."""
    from ..reports.model_explorer import save_node_data

    deployed = getattr(run, "deployment", None) is not None
    for p in paths:
        files = save_node_data(records, p, run.model, save_model=deployed)
        print(f"wrote {files.node_data}", file=stream)
        if files.model is not None:
            print(f"wrote {files.model} (the graph onnxruntime runs)", file=stream)
        given = source if isinstance(source, str | pathlib.Path) else None
        print(f"  open it: {files.command(given)}", file=stream)


def _add_bisect(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bisect",
        action="store_true",
        help="after the run, find the onnxruntime optimizers whose disabling makes the "
        "optimized session (--optimize level, default all) agree with torch",
    )


def bisect_after_run(
    ep: Any, onx: Any, inputs: Any, options: RunOptions, *, progress: bool = True
) -> Any:
    """Bisects over the optimizers onnxruntime applied; prints the answer.

    Returns the OptimizerBlame, False when it could not bisect (the reason printed; the
    run's exit code stands), None when interrupted.
    """
    from ..align.bisect import bisect_optimizers
    from ..errors import SbsInputError

    level = options.optimize or "all"
    print(f"bisecting the optimizers of level {level!r} (one whole-model session per step)")
    try:
        with _BisectProgress(progress) as bar:
            blame = bisect_optimizers(
                ep,
                onx,
                inputs,
                level=level,
                providers=options.providers,
                atol=options.atol,
                rtol=options.rtol,
                progress=bar,
            )
    except KeyboardInterrupt:
        print("bisect: interrupted (the run's reports are written)")
        return None
    except SbsInputError as e:
        print(f"onnx-sbs: cannot bisect: {e}", file=sys.stderr)
        return False
    print(f"bisect: {blame.verdict}: {blame.message}")
    if blame.optimizers:
        print(
            "  to deploy without them: "
            f"InferenceSession(..., disabled_optimizers={list(blame.optimizers)!r})"
        )
    return blame


class _BisectProgress:
    """A tqdm bar over the whole-model sessions of a bisection."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.bar: Any = None

    def __enter__(self) -> _BisectProgress:
        return self

    def __call__(self, step: Any) -> None:
        if not self.enabled:
            return
        if self.bar is None:
            from tqdm.auto import tqdm

            # no rate: n is set from the bisection's own count, so tqdm's rate would be
            # a nonsense figure ("91180.52session/s")
            self.bar = tqdm(
                total=step.estimate,
                desc="bisect",
                file=sys.stderr,
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} sessions "
                "[{elapsed}]{postfix}",
            )
        self.bar.total = max(step.estimate, step.sessions)
        self.bar.n = step.sessions
        self.bar.set_postfix_str(step.message[:60], refresh=False)
        self.bar.refresh()

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def _add_diff_command(sub: Any) -> None:
    diff = sub.add_parser("diff", help="compare two ONNX models of one program, node by node")
    diff.add_argument("a", help="the reference ONNX model (.onnx)")
    diff.add_argument("b", help="the ONNX model compared with it (.onnx)")
    diff.add_argument(
        "--inputs",
        required=True,
        help="inputs of model a saved with torch.save: tuple (in input order) or dict by name",
    )
    _add_outputs(diff)
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


# ---- report / demo / notebook ----------------------------------------------------------


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
