"""`onnx-sbs` end to end: real export, real onnxruntime, real files, exit codes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import pathlib
import subprocess
import sys
import textwrap

import onnx
import pytest
import torch

from onnx_sbs_nb.cli.main import (
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_INCOMPLETE,
    EXIT_INTERRUPTED,
    EXIT_PASS,
    main,
)
from onnx_sbs_nb.records import RECORD_FIELDS
from onnx_sbs_nb.reports.report import (
    read_csv,
    read_csv_file,
    read_jsonl,
    read_jsonl_file,
    read_xlsx,
    read_xlsx_file,
)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("demo")


@pytest.fixture(scope="module")
def demo_run(demo_dir):
    """`onnx-sbs demo` once for the module: its files feed the other tests."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["demo", "-o", str(demo_dir), "--no-progress"])
    return code, buf.getvalue()


@pytest.fixture(scope="module")
def passing_files(tmp_path_factory):
    from onnx_sbs_nb.cli.demo import write_demo

    return write_demo(tmp_path_factory.mktemp("ok"), inject=False)


def test_demo_finds_the_culprit(demo_run, demo_dir):
    code, out = demo_run
    assert code == EXIT_PASS, out  # the demo found the node broken on purpose
    assert "found it: 'node_layer_norm'" in out
    for name in ("model.pt2", "model.onnx", "inputs.pt", "report.html", "report.xlsx"):
        assert (demo_dir / name).is_file(), name
    assert "verdict: FAIL" in out
    first = [line for line in out.splitlines() if line.startswith("culprit:")]
    assert first and "layer_norm" in first[0], out
    # the suspects' op column holds the whole op type (it used to cut LayerNormalizati)
    assert " LayerNormalization layer_norm" in out, out
    recs = read_jsonl(demo_dir / "report.jsonl")
    assert (
        len(recs)
        == len(read_csv(demo_dir / "report.csv"))
        == len(read_xlsx(demo_dir / "report.xlsx"))
    )
    culprit = [r for r in recs if r.onnx_name == "layer_norm"]
    assert culprit and culprit[0].passed2 is False  # own error fails: it is the bug
    gelu = [r for r in recs if r.onnx_op_type == "Gelu"]
    assert gelu and gelu[0].passed is False and gelu[0].passed2 is True  # inherits only


