"""``onnx-sbs run``: a torch program against its ONNX export, over one input or many,
then optionally the bisection of onnxruntime's optimizers (``--bisect``)."""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..files import planted_link, writable_location
from ..notebook.run_args import add_run_arguments, options_from_args
from .common import (
    EXIT_INTERRUPTED,
    CliError,
    _name,
    add_outputs,
    check_paths,
    jsonl_path,
)
from .consume import report_run

if TYPE_CHECKING:
    # torch and onnx come with the engine: a subcommand imports it when it runs, so
    # --help and argument errors answer at once (tests/test_rough_edges.py)
    from ..align.engine.options import RunOptions


def add_run_command(sub: Any) -> None:
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
    add_outputs(run)
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
