"""SbsWidget without a browser: traits, streamed messages, actions driven through the
message handler (as the buttons send them), static state and fallback."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from onnx_sbs_nb import view_state
from onnx_sbs_nb.records import RECORD_FIELDS, Record
from onnx_sbs_nb.session import SbsSession
from onnx_sbs_nb.view_state import STATE_TRAITS, bundle_js, record_row, widget_state
from onnx_sbs_nb.widget import SbsWidget
from tests.test_session import _broken_mlp

# CI must build the bundle: there a missing one fails loudly instead of skipping
pytestmark = pytest.mark.skipif(
    not view_state.BUNDLE_PATH.is_file() and not os.environ.get("CI"),
    reason="widget bundle not built (cd js && npm run build)",
)


@pytest.fixture(scope="module")
def model():
    return _broken_mlp()


class Browser:
    """Records what the kernel sends, and rebuilds the rows as the JS RowStore does."""

    def __init__(self, w: SbsWidget):
        self.messages: list[dict] = []
        self.rows: list[list] = []
        self.gaps = 0
        self.lock = threading.Lock()
        w.send = self.receive  # the widget's custom-message channel

    def receive(self, content, buffers=None):
        with self.lock:
            self.messages.append(content)
            if content.get("type") != "rows":
                return
            start = content["start"]
            if start > len(self.rows):
                self.gaps += 1
                return
            self.rows.extend(content["rows"][len(self.rows) - start :])


def test_rows_stream_then_full_sync(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, own_error=True, batch_interval=0)
    b = Browser(w)
    assert w.session.state == "idle" and w.rows == []
    recs = w.records  # runs it here (never displayed)
    assert w.session.state == "finished"
    expected = [record_row(r) for r in recs]
    assert b.rows == expected and b.gaps == 0  # every row streamed once, in order
    assert w.rows == expected  # and synced in full at the end (the saved state)
    assert w.columns == list(RECORD_FIELDS)
    assert w.status["state"] == "finished" and w.status["rows"] == len(recs)
    assert w.summary["first_own_failure"]["onnx_op_type"] == "Gemm"
    # a late view asks for what it has not seen
    b.rows = b.rows[:3]
    assert w.handle_message({"type": "hello", "have": 3}) is None
    assert b.rows == expected


def test_batches_are_rate_limited(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, batch_interval=0.25)
    b = Browser(w)
    t0 = time.perf_counter()
    w.wait()
    elapsed = time.perf_counter() - t0
    n_msgs = sum(1 for m in b.messages if m.get("type") == "rows")
    assert 1 <= n_msgs <= elapsed / 0.25 + 2
    assert b.rows == w.rows


def test_background_run_streams_consistently(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, background=True, batch_interval=0)
    b = Browser(w)
    # hello messages racing the run thread must never leave a gap or a duplicate
    while not w.session.finished:
        w.handle_message({"type": "hello", "have": len(b.rows)})
    w.wait()
    w.handle_message({"type": "hello", "have": len(b.rows)})
    assert b.rows == w.rows == [record_row(r) for r in w.session.records]


def test_selection_loads_details_and_actions_report_state(model, tmp_path):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, own_error=True, replay_root=tmp_path)
    w.wait()
    recs = w.session.records
    row = next(i for i, r in enumerate(recs) if r.passed2 is False)
    w.selected = row
    w.wait_actions(60)
    assert w.details["row"] == row
    assert w.details["node"]["op_type"] == "Gemm" and w.details["node"]["inputs"]

    fut = w.handle_message({"type": "action", "name": "rerun", "row": row, "seq": "s1"})
    assert w.action["state"] in ("working", "done")
    fut.result(60)
    assert w.action == {
        "name": "rerun",
        "state": "done",
        "message": w.action["message"],
        "seq": "s1",
    }
    assert "vs torch" in w.action["message"]
    assert w.details["rerun"]["outputs"] and w.details["node"]  # both kept

    w.handle_message({"type": "action", "name": "save_replay", "row": row, "seq": "s2"}).result(60)
    assert w.action["state"] == "done", w.action
    replay = w.details["replay"]
    assert replay["bundle"] in w.action["message"] and replay["config"] in w.action["message"]
    assert (tmp_path / replay["bundle"]).is_dir()

    # the details of a row come back when it is selected again (saved notebooks keep them)
    w.selected = 0
    w.wait_actions(60)
    w.selected = row
    assert w.details["rerun"] and w.details["replay"]


def test_errors_are_shown_not_raised(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x)
    w.wait()
    assert w.handle_message({"type": "action", "name": "rerun", "row": -1, "seq": 1}) is None
    assert w.action["state"] == "error" and "select a row" in w.action["message"]
    assert w.handle_message({"type": "action", "name": "rerun", "row": 0, "seq": 2}) is None
    assert w.action["state"] == "error" and "not the output of an ONNX node" in w.action["message"]
    w.handle_message({"type": "action", "name": "explode", "seq": 3})
    assert w.action["state"] == "error" and "unknown action" in w.action["message"]
    w.handle_message({"type": "action", "name": "device", "device": "cuda", "seq": 4})
    if torch.cuda.is_available():
        assert w.action["state"] == "done" and w.device == "cuda"
    else:
        assert w.action["state"] == "error" and "CUDA" in w.action["message"]
        assert w.device == "cpu" and not w.cuda_available and w.cuda_reason
    w.handle_message({"type": "action", "name": "stop", "seq": 5})  # harmless after the end
    assert w.action["state"] == "done"
    for junk in (None, 3, {"type": "nope"}, {"type": "hello", "have": "x"}):
        w.handle_message(junk)


def test_stop_button_mid_run_keeps_rows(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, batch_interval=0)
    b = Browser(w)
    w.session.add_listener(
        lambda ev, p: (
            w.handle_message({"type": "action", "name": "stop", "seq": 1})
            if ev == "rows" and len(b.rows) >= 8
            else None
        )
    )
    w.wait()
    assert w.session.state == "stopped" and w.status["state"] == "stopped"
    assert len(w.rows) >= 8 and w.rows == b.rows
    assert len(w.rows) < len(onx.graph.node) + len(onx.graph.initializer) + 1


def test_engine_failure_shown_in_status():
    def broken():
        yield Record(ep_name="a", onnx_name="a", err_abs=0.5, status="fail")
        raise RuntimeError("engine exploded")

    w = SbsWidget(session=SbsSession.from_run(broken()))
    w.wait()
    assert w.status["state"] == "error" and "engine exploded" in w.status["error"]
    assert len(w.rows) == 1


def test_static_state_fallback_and_python_api():
    hostile = "<img src=x onerror=alert(1)>"
    recs = [
        Record(
            ep_name=f"{hostile}{i}",
            onnx_name=f"n{i}",
            onnx_op_type="Add",
            onnx_id_node=i,
            err_abs=float(i) / 10,
            atol=1e-4,
            status="fail" if i > 2 else "ok",
            step=i,
        )
        for i in range(5)
    ] + [Record(ep_name="nan", onnx_name="nanv", err_abs=float("nan"), step=5, status="fail")]
    w = SbsWidget(records=recs)
    w.wait()
    state = w.state()
    assert tuple(state) == STATE_TRAITS
    assert state["rows"][5][RECORD_FIELDS.index("err_abs")] == "nan"
    static = widget_state(recs)
    assert set(static) == set(STATE_TRAITS)
    assert static["rows"] == state["rows"] and static["columns"] == state["columns"]
    data, _meta = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    html = data["text/html"]
    assert hostile not in html and "&lt;img src=x" in html
    assert "<svg" in html  # the tiny static chart
    text = repr(w)
    assert text.startswith("SbsWidget(finished: 6 records, 3 failing, worst err_abs 0.4 at 'n4'")
    df = w.to_frame()
    assert list(df.columns) == list(RECORD_FIELDS) and len(df) == 6
    fig = w.figure()
    assert [t.name for t in fig.data][:2] == ["error vs torch", "own error"]
    assert fig.layout.yaxis.type == "log"


def test_bundle_missing_is_a_clear_error(monkeypatch, tmp_path):
    assert "renderStatic" in bundle_js() and "export" in bundle_js()
    monkeypatch.setattr(view_state, "BUNDLE_PATH", tmp_path / "widget.js")
    with pytest.raises(FileNotFoundError, match="npm run build"):
        bundle_js()


def test_needs_something_to_show():
    with pytest.raises(TypeError, match="needs ep and onx"):
        SbsWidget()


def test_full_rows_sync_message(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x)
    updates = []
    original = w._send
    w._send = lambda msg, buffers=None: (updates.append(msg), original(msg, buffers))
    w.wait()
    rows_updates = [m for m in updates if m.get("method") == "update" and "rows" in m["state"]]
    assert len(rows_updates) == 1  # the whole list once, at the end
    assert rows_updates[0]["state"]["rows"] == [record_row(r) for r in w.session.records]
    assert rows_updates[0]["buffer_paths"] == []


NOTEBOOK_CELLS = [
    "import sys\nsys.path.insert(0, {repo!r})\nfrom tests.test_session import _broken_mlp\n"
    "ep, onx, x = _broken_mlp()",
    "from onnx_sbs_nb import SbsWidget\nw = SbsWidget(ep, onx, x, own_error=True)\nw",
]


@pytest.mark.slow
def test_executed_notebook_keeps_every_row(tmp_path):
    """nbclient (like papermill and nbconvert --execute) stores the finished run."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[1])
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(c.format(repo=repo)) for c in NOTEBOOK_CELLS]
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    ours = [s["state"] for s in states.values() if "rows" in s["state"]]
    assert len(ours) == 1
    state = ours[0]
    assert set(STATE_TRAITS) <= set(state)
    assert state["status"]["state"] == "finished"
    assert len(state["rows"]) == state["status"]["rows"] > 10
    assert state["summary"]["first_own_failure"]["onnx_op_type"] == "Gemm"
    out = nb.cells[1].outputs[-1]
    assert "application/vnd.jupyter.widget-view+json" in out["data"]
    # the static fallback was refreshed when the run ended
    assert f"{len(state['rows'])} records" in out["data"]["text/html"]