def test_demo_without_openpyxl_skips_the_xlsx_and_says_so(tmp_path):
    """An environment without openpyxl (installed before it was a dependency) runs the
    demo: it writes the other reports and says why there is no xlsx, instead of a
    ModuleNotFoundError."""
    code = (
        "import sys; sys.modules['openpyxl'] = None\n"  # import openpyxl now fails
        "from onnx_sbs_nb.cli.main import main\n"
        f"sys.exit(main(['demo', '-o', {str(tmp_path)!r}, '--no-progress']))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert out.returncode == EXIT_PASS, out.stdout + out.stderr
    assert "skipping report.xlsx" in out.stdout and "openpyxl" in out.stdout
    assert (tmp_path / "report.html").is_file() and (tmp_path / "report.csv").is_file()
    assert not (tmp_path / "report.xlsx").exists()


def test_xlsx_columns_are_onnx_diagnostic_names(demo_run, demo_dir):
    import openpyxl

    sheet = openpyxl.load_workbook(demo_dir / "report.xlsx")["sbs"]
    header = [c.value for c in sheet[1]]
    assert header == [f for f in RECORD_FIELDS if f != "extra"]  # extra: extra.* columns
    for col in ("ep_name", "onnx_name", "err_abs", "err_rel", "err_h01", "err_abs2", "comment"):
        assert col in header


def test_report_rebuilds_from_jsonl(demo_run, demo_dir, tmp_path, capsys):
    out = tmp_path / "again.csv"
    copy = tmp_path / "copy.jsonl"
    copy.write_text("stale\n")  # an older file is replaced, not kept
    src = str(demo_dir / "report.jsonl")
    code = main(["report", src, "-o", str(out), str(tmp_path / "r.html"), str(copy)])
    assert code == EXIT_FAIL
    assert read_csv(out) == read_csv(demo_dir / "report.csv")
    assert read_jsonl(copy) == read_jsonl(src)
    assert (tmp_path / "r.html").stat().st_size > 0
    assert "verdict: FAIL" in capsys.readouterr().out


def test_run_passes_with_exit_0(passing_files, tmp_path, capsys):
    out = tmp_path / "out" / "r.csv"
    args = ["run", "--ep", str(passing_files.ep), "--onnx", str(passing_files.onnx)]
    code = main([*args, "--inputs", str(passing_files.inputs), "-o", str(out), "--no-progress"])
    text = capsys.readouterr().out
    assert code == EXIT_PASS, text
    assert "verdict: PASS" in text
    # records always stream to a .jsonl next to the first report
    assert len(read_jsonl(out.with_suffix(".jsonl"))) == len(read_csv(out)) > 5


def _html_state(path: pathlib.Path) -> dict:
    """The view state a saved HTML report embeds (inflated when stored gzipped)."""
    import base64
    import gzip
    import re

    text = path.read_text(encoding="utf-8")
    m = re.search(r'<script type="application/json" id="[^"]+"([^>]*)>(.*?)</script>', text, re.S)
    assert m, "no embedded state"
    data = json.loads(m.group(2))
    if "gzip+base64" in m.group(1):
        data = json.loads(gzip.decompress(base64.b64decode(data)))
    return data


def test_cli_html_report_has_the_graph_around_each_node(passing_files, tmp_path, capsys):
    out = tmp_path / "r.html"
    args = ["run", "--ep", str(passing_files.ep), "--onnx", str(passing_files.onnx)]
    code = main([*args, "--inputs", str(passing_files.inputs), "-o", str(out), "--no-progress"])
    assert code == EXIT_PASS, capsys.readouterr().out
    graph = _html_state(out)["graph"]
    onx = onnx.load(str(passing_files.onnx), load_external_data=False)
    produced = {o for n in onx.graph.node for o in n.output if o}
    assert graph and produced <= set(graph["values"])


def test_run_options_reach_the_engine(demo_run, demo_dir, tmp_path, capsys):
    jsonl = tmp_path / "r.jsonl"
    args = ["run", "--ep", str(demo_dir / "model.pt2"), "--onnx", str(demo_dir / "model.onnx")]
    args += ["--inputs", str(demo_dir / "inputs.pt"), "-o", str(jsonl), "--no-progress"]
    for runner in ("reference", "torch"):
        code = main([*args, "--runner", runner, "--atol", "10", "--rtol", "10"])
        assert code == EXIT_PASS, runner  # every error is below a tolerance of 10
        recs = read_jsonl(jsonl)
        assert {r.atol for r in recs if r.atol is not None} == {10.0}
        assert all(r.err_abs2 is None for r in recs)  # no --own-error
        assert all(r.status != "error" for r in recs), runner
    code = main([*args, "--reset-all"])
    assert code == EXIT_FAIL
    # every ONNX node ran on torch inputs: only the broken node still fails
    failing = [r.onnx_name for r in read_jsonl(jsonl) if r.failed]
    assert failing == ["layer_norm"]


def test_replay_options_write_bundles(demo_run, demo_dir, tmp_path, capsys):
    args = ["run", "--ep", str(demo_dir / "model.pt2"), "--onnx", str(demo_dir / "model.onnx")]
    args += ["--inputs", str(demo_dir / "inputs.pt"), "-o", str(tmp_path / "r.jsonl")]
    replay = tmp_path / "replay"
    code = main(
        [
            *args,
            "--no-progress",
            "--replay-dir",
            str(replay),
            "--replay-op-types",
            "LayerNormalization",
        ]
    )
    assert code == EXIT_FAIL
    assert replay.is_dir() and any(replay.iterdir())
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps({"names": ["no_such_node"]}))
    replay2 = tmp_path / "replay2"
    main([*args, "--no-progress", "--replay-dir", str(replay2), "--replay-config", str(cfg)])
    assert not replay2.exists() or not any(replay2.iterdir())


