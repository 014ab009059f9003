"""The one run contract (issue 49, item 1): every registered run kind keeps it, declares
the actions that apply, and views never ask which kind they hold."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

import onnx_sbs_nb
from onnx_sbs_nb.align.blame.summary import Summary
from onnx_sbs_nb.align.contract import (
    ALL_ACTIONS,
    EXPORT,
    RERUN,
    SAVE_CULPRIT,
    RecordStream,
    Run,
    as_run,
)
from onnx_sbs_nb.align.kinds import RUN_KINDS, run_kind
from onnx_sbs_nb.notebook.session import ACTIONS, SbsSession
from onnx_sbs_nb.records import Record, RunStatus
from tests.models import mlp_export


@pytest.fixture(scope="module")
def mlp():
    return mlp_export()


@functools.cache
def _decoder():
    """A tiny Llama with a DynamicCache, exported with dynamic dims (generation parity)."""
    from ..corpus.cache_decoders import export_case

    case = export_case("dynamic_cache", "dynamic")
    return case, case.inputs(*case.case.sizes)


def _start(name: str, ep, onx, x) -> Run:
    """A run of each kind from the arguments its users give."""
    start = run_kind(name).start
    if name == "aligned":
        return start(ep, onx, x)
    if name == "many_inputs":
        return start(ep, onx, [x, (x[0] * 2,)])
    if name == "two_models":
        return start(onx, onx, x)
    if name == "two_devices":
        feeds = {onx.graph.input[0].name: x[0]}
        return start(onx, feeds, reference=("onnxruntime", "cpu"), candidate=("torch", "cpu"))
    if name == "bisect":
        return start(ep, onx, x)
    if name == "precision":
        return start(ep, onx, x)
    if name == "quantization":
        return start(onx, [x, (x[0] * 2,)], mode="dynamic")
    if name == "generation":
        from ..corpus.cache_decoders import scaled_cache_output

        case, kwargs = _decoder()
        return start(case.ep, scaled_cache_output(case.onx, 1.01), kwargs, steps=2)
    if name == "records":
        return start([Record(ep_name="a", onnx_name="a", err_abs=0.0)])
    raise AssertionError(f"no test arguments for the run kind {name!r}: add them here")


@pytest.mark.parametrize("kind", [k.name for k in RUN_KINDS])
def test_every_kind_keeps_the_contract(kind, mlp):
    ep, onx, x = mlp
    entry = run_kind(kind)
    run = _start(kind, ep, onx, x)
    assert isinstance(run, Run)
    assert run.KIND == kind and entry.label == run.LABEL and run.LABEL
    assert set(run.APPLIES) <= set(ALL_ACTIONS)
    records = list(run)
    assert all(isinstance(r, Record) for r in records)
    # an optimizer bisection that agrees runs no node; the quantization advice compares
    # whole models' outputs
    assert records or kind in ("bisect", "quantization")
    assert isinstance(run.status, RunStatus)
    assert len(run.records) == len(records)
    run.stop()  # after the end: nothing to do, never raises
    summary = run.summarize()
    assert isinstance(summary, Summary)
    assert summary.verdict in ("pass", "fail", "incomplete", "stopped")
    for action in ALL_ACTIONS:
        why = run.why_not(action)
        if action in run.APPLIES and not (action == "save_node_data" and run.model is None):
            assert why is None, (kind, action, why)
        else:
            assert why and run.LABEL in why or "Model Explorer" in why, (kind, action, why)


@pytest.mark.parametrize("kind", [k.name for k in RUN_KINDS])
def test_a_session_holds_every_kind_with_the_actions_that_apply(kind, mlp):
    ep, onx, x = mlp
    session = SbsSession.from_run(_start(kind, ep, onx, x))
    session.start()
    assert session.finished and session.error is None, session.error
    table = {a["name"]: a for a in session.action_states()}
    assert set(table) == set(ACTIONS)
    for name, row in table.items():
        assert row["applies"] == (session.run.why_not(name) is None)
        if not row["applies"]:
            assert row["why_not"]
            # the button's answer is the same reason, not an error from deep inside
            done = session.act(name, session.records[0] if session.records else None)
            assert not done.ok and done.message == row["why_not"]
    program = kind in ("aligned", "many_inputs")
    assert table[RERUN]["applies"] == program
    assert table[SAVE_CULPRIT]["applies"] == program
    assert table[EXPORT]["applies"]


def test_public_functions_return_streams_that_keep_the_contract(mlp):
    from onnx_sbs_nb.align.devices import run_onnx_on_two_devices
    from onnx_sbs_nb.align.run import run_aligned
    from onnx_sbs_nb.align.two_models import run_aligned_onnx

    ep, onx, x = mlp
    feeds = {onx.graph.input[0].name: x[0]}
    streams = [
        run_aligned(ep, onx, x),
        run_aligned_onnx(onx, onx, x),
        run_onnx_on_two_devices(onx, feeds, candidate=("torch", "cpu")),
    ]
    for stream in streams:
        assert isinstance(stream, RecordStream) and isinstance(stream, Run)
        first = next(stream)  # an iterator, as before
        assert isinstance(first, Record) and stream.started
        rest = list(stream)
        assert len(stream.records) == 1 + len(rest)
        assert as_run(stream) is stream
    assert streams[0].why_not(RERUN) is None
    assert "two ONNX models" in streams[1].why_not(RERUN)


def test_records_alone_are_a_run_whose_status_is_derived():
    recs = [
        Record(ep_name="a", onnx_name="a", err_abs=0.5, status="fail"),
        Record(ep_name="b", onnx_name="b", err_abs=0.1),
    ]
    run = as_run(iter(recs))
    assert list(run) == recs
    assert run.status.records == 2 and run.status.failures == 1
    assert run.status.max_err_name == "a" and run.status.finished


def test_a_stopped_records_run_says_so():
    def endless():
        i = 0
        while True:
            yield Record(ep_name=f"n{i}", onnx_name=f"n{i}", err_abs=0.0)
            i += 1

    run = as_run(endless())
    for k, _ in enumerate(run):
        if k == 3:
            run.stop()
    assert run.status.stopped and len(run.records) == 4  # the record in hand is the last


# -- views never ask which kind of run they hold ---------------------------------------

MAX_RUN_PROBES = 3
_RUN_NAMES = {"run", "given"}  # the names a view gives a run it holds


def _is_run(node: ast.expr) -> bool:
    """``run``, ``self.run``, ``session.run``, ``self._run``: a run object."""
    if isinstance(node, ast.Name):
        return node.id in _RUN_NAMES
    if isinstance(node, ast.Attribute):
        return node.attr in ("run", "_run")
    return False


def run_probes(root: Path) -> list[str]:
    """Every ``getattr(run, ...)`` / ``hasattr(run, ...)`` in the views."""
    found = []
    for folder in ("notebook", "cli", "reports"):
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr")
                    and node.args
                    and _is_run(node.args[0])
                ):
                    found.append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_views_do_not_ask_which_kind_of_run_they_hold():
    probes = run_probes(Path(onnx_sbs_nb.__file__).parent)
    assert len(probes) <= MAX_RUN_PROBES, (
        f"{len(probes)} getattr/hasattr probes on a run in the views (at most "
        f"{MAX_RUN_PROBES}): declare what the view needs in align/contract.py instead: "
        + ", ".join(probes)
    )


def test_the_probe_scan_finds_probes(tmp_path):
    (tmp_path / "cli").mkdir()
    (tmp_path / "cli" / "x.py").write_text(
        "def f(run, self):\n"
        "    getattr(run, 'model', None)\n"
        "    hasattr(self.run, 'stop')\n"
        "    getattr(self, 'x')\n"
    )
    assert run_probes(tmp_path) == ["cli/x.py:2", "cli/x.py:3"]


def test_the_registry_names_each_kind_once():
    names = [k.name for k in RUN_KINDS]
    assert len(names) == len(set(names))
    with pytest.raises(KeyError, match="no run kind"):
        run_kind("nope")


def test_many_inputs_declare_their_inputs(mlp):
    ep, onx, x = mlp
    run = _start("many_inputs", ep, onx, x)
    list(run)
    info = run.inputs_info()
    assert info["total"] == 2 and info["done"] == 2
    assert _start("records", ep, onx, x).inputs_info() is None


@pytest.mark.parametrize("kind", ["two_models", "two_devices", "bisect", "precision"])
def test_the_widget_shows_every_kind_with_the_actions_that_apply(kind, mlp):
    from onnx_sbs_nb.notebook.widget import SbsWidget

    ep, onx, x = mlp
    w = SbsWidget(session=SbsSession.from_run(_start(kind, ep, onx, x)))
    w.wait()
    assert w.run_kind["name"] == kind and w.run_kind["label"] == run_kind(kind).label
    # the buttons that do not apply are hidden; the session says why
    assert RERUN not in {a["name"] for a in w.actions}
    assert {a["name"] for a in w.actions} == set(run_kind(kind).applies) & {
        a["name"] for a in w.session.action_states()
    }
    rerun = {a["name"]: a for a in w.session.action_states()}[RERUN]
    assert not rerun["applies"] and run_kind(kind).label in rerun["why_not"]
    assert "AlignedRun" not in rerun["why_not"]
    answer = w.act(RERUN, row=0)
    assert answer["state"] == "error" and answer["message"] == rerun["why_not"]
    if kind in ("bisect", "precision"):
        assert w.run_kind["answer"]  # the one sentence a view shows for an answer
    assert w.status["state"] == "finished"
