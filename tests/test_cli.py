"""`onnx-sbs` end to end: real export, real onnxruntime, real files, exit codes."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from onnx_sbs_nb.cli import EXIT_BAD_INPUT, EXIT_FAIL, EXIT_PASS, main
from onnx_sbs_nb.records import RECORD_FIELDS
from onnx_sbs_nb.report import read_csv, read_jsonl, read_xlsx

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    from onnx_sbs_nb.demo import write_demo

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


def test_xlsx_columns_are_onnx_diagnostic_names(demo_run, demo_dir):
    import openpyxl

    sheet = openpyxl.load_workbook(demo_dir / "report.xlsx")["sbs"]
    header = [c.value for c in sheet[1]]
    assert header == list(RECORD_FIELDS)
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


def test_killed_run_keeps_its_records(demo_run, demo_dir, tmp_path):
    """A process killed in the middle of a run leaves a .jsonl that `report` turns into reports."""
    script = textwrap.dedent(
        f"""
        import os, pathlib
        from onnx_sbs_nb.align.runners import OnnxruntimeRunner
        from onnx_sbs_nb.cli import run_and_report

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
    assert main(["report", str(jsonl), "-o", str(tmp_path / "killed.html")]) in (
        EXIT_PASS,
        EXIT_FAIL,
    )
    assert (tmp_path / "killed.html").is_file()


def test_interrupted_run_writes_reports(demo_run, demo_dir, tmp_path, capsys):
    """Ctrl-C in the middle of a run: the reports hold what was computed, exit code 130."""
    from onnx_sbs_nb.align.runners import OnnxruntimeRunner
    from onnx_sbs_nb.cli import EXIT_INTERRUPTED, run_and_report

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
    assert "interrupted" in capsys.readouterr().out


def test_python_dash_m(tmp_path):
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(
        [sys.executable, "-m", "onnx_sbs_nb", "run", "--help"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "--replay-threshold" in proc.stdout