# a complete `run` command line; the test formats the placeholders with its files
_RUN = ["run", "--ep", "{pt2}", "--onnx", "{onnx}", "--inputs", "{inputs}"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["run", "--onnx", "m.onnx", "--inputs", "i.pt"], "--ep"),
        (["run", "{pt2}", "{onnx}"], "missing --inputs"),
        (["run", "{pt2}", "{onnx}", "{inputs}", "{inputs}"], "too many"),
        # (a file right after --inputs is one more input: `--inputs a.pt b.pt`)
        (["run", "--inputs", "{inputs}", "--ep", "{pt2}", "{onnx}", "{inputs}"], "too many"),
        (["run", "--ep", "missing.pt2", "--onnx", "m.onnx", "--inputs", "i.pt"], "no such file"),
        (["report", "missing.jsonl", "-o", "r.html"], "no such records file"),
        ([*_RUN, "-o", "r.pdf"], ".html"),
        (["run", "--ep", "{pt2}", "--onnx", "{inputs}", "--inputs", "{inputs}"], "ONNX"),
        ([*_RUN, "--replay-names", "a"], "--replay-dir"),
        (["notebook", "missing.ipynb", "-o", "r.html"], "does not exist"),
        (["frobnicate"], "invalid choice"),
        pytest.param(
            [*_RUN, "--device", "cuda"],
            "CUDA",
            marks=pytest.mark.skipif(
                torch.cuda.is_available(), reason="needs a machine without CUDA"
            ),
        ),
    ],
)
def test_bad_input_exit_2(argv, message, demo_run, demo_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fill = {
        "pt2": demo_dir / "model.pt2",
        "onnx": demo_dir / "model.onnx",
        "inputs": demo_dir / "inputs.pt",
    }
    argv = [a.format(**{k: str(v) for k, v in fill.items()}) for a in argv]
    try:
        code = main(argv)
    except SystemExit as e:  # argparse errors
        code = e.code
    assert code == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_run_takes_positionals_and_every_repeated_output(demo_run, demo_dir, tmp_path, capsys):
    """What users type: `run prog.pt2 model.onnx inputs.pt` as `diff` takes its files, and
    -o repeated (argparse kept only the last -o: two reports were dropped silently and the
    records went to run.node_data.jsonl)."""
    html, xlsx, node_data = (
        tmp_path / "r.html",
        tmp_path / "r.xlsx",
        tmp_path / "run.node_data.json",
    )
    code = main(
        [
            "run",
            str(demo_dir / "model.pt2"),
            str(demo_dir / "model.onnx"),
            str(demo_dir / "inputs.pt"),
            "--no-progress",
            "-o",
            str(html),
            "-o",
            str(xlsx),
            "-o",
            str(node_data),
        ]
    )
    out = capsys.readouterr().out
    assert code == EXIT_FAIL, out  # the demo's model is broken on purpose
    assert html.is_file() and xlsx.is_file() and node_data.is_file(), out
    assert (tmp_path / "r.jsonl").is_file()  # streamed next to the first report
    assert not (tmp_path / "run.node_data.jsonl").exists()
    assert "culprit:" in out


def test_help_says_what_each_flag_does(capsys):
    """Every option of every command has a help text (--runner, --device and demo's
    --no-progress had none)."""
    import argparse

    from onnx_sbs_nb.cli.main import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    bare = [
        f"{name} {action.option_strings[0] if action.option_strings else action.dest}"
        for name, parser in sub.choices.items()
        for action in parser._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert bare == []
    assert main(["run", "-h"]) == EXIT_PASS
    assert "PROGRAM.pt2 MODEL.onnx INPUTS.pt" in capsys.readouterr().out


def test_diff_names_its_culprit_in_the_models_words(
    demo_run, demo_dir, passing_files, tmp_path, capsys
):
    """`onnx-sbs diff faithful.onnx broken.onnx`: the culprit's module path and source line
    come from the reference model's metadata, and its why speaks of that model's values
    (no torch runs in a diff)."""
    code = main(
        [
            "diff",
            str(passing_files.onnx),
            str(demo_dir / "model.onnx"),
            "--inputs",
            str(demo_dir / "inputs.pt"),
            "--own-error",
            "--no-progress",
            "-o",
            str(tmp_path / "d.jsonl"),
        ]
    )
    out = capsys.readouterr().out
    assert code == EXIT_FAIL, out
    lines = out.splitlines()
    culprit = next(i for i, line in enumerate(lines) if line.startswith("culprit:"))
    assert lines[culprit].startswith("culprit: layer_norm in norm "), out
    assert "demo.py:" in lines[culprit + 1] and "self.norm" in lines[culprit + 1], out
    why = next(line for line in lines[culprit:] if line.strip().startswith("why:"))
    assert "run on the reference model's values of its inputs" in why and "torch" not in why


def test_killed_run_keeps_its_records(demo_run, demo_dir, tmp_path):
    """A process killed in the middle of a run leaves a .jsonl that `report` turns into reports."""
    script = textwrap.dedent(
        f"""
        import os, pathlib
        from onnx_sbs_nb.align.engine.runners import OnnxruntimeRunner
        from onnx_sbs_nb.cli.main import run_and_report

        class DiesAtThirdNode(OnnxruntimeRunner):
            calls = 0
            def prepare(self, node, ctx):
                fn = super().prepare(node, ctx)
                def run(inputs):
                    DiesAtThirdNode.calls += 1
                    if DiesAtThirdNode.calls == 3:
                        os._exit(9)  # no cleanup, like SIGKILL
                    return fn(inputs)
                return run

        d = pathlib.Path({str(demo_dir)!r})
        out = pathlib.Path({str(tmp_path)!r}) / "killed.html"
        run_and_report(d / "model.pt2", d / "model.onnx", d / "inputs.pt", [out],
                       dict(runner=DiesAtThirdNode()), progress=False)
        """
    )
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert proc.returncode == 9, proc.stderr[-2000:]
    jsonl = tmp_path / "killed.jsonl"
    recs = read_jsonl(jsonl)
    assert recs and all(r.onnx_op_type != "Softmax" for r in recs)  # stopped early
    assert not (tmp_path / "killed.html").exists()
    # the file has no end-of-run line: whatever it holds, the run did not finish
    code = main(["report", str(jsonl), "-o", str(tmp_path / "killed.html")])
    assert code == EXIT_INCOMPLETE
    html = (tmp_path / "killed.html").read_text()
    assert "verdict: INCOMPLETE" in html and "verdict: PASS" not in html


def test_interrupted_run_writes_reports(demo_run, demo_dir, tmp_path, capsys):
    """Ctrl-C in the middle of a run: the reports hold what was computed, exit code 130."""
    from onnx_sbs_nb.align.engine.runners import OnnxruntimeRunner
    from onnx_sbs_nb.cli.main import EXIT_INTERRUPTED, run_and_report

    class InterruptedAtThirdNode(OnnxruntimeRunner):
        calls = 0

        def prepare(self, node, ctx):
            fn = super().prepare(node, ctx)

            def run(inputs):
                InterruptedAtThirdNode.calls += 1
                if InterruptedAtThirdNode.calls == 3:
                    raise KeyboardInterrupt
                return fn(inputs)

            return run

    out = tmp_path / "r.csv"
    code = run_and_report(
        demo_dir / "model.pt2",
        demo_dir / "model.onnx",
        demo_dir / "inputs.pt",
        [out],
        dict(runner=InterruptedAtThirdNode()),
        progress=False,
    )
    assert code == EXIT_INTERRUPTED
    recs = read_csv(out)
    assert recs and len(recs) == len(read_jsonl(out.with_suffix(".jsonl")))
    text = capsys.readouterr().out
    assert "interrupted" in text and "verdict: STOPPED at 2 of 5 ONNX nodes" in text
    assert read_csv_file(out).completion.state == "stopped"


def test_python_dash_m(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "onnx_sbs_nb", "run", "--help"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "--replay-threshold" in proc.stdout


# ---- untrusted input and interrupted runs (issue 12) ------------------------------------

_SLOW_NODES = textwrap.dedent(
    """
    # loaded by `site` in the onnx-sbs subprocess: every ONNX node takes a while, so a
    # signal lands in the middle of the run
    import os, time
    from onnx_sbs_nb.align.engine import runners

    _prepare = runners.OnnxruntimeRunner.prepare

    def prepare(self, node, ctx):
        fn = _prepare(self, node, ctx)

        def slow(inputs):
            time.sleep(float(os.environ["SBS_NODE_DELAY"]))
            return fn(inputs)

        return slow

    runners.OnnxruntimeRunner.prepare = prepare
    """
)


def _record_lines(path) -> int:
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if '"onnx_sbs"' not in line)


def test_sigint_stops_a_real_run_and_every_report_says_so(demo_run, demo_dir, tmp_path):
    """SIGINT to `onnx-sbs run` once 3 records are on disk: exit 130, and the .jsonl, CSV,
    xlsx, HTML and terminal all say STOPPED with the node count, never PASS."""
    import shutil
    import signal
    import time

    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(_SLOW_NODES)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(hook), ROOT, os.environ.get("PYTHONPATH", "")]),
        "SBS_NODE_DELAY": "0.4",
    }
    exe = shutil.which("onnx-sbs", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "onnx_sbs_nb"]
    out = tmp_path / "out"
    cmd += ["run", "--ep", str(demo_dir / "model.pt2"), "--onnx", str(demo_dir / "model.onnx")]
    cmd += ["--inputs", str(demo_dir / "inputs.pt"), "--no-progress", "-o"]
    cmd += [str(out / n) for n in ("r.jsonl", "r.csv", "r.xlsx", "r.html")]
    # a terminal's Ctrl-C: a test run started in the background (`cmd &`) hands its
    # children SIGINT ignored, and Python then installs no KeyboardInterrupt handler
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    jsonl = out / "r.jsonl"
    deadline = time.monotonic() + 240
    while _record_lines(jsonl) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    at_signal = _record_lines(jsonl)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=240)
    assert proc.returncode == EXIT_INTERRUPTED, stderr[-3000:]
    assert "Traceback" not in stderr
    run = read_jsonl_file(jsonl)
    c = run.completion
    assert c.state == "stopped" and c.nodes_total == 5 and c.nodes_done < 5
    assert len(run.records) >= at_signal >= 3
    head = f"verdict: STOPPED at {c.nodes_done} of 5 ONNX nodes"
    assert head in stdout and "PASS" not in stdout
    assert read_csv_file(out / "r.csv").completion == c
    assert read_xlsx_file(out / "r.xlsx").completion == c
    csv_text = (out / "r.csv").read_text()
    assert ",stopped,stopped," in csv_text.splitlines()[1]  # run_verdict, run_state
    html = (out / "r.html").read_text()
    assert head in html and "verdict: PASS" not in html
    assert main(["report", str(jsonl), "-o", str(tmp_path / "again.html")]) == EXIT_INCOMPLETE


