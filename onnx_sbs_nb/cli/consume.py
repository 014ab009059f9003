"""How the command line consumes a run: through the one consumer the notebook's session
uses (``notebook/stream.py``), records streamed to the ``.jsonl`` as they come with a
progress bar, Ctrl-C keeping what was computed; then the reports, the summary (the
run's own ``summarize``, as the session makes it) and the culprit's bundle."""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import SbsInputError
from ..files import output_lock
from ..records import Record
from ..reports.report import JsonlWriter, RecordsWriteError, read_jsonl
from .common import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    _printable,
    interrupts_wait,
    jsonl_path,
    verdict_exit_code,
    write_reports,
)

if TYPE_CHECKING:
    # the engine (torch, onnx) loads when a command runs, so --help answers at once
    from ..align.contract import Run


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

    from ..align.contract import as_run

    stdout = stdout or sys.stdout
    jsonl = jsonl_path(list(outputs) or list(node_data))  # beside the files asked for
    header = {
        "title": title,
        "nodes_total": run.status.total_onnx_nodes,
        "options": run.options.to_dict(),
    }
    with output_lock(jsonl):  # another run writing the same files is refused
        return _report_run(
            as_run(run),
            jsonl,
            header,
            outputs,
            title,
            progress,
            stdout,
            node_data,
            source,
            culprit_root,
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
    run: Run,
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
    from ..notebook.stream import FAILED, RunConsumer

    # a records file that cannot be written (exit 2, the file keeps its complete lines)
    # and bad input found while running (exit 2, no trailer) end the command
    consumer = RunConsumer(
        run, batch_interval=0.0, reraise=(RecordsWriteError, SbsInputError), summary_at_end=False
    )
    with JsonlWriter(jsonl, header=header) as writer, _Progress(run, enabled=progress) as bar:

        def on_rows(event: str, payload: dict[str, Any]) -> None:
            if event == "rows":
                for rec in payload["records"]:
                    writer.write(rec)
                    bar.update()

        consumer.add_listener(on_rows)
        consumer.start()
        if consumer.state == FAILED:  # the engine's own failure: what it computed is kept
            print(consumer.error, file=sys.stderr, end="")
        writer.finish(consumer.completion)
    interrupted = consumer.interrupted
    with interrupts_wait() as interrupted_again:
        # the other formats come from the streamed file, the record of the run that survives
        records = read_jsonl(jsonl)
        model = run.model
        summary = consumer.summarize(records)
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
            model=model,
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


def _print_replays(extra: dict[str, Any], stdout: TextIO) -> None:
    """The replay bundles written after the run, and the ones that could not be."""
    bundles = extra.get("replay_bundles") or []
    if bundles:
        print(f"replay bundles: {len(bundles)} written", file=stdout)
        for b in bundles:
            print(f"  {b}", file=stdout)
    for problem in extra.get("replay_errors") or []:
        print(f"onnx-sbs: replay bundle not written: {_printable(str(problem))}", file=sys.stderr)


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

    deployed = run.deployment is not None
    for p in paths:
        files = save_node_data(records, p, run.model, save_model=deployed)
        print(f"wrote {files.node_data}", file=stream)
        if files.model is not None:
            print(f"wrote {files.model} (the graph onnxruntime runs)", file=stream)
        given = source if isinstance(source, str | pathlib.Path) else None
        print(f"  open it: {files.command(given)}", file=stream)