def test_build_hook_keeps_a_fresh_bundle(tmp_path, monkeypatch):
    """hatch_build.build_bundle: nothing to do when the bundle is newer than its sources,
    and a clear error when npm is missing and a build is needed."""
    import os
    import shutil
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(repo))
    try:
        import hatch_build
    finally:
        sys.path.remove(str(repo))
    root = tmp_path / "src"
    shutil.copytree(repo / "js", root / "js", ignore=shutil.ignore_patterns("node_modules"))
    out = root / "onnx_sbs_nb" / "static" / "widget.js"
    out.parent.mkdir(parents=True)
    out.write_text("// built")
    newest = hatch_build._newest_source(root / "js")
    os.utime(out, (newest + 10, newest + 10))
    monkeypatch.setattr(hatch_build.shutil, "which", lambda name: None)
    assert hatch_build.build_bundle(root) == out  # fresh: npm not even looked for
    (root / "js" / "src" / "index.js").touch()
    os.utime(out, (newest - 10, newest - 10))
    with pytest.raises(RuntimeError, match="needs node >= 18 and npm"):
        hatch_build.build_bundle(root)


def test_reports_do_not_import_the_widget():
    """view_state is the one module both use: reports never pull in the widget."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import onnx_sbs_nb.report_html, onnx_sbs_nb.notebook_export, onnx_sbs_nb.view_state\n"
        "print(','.join(sorted(m for m in sys.modules if m == 'onnx_sbs_nb.widget'\n"
        "                      or m.split('.')[0] in ('anywidget', 'ipywidgets'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout


def test_a_plain_install_has_the_widget():
    """The widget's packages are dependencies; only xlsx and the test tools are extras."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    deps = {re.split(r"[<>=\[ ;]", d)[0].lower() for d in project["dependencies"]}
    assert {"ipywidgets", "anywidget", "pandas", "plotly", "tqdm"} <= deps
    assert "openpyxl" not in deps and "playwright" not in deps
    assert project["optional-dependencies"]["report"] == ["openpyxl>=3.1"]