def test_second_interrupt_while_reports_are_written(demo_run, demo_dir, tmp_path, capsys):
    """Ctrl-C during the run, then again while the reports are written: they are whole."""
    import signal

    import onnx_sbs_nb.cli.common as common
    import onnx_sbs_nb.cli.main as cli
    from onnx_sbs_nb.align.engine.runners import OnnxruntimeRunner

    class InterruptedOnce(OnnxruntimeRunner):
        calls = 0

        def prepare(self, node, ctx):
            fn = super().prepare(node, ctx)

            def run(inputs):
                InterruptedOnce.calls += 1
                if InterruptedOnce.calls == 2:
                    raise KeyboardInterrupt
                return fn(inputs)

            return run

    write = common.write_report  # what every report is written with
    calls = []

    def write_interrupted(records, path, *args, **kwargs):
        calls.append(path)
        if len(calls) == 1:
            signal.raise_signal(signal.SIGINT)  # the user presses Ctrl-C again
        return write(records, path, *args, **kwargs)

    outputs = [tmp_path / "r.xlsx", tmp_path / "r.csv"]
    try:
        common.write_report = write_interrupted
        code = cli.run_and_report(
            demo_dir / "model.pt2",
            demo_dir / "model.onnx",
            demo_dir / "inputs.pt",
            outputs,
            dict(runner=InterruptedOnce()),
            progress=False,
        )
    finally:
        common.write_report = write
    assert code == EXIT_INTERRUPTED and len(calls) == 2
    assert "finishing the reports" in capsys.readouterr().err
    assert read_xlsx_file(outputs[0]).completion.state == "stopped"
    assert read_csv_file(outputs[1]).records
    # no temporary file left next to the reports
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.csv", "r.jsonl", "r.xlsx"]


def test_interrupt_during_startup_is_exit_130(demo_run, demo_dir, tmp_path, capfd):
    import onnx_sbs_nb.align.run as run_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    original = run_module.AlignedRun.__init__
    run_module.AlignedRun.__init__ = interrupted
    try:
        argv = ["run", "--ep", str(demo_dir / "model.pt2"), "--onnx", str(demo_dir / "model.onnx")]
        code = main([*argv, "--inputs", str(demo_dir / "inputs.pt"), "-o", str(tmp_path / "r.csv")])
    finally:
        run_module.AlignedRun.__init__ = original
    out, err = capfd.readouterr()
    assert code == EXIT_INTERRUPTED and "interrupted" in err and "Traceback" not in err + out


def _bad_files(tmp_path):
    """Hostile or foreign inputs for the bad-option table, built here."""
    import os as _os

    files = {}
    (tmp_path / "bad.json").write_text("{names: [")
    (tmp_path / "types.json").write_text(json.dumps({"names": 5}))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "garbage.xlsx").write_bytes(_os.urandom(300))
    (tmp_path / "not_ours.csv").write_text("a,b\n1,2\n")
    (tmp_path / "typed.jsonl").write_text(json.dumps({"status": "ok", "kind": "node", "step": "x"}))
    (tmp_path / "status.jsonl").write_text(
        json.dumps({"status": "fine", "kind": "node", "step": 1})
    )
    (tmp_path / "a_file").write_text("x")
    for name in ("bad", "types", "list", "binary"):
        files[name] = str(tmp_path / f"{name}.json")
    return files


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--replay-dir", "{tmp}/r", "--replay-config", "{tmp}/bad.json"], "not valid"),
        (["--replay-dir", "{tmp}/r", "--replay-config", "{tmp}/types.json"], "list of str"),
        (["--replay-dir", "{tmp}/r", "--replay-config", "{tmp}/list.json"], "must be an object"),
        (["--replay-dir", "{tmp}/r", "--replay-config", "{tmp}/binary.json"], "not valid"),
        (["--replay-dir", "{tmp}/a_file", "--replay-names", "x"], "is a file"),
        (["--replay-dir", "{tmp}/r\x00x", "--replay-names", "x"], "folder path"),
        (["--replay-dir", "{tmp}/a_file/sub", "--replay-names", "x"], "not a folder"),
        (["-o", "{tmp}/a_file/r.html"], "not a folder"),
        (["-o", "{tmp}/r\x00.html"], "not a path"),
        (["--atol", "nan"], "finite number"),
        (["--atol", "-1"], "finite number"),
        (["--rtol", "inf"], "finite number"),
        (["--runner", "bogus"], "invalid choice"),
    ],
)
def test_every_bad_run_option_is_exit_2(extra, message, demo_run, demo_dir, tmp_path, capfd):
    _bad_files(tmp_path)
    argv = ["run", "--ep", str(demo_dir / "model.pt2"), "--onnx", str(demo_dir / "model.onnx")]
    argv += ["--inputs", str(demo_dir / "inputs.pt"), "--no-progress"]
    argv += [a.replace("{tmp}", str(tmp_path)) for a in extra]
    if "-o" not in extra:
        argv += ["-o", str(tmp_path / "ok.jsonl")]
    code = main(argv)
    out, err = capfd.readouterr()
    assert code == EXIT_BAD_INPUT, out + err
    assert message in err and "Traceback" not in out + err, err


@pytest.mark.parametrize(
    "name, message",
    [
        ("garbage.xlsx", "cannot read"),
        ("not_ours.csv", "not an onnx-sbs records table"),
        ("typed.jsonl", "step must be an integer"),
        ("status.jsonl", "unknown status"),
    ],
)
def test_report_refuses_files_that_are_not_ours(name, message, tmp_path, capfd):
    _bad_files(tmp_path)
    code = main(["report", str(tmp_path / name), "-o", str(tmp_path / "r.html")])
    out, err = capfd.readouterr()
    assert code == EXIT_BAD_INPUT and message in err and "Traceback" not in out + err, err
    assert not (tmp_path / "r.html").exists()


def test_replay_failures_are_printed(demo_run, demo_dir, tmp_path, capfd):
    """A bundle that cannot be written is named on stderr (and kept in status.extra)."""
    replay = tmp_path / "replay"
    replay.mkdir()
    from onnx_sbs_nb.align.post.replay import safe_child

    # a file where the bundle folder of the selected node goes: the bundle cannot be written
    safe_child(replay, "node_layer_norm").write_text("in the way")
    argv = ["run", "--ep", str(demo_dir / "model.pt2"), "--onnx", str(demo_dir / "model.onnx")]
    argv += ["--inputs", str(demo_dir / "inputs.pt"), "--no-progress", "-o"]
    argv += [str(tmp_path / "r.jsonl"), "--replay-dir", str(replay)]
    code = main([*argv, "--replay-op-types", "LayerNormalization", "Gelu"])
    out, err = capfd.readouterr()
    assert code == EXIT_FAIL
    assert "replay bundle not written: node_layer_norm" in err, err
    assert "replay bundles: 1 written" in out


def test_run_with_a_verdict_and_a_compare_function(passing_files, tmp_path, monkeypatch, capsys):
    """--verdict and --compare-func end to end: the function's fields are CSV columns, its
    "passed" decides; a bad expression is refused before anything runs."""
    (tmp_path / "mycheck.py").write_text(
        "import torch\n"
        "def check(expected, got):\n"
        "    return {'maxdiff': float((expected.double() - got.double()).abs().max())}\n"
        "def strict(expected, got):\n"
        "    return {'passed': bool(torch.equal(expected, got))}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["run", "--ep", str(passing_files.ep), "--onnx", str(passing_files.onnx)]
    args += ["--inputs", str(passing_files.inputs), "--no-progress"]
    out = tmp_path / "r.csv"
    code = main(
        [*args, "-o", str(out), "--verdict", "cos>=0.999", "--compare-func", "mycheck:check"]
    )
    assert code == EXIT_PASS, capsys.readouterr().out
    recs = read_csv(out)
    assert any("maxdiff" in r.extra for r in recs)
    assert all(r.err_cos is None or r.err_cos >= 0.999 for r in recs if r.passed)
    # the same function named by its file; its verdict is exact equality: some nodes fail
    strict = f"{tmp_path / 'mycheck.py'}:strict"
    code = main([*args, "-o", str(tmp_path / "s.csv"), "--compare-func", strict])
    assert code == EXIT_FAIL, capsys.readouterr().out
    differ = [r for r in read_csv(tmp_path / "s.csv") if r.err_abs]
    assert differ and all(r.passed is False and r.failed for r in differ)
    code = main([*args, "-o", str(tmp_path / "b.csv"), "--verdict", "snr>=abc"])
    assert code == EXIT_BAD_INPUT
    assert "snr>=30" in capsys.readouterr().err
    code = main([*args, "--compare-func", "no_such_module_here:fn"])
    assert code == EXIT_BAD_INPUT
