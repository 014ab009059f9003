"""SbsWidget without a browser: traits, streamed column batches, the graph, actions driven
through the message handler (as the buttons send them), display, export, static state
and fallback."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

from onnx_sbs_nb.notebook.session import SbsSession
from onnx_sbs_nb.notebook.widget import SbsWidget
from onnx_sbs_nb.records import RECORD_FIELDS, Record, field_label
from onnx_sbs_nb.reports import view_state
from onnx_sbs_nb.reports.view_state import (
    STATE_TRAITS,
    bundle_js,
    culprit_of,
    decode_rows,
    encode_rows,
    graph_state,
    record_row,
    widget_state,
)
from tests.notebook.test_session import _broken_mlp

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
            self.rows.extend(decode_rows(content["rows"])[len(self.rows) - start :])


def test_rows_stream_then_full_sync(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, own_error=True, batch_interval=0)
    b = Browser(w)
    assert w.session.state == "idle" and w.rows == {}
    recs = w.records  # runs it here (never displayed)
    assert w.session.state == "finished"
    expected = [record_row(r) for r in recs]
    assert b.rows == expected and b.gaps == 0  # every row streamed once, in order
    assert decode_rows(w.rows) == expected  # and synced in full at the end (the saved state)
    assert w.columns == list(RECORD_FIELDS)
    assert w.status["state"] == "finished" and w.status["rows"] == len(recs)
    assert culprit_of(w.summary)["onnx_op_type"] == "Gemm"
    # one Summary type: the widget's is summarize()'s, prints as text, reads as its dict
    from onnx_sbs_nb import Summary, summarize

    assert type(w.summary) is type(summarize(recs)) is Summary
    assert type(w.session.summary) is Summary
    assert str(w.summary) == repr(w.summary) == w.summary.to_text()
    assert repr(w.summary).startswith("verdict: FAIL")
    assert w.summary["verdict"] == w.summary.verdict == "fail"
    assert w.summary["culprit"]["onnx_op_type"] == w.summary.culprit.onnx_op_type == "Gemm"
    assert "culprit" in w.summary and w.summary.get("nope", 1) == 1
    # the front end and a saved notebook get its JSON dict
    synced = w.get_state()["summary"]
    assert isinstance(synced, dict) and synced["verdict"] == "fail"
    assert w.state()["summary"] == synced
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
    assert b.rows == decode_rows(w.rows)


def test_background_run_streams_consistently(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, background=True, batch_interval=0)
    b = Browser(w)
    # hello messages racing the run thread must never leave a gap or a duplicate
    while not w.session.finished:
        w.handle_message({"type": "hello", "have": len(b.rows)})
    w.wait()
    w.handle_message({"type": "hello", "have": len(b.rows)})
    assert b.rows == decode_rows(w.rows) == [record_row(r) for r in w.session.records]


def invoke(w: SbsWidget, name: str, **msg) -> dict:
    """What the browser's ``experimental.invoke(model, "action", {name, ...})`` gets back:
    the request goes through anywidget's command dispatch as the comm delivers it."""
    sent: list = []
    w.send = lambda content, buffers=None: sent.append(content)  # the comm to the browser
    try:
        request = {"name": name, **msg}
        w._handle_custom_msg(
            {"id": "req-1", "kind": "anywidget-command", "name": "action", "msg": request}, []
        )
    finally:
        del w.send
    (answer,) = [m for m in sent if m.get("id") == "req-1"]
    assert answer["kind"] == "anywidget-command-response"
    return answer["response"]


def test_selection_loads_details_and_actions_answer(model, tmp_path):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, own_error=True, replay_root=tmp_path)
    w.wait()
    assert "action" in type(w)._anywidget_commands  # an anywidget command, not a trait
    assert "action" not in w.keys
    recs = w.session.records
    row = next(i for i, r in enumerate(recs) if r.passed2 is False)
    w.selected = row
    assert w.details["row"] == row
    assert w.details["node"]["op_type"] == "Gemm" and w.details["node"]["inputs"]

    answer = invoke(w, "rerun", row=row)
    assert answer == {"name": "rerun", "state": "done", "message": answer["message"]}
    # the rerun's own error, next to the table's own error of that row, in the same words
    assert "own err" in answer["message"] and "(table: " in answer["message"]
    assert answer["message"].startswith("reran on cpu")
    assert w.details["rerun"]["outputs"] and w.details["node"]  # both kept

    answer = invoke(w, "save_replay", row=row)
    assert answer["state"] == "done", answer
    replay = w.details["replay"]
    assert replay["bundle"] in answer["message"] and replay["config"] in answer["message"]
    assert (tmp_path / replay["bundle"]).is_dir()

    # the details of a row come back when it is selected again (saved notebooks keep them)
    w.selected = 0
    w.selected = row
    assert w.details["rerun"] and w.details["replay"]


def test_the_session_owns_the_action_table(model, tmp_path):
    """The session runs every action by name (the widget only passes the row): its
    answers are the ones the widget sends."""
    from onnx_sbs_nb.notebook.session import ACTIONS

    ep, onx, x = model
    s = SbsSession(ep, onx, x, own_error=True, replay_root=tmp_path).start()
    assert set(ACTIONS) == {"stop", "device", "rerun", "save_replay", "save_culprit", "export"}
    rec = next(r for r in s.records if r.passed2 is False)
    done = s.act("rerun", rec)
    assert done.ok and done.result["outputs"] and "own err" in done.message
    assert not s.act("rerun").ok and "select a row" in s.act("rerun").message
    done = s.act("export", folder=tmp_path / "out")
    assert done.ok and Path(done.result).is_file()
    assert not s.act("explode").ok


def test_the_front_end_gets_the_session_action_table(model):
    """The buttons the view shows are the session's table, synced as the ``actions``
    trait (and kept in a saved notebook's state); a report, with no kernel to ask, gets
    none.  The front end builds its buttons from it: it names none of them itself."""
    from onnx_sbs_nb.notebook.session import ACTIONS, action_table

    ep, onx, x = model
    w = SbsWidget(ep, onx, x)
    table = w.actions
    assert w.trait_metadata("actions", "sync") and "actions" in STATE_TRAITS
    assert [a["name"] for a in table] == list(ACTIONS) and table == action_table()
    for a in table:
        spec = ACTIONS[a["name"]]
        assert (a["label"], a["needs_node"], a["button"]) == (
            spec.label,
            spec.needs_node,
            spec.button,
        )
        assert a["label"] and a["button"] and "method" not in a  # the kernel's business
    assert {a["name"] for a in table if a["needs_node"]} == {"rerun", "save_replay"}
    assert w.state()["actions"] == table
    assert widget_state([Record(ep_name="a", onnx_name="a", step=0)])["actions"] == []
    # the front end hard-codes no button: every button class comes from the table
    src = "\n".join(p.read_text() for p in view_state.BUNDLE_PATH.parents[2].glob("js/src/*.js"))
    assert "sbs-btn-${" in src
    for a in table:
        assert f"sbs-btn-{a['button']}" not in src, a


def test_act_dispatches_every_action_of_the_table(model, tmp_path):
    """widget.act looks each name up in the table and runs it; its result lands where the
    entry says (``shows``); a name not in the table is an error answer naming the known
    ones, never an exception."""
    from onnx_sbs_nb.notebook.session import ACTIONS

    ep, onx, x = model
    w = SbsWidget(ep, onx, x, own_error=True, replay_root=tmp_path, export_dir=tmp_path)
    w.wait()
    row = next(i for i, r in enumerate(w.session.records) if r.passed2 is False)
    w.selected = row
    for name, spec in ACTIONS.items():
        answer = invoke(w, name, row=row, device="cpu")
        assert answer["name"] == name and answer["message"], answer
        assert set(answer) == {"name", "state", "message"}
        if name == "stop":  # the run has ended: stopping it is a no-op, said so
            assert answer["state"] == "done"
            continue
        assert answer["state"] == "done", answer
        if spec.shows.startswith("details."):
            assert w.details[spec.shows.split(".", 1)[1]], name
        elif spec.shows:
            assert getattr(w, spec.shows) == "cpu"
    assert list(tmp_path.glob("onnx-sbs-report-*.html"))  # export wrote where it was told
    answer = invoke(w, "explode", row=row)
    assert answer["state"] == "error" and answer["name"] == "explode"
    assert answer["message"].startswith("unknown action 'explode'")
    assert all(name in answer["message"] for name in ACTIONS)
    answer = w.act(None)  # not even a name
    assert answer["state"] == "error" and "unknown action None" in answer["message"]


def test_errors_are_shown_not_raised(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x)
    w.wait()
    answer = invoke(w, "rerun", row=-1)
    assert answer["state"] == "error" and "select a row" in answer["message"]
    answer = invoke(w, "rerun", row=0)
    assert answer["state"] == "error" and "not the output of an ONNX node" in answer["message"]
    answer = invoke(w, "explode")
    assert answer["state"] == "error" and "unknown action" in answer["message"]
    answer = invoke(w, "device", device="cuda")
    if torch.cuda.is_available():
        assert answer["state"] == "done" and w.device == "cuda"
    else:
        assert answer["state"] == "error" and "CUDA" in answer["message"]
        assert w.device == "cpu" and not w.cuda_available and w.cuda_reason
    assert invoke(w, "stop")["state"] == "done"  # harmless after the end
    assert invoke(w, "rerun", row="x")["state"] == "error"
    for junk in (None, 3, {"type": "nope"}, {"type": "hello", "have": "x"}):
        w.handle_message(junk)


def test_stop_button_mid_run_keeps_rows(model):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, batch_interval=0)
    b = Browser(w)
    w.session.add_listener(
        lambda ev, p: w.act("stop") if ev == "rows" and len(b.rows) >= 8 else None
    )
    w.wait()
    assert w.session.state == "stopped" and w.status["state"] == "stopped"
    rows = decode_rows(w.rows)
    assert len(rows) >= 8 and rows == b.rows
    assert len(rows) < len(onx.graph.node) + len(onx.graph.initializer) + 1


def test_engine_failure_shown_in_status():
    def broken():
        yield Record(ep_name="a", onnx_name="a", err_abs=0.5, status="fail")
        raise RuntimeError("engine exploded")

    w = SbsWidget(session=SbsSession.from_run(broken()))
    w.wait()
    assert w.status["state"] == "error" and "engine exploded" in w.status["error"]
    assert w.rows["n"] == 1


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
    assert decode_rows(state["rows"])[5][RECORD_FIELDS.index("err_abs")] == "nan"
    assert state["graph"] == {}  # records only: no model, no graph
    static = widget_state(recs)
    assert set(static) == set(STATE_TRAITS)
    assert static["rows"] == state["rows"] and static["columns"] == state["columns"]
    data, _meta = w._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in data
    html = data["text/html"]
    assert hostile not in html and "&lt;img src=x" in html
    assert '<img src="data:image/png;base64,' in html and "<svg" not in html  # the chart
    text = repr(w)
    assert text.startswith("SbsWidget(finished: 6 records, 3 failing, worst err_abs 0.4 at 'n4'")
    df = w.to_frame()
    assert list(df.columns) == list(RECORD_FIELDS) and len(df) == 6
    fig = w.figure()
    # named as the schema labels the fields, as every view does
    assert [t.name for t in fig.data][::2][:2] == [field_label("err_abs"), field_label("err_abs2")]
    assert fig.layout.yaxis.type == "log"
    # the exact zero (record 0) is on the strip labelled 0, not at a floor on the log axis
    err, zeros = fig.data[0], fig.data[1]
    assert 0 not in err.x and list(zeros.x) == [0] and zeros.yaxis == "y2"
    assert list(fig.layout.yaxis2.ticktext) == ["0"]
    assert all(y is None or y > 0 for y in err.y)


def test_rows_travel_as_compact_columns():
    """Repeated values as a dictionary, a constant as one value, every value back as it
    was (NaN and infinities as strings, booleans, None); half the size of per-row JSON."""
    import json
    import math

    ops = ["MatMul", "Add", "Softmax"]
    recs = [
        Record(
            step=i,
            onnx_id_node=i,
            ep_name=f"fx_{i}",
            onnx_name=f"v_{i}",
            onnx_op_type=ops[i % 3],
            ep_shape_type="float32[2x64]",
            err_abs=[0.0, math.nan, math.inf, 1e-7 * i][i % 4],
            passed=[True, False, None][i % 3],
            atol=1e-4,
            ep_time_run=1.23456789e-5 * (i + 1),
            status="ok",
        )
        for i in range(400)
    ]
    enc = encode_rows(recs)
    assert enc["n"] == 400 and len(enc["data"]) == len(RECORD_FIELDS)
    col = dict(zip(RECORD_FIELDS, enc["data"]))
    assert col["onnx_op_type"]["d"] == ops and len(col["onnx_op_type"]["k"]) == 400
    assert col["atol"] == {"c": 1e-4} and col["status"] == {"c": "ok"}
    assert isinstance(col["onnx_name"], list)  # unique values stay a plain list
    rows = decode_rows(json.loads(json.dumps(enc, allow_nan=False)))
    expected = [record_row(r) for r in recs]
    assert rows == expected
    t = RECORD_FIELDS.index("ep_time_run")
    assert [r[t] for r in rows] == pytest.approx([r.ep_time_run for r in recs], rel=1e-3)
    assert rows[1][RECORD_FIELDS.index("err_abs")] == "nan"
    assert rows[2][RECORD_FIELDS.index("err_abs")] == "inf"
    assert decode_rows(expected) == expected  # a saved state of the first releases
    big = [Record(step=i, ep_name=f"fx_{i}", onnx_name=f"v_{i}", onnx_op_type=ops[i % 3],
                  err_abs=1e-7 * (i % 13), atol=1e-4, rtol=1e-4, paired_by="name",
                  kind="node", ep_shape_type="float32[2x64]", onnx_shape_type="float32[2x64]")
           for i in range(20_000)]  # fmt: skip
    columnar = len(json.dumps(encode_rows(big)))
    per_row = len(json.dumps([record_row(r) for r in big]))
    assert columnar < per_row / 2, (columnar, per_row)


def test_graph_state_is_the_model_adjacency(model):
    ep, onx, x = model
    g = graph_state(onx)
    values = g["values"]
    ops = view_state.decode_column(g["op"], len(values))
    parents, flat, k = {}, g["parents"], 0
    for v in range(len(values)):
        n = flat[k]
        parents[values[v]] = [values[j] for j in flat[k + 1 : k + 1 + n]]
        k += 1 + n
    assert k == len(flat)
    for node in onx.graph.node:
        for out in node.output:
            assert parents[out] == [i for i in node.input if i]
            assert ops[values.index(out)] == node.op_type
    for init in onx.graph.initializer:
        assert parents[init.name] == [] and ops[values.index(init.name)] == "initializer"
    w = SbsWidget(ep, onx, x)
    assert w.graph == g  # the widget syncs it (a saved notebook draws it offline)
    assert graph_state(None) == {} and graph_state(object()) == {}


def test_rows_that_are_not_onnx_nodes_get_no_error(model):
    """A weight's detail says what it is; no red "node detail failed" for it."""
    ep, onx, x = model
    w = SbsWidget(ep, onx, x)
    w.wait()
    row = next(i for i, r in enumerate(w.session.records) if r.kind == "weight")
    w.selected = row
    assert w.details == {"row": row, "node": None, "node_error": None}


def test_export_and_save_html_write_the_offline_report(model, tmp_path):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x, own_error=True, export_dir=tmp_path / "out")
    path = w.save_html(tmp_path / "report.html")  # runs it first
    text = path.read_text(encoding="utf-8")
    assert w.session.state == "finished"
    assert "renderStatic" in text and 'name="color-scheme" content="light dark"' in text
    assert "prefers-color-scheme: dark" in text
    assert '"values":' in text  # the graph came along: the neighbourhood works offline
    answer = invoke(w, "export")
    assert answer["state"] == "done", answer
    written = list((tmp_path / "out").glob("onnx-sbs-report-*.html"))
    assert len(written) == 1 and str(written[0].resolve()) in answer["message"]
    assert "renderStatic" in written[0].read_text(encoding="utf-8")


def test_display_in_a_notebook_makes_the_view_and_its_static_summary(model, monkeypatch):
    """The view, then a static summary marked for it (hidden by the view, shown by
    viewers that cannot run widgets, and saying how to get the interactive view)."""
    import IPython.display

    from onnx_sbs_nb.notebook import widget as widget_mod

    ep, onx, x = model
    shown, handles = [], []

    class Handle:  # IPython's DisplayHandle.update passes everything on to display()
        def update(self, obj, **kwargs):
            shown.append(("update", obj, kwargs.get("metadata")))
            assert set(kwargs) <= {"raw", "metadata"}

    def display(obj, raw=False, metadata=None, display_id=None):
        shown.append(("display", obj, metadata))
        if display_id:
            handles.append(Handle())
            return handles[-1]
        return None

    monkeypatch.setattr(IPython.display, "display", display)
    monkeypatch.setattr(widget_mod, "_in_kernel", lambda: True)
    w = SbsWidget(ep, onx, x, own_error=True)
    w._ipython_display_()
    assert w.session.state == "finished"  # ran in the cell
    (_, view, _), (_, before, meta), (_, after, meta2) = shown
    assert "application/vnd.jupyter.widget-view+json" in view and "text/html" not in view
    assert meta == meta2 == {"onnx_sbs": {"fallback_for": w.uid}}
    assert f"sbs-for-{w.uid}" in before["text/html"]
    html = after["text/html"]  # refreshed when the run ended
    assert "Save Widget State Automatically" in html and "save_html" in html
    assert "culprit" in html and "verdict: FAIL" in html
    assert "verdict: FAIL" in after["text/plain"]


def test_terminal_display_prints_the_summary_once(model, capsys):
    ep, onx, x = model
    w = SbsWidget(ep, onx, x)
    w._ipython_display_()  # no kernel here: terminal behaviour
    out = capsys.readouterr().out
    assert out.count("SbsWidget(") == 1 and "SbsWidget(finished" in out


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
    assert rows_updates[0]["state"]["rows"] == encode_rows(w.session.records)
    assert rows_updates[0]["buffer_paths"] == []


NOTEBOOK_CELLS = [
    "import sys\nsys.path.insert(0, {repo!r})\nfrom tests.notebook.test_session import _broken_mlp\n"
    "ep, onx, x = _broken_mlp()",
    "from onnx_sbs_nb import SbsWidget\nw = SbsWidget(ep, onx, x, own_error=True)\nw",
]


@pytest.mark.slow
def test_executed_notebook_keeps_every_row(tmp_path):
    """nbclient (like papermill and nbconvert --execute) stores the finished run."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    from pathlib import Path

    repo = str(Path(__file__).resolve().parents[2])
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
    assert state["rows"]["n"] == state["status"]["rows"] > 10
    assert len(decode_rows(state["rows"])) == state["rows"]["n"]
    assert culprit_of(state["summary"])["onnx_op_type"] == "Gemm"
    assert state["graph"]["values"]  # the neighbourhood view has its graph offline
    view, summary = nb.cells[1].outputs[-2:]
    assert "application/vnd.jupyter.widget-view+json" in view["data"]
    # the static summary next to it was refreshed when the run ended
    assert summary["metadata"]["onnx_sbs"]["fallback_for"] == state["uid"]
    assert f"{state['rows']['n']} records" in summary["data"]["text/html"]


def test_build_hook_keeps_a_fresh_bundle(tmp_path, monkeypatch):
    """hatch_build.build_bundle: nothing to do when the bundle is newer than its sources,
    and a clear error when npm is missing and a build is needed."""
    import os
    import shutil
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
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

    reports = ("reports.html", "reports.notebook", "reports.view_state")
    imports = "; ".join(f"import onnx_sbs_nb.{m}" for m in reports)
    shown = "[m for m in sys.modules if m == 'onnx_sbs_nb.notebook.widget' or m.startswith('anywidget')]"
    cmd = [sys.executable, "-c", f"import sys; {imports}; print({shown})"]
    assert subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_a_plain_install_has_the_widget():
    """The widget's packages are dependencies, and openpyxl (the demo writes an xlsx: a
    plain install crashed in `onnx-sbs demo`); only the test tools are extras."""
    import re
    from pathlib import Path

    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    deps = {re.split(r"[<>=\[ ;]", d)[0].lower() for d in project["dependencies"]}
    assert {"ipywidgets", "anywidget", "pandas", "plotly", "tqdm", "openpyxl"} <= deps
    assert "playwright" not in deps
    assert project["optional-dependencies"]["report"] == []  # older instructions still work


def test_widget_takes_the_onnx_program_as_the_readme_shows():
    """``SbsWidget(ep, torch.onnx.export(...))``: the ONNXProgram's own prepared program
    is used (nothing re-prepared), and the rows are those its ModelProto gives."""
    import warnings

    from tests.models import MLP

    torch.manual_seed(0)
    x = (torch.randn(3, 8),)
    ep = torch.export.export(MLP().eval(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(ep, x, dynamo=True, verbose=False)
    w = SbsWidget(ep, program, x, own_error=True)
    assert w.wait(120)
    assert w.session.run.prepared.source == "onnx_program"
    v = SbsWidget(ep, program.model_proto, x, own_error=True)
    assert v.wait(120)
    assert w.summary["verdict"] == v.summary["verdict"] == "pass"
    assert w.to_frame()[["ep_name", "onnx_name"]].equals(v.to_frame()[["ep_name", "onnx_name"]])


def test_failing_count_says_how_many_only_inherit():
    """The widget's line says what the terminal says: of the failing values, how many
    only inherit their error (their node agrees on torch's inputs)."""
    recs = [
        Record(
            step=i,
            onnx_name=f"v{i}",
            onnx_op_type="Add",
            onnx_id_node=i,
            kind="node",
            err_abs=1.0 if i else 0.5,
            err_abs2=0.5 if i == 0 else 0.0,
            passed=False,
            passed2=i > 0,
            status="fail",
            atol=1e-4,
        )
        for i in range(4)
    ]
    w = SbsWidget(records=recs)
    w.wait()
    assert "4 failing, of which 3 only inherit their error" in repr(w)
    assert "4 failing, of which 3 only inherit their error" in w.summary.to_text()


def test_culprit_so_far_while_the_run_streams(model):
    """The card answers while the run goes: once the culprit's record has streamed, the
    widget's summary names it (the run still going), before the last record."""
    ep, onx, x = model
    s = SbsSession(ep, onx, x, own_error=True, batch_interval=0)
    w = SbsWidget(session=s)
    seen = []

    def watch(event, payload):
        if event == "rows" and s.running and w.summary is not None:
            seen.append((len(s.records), w.summary.culprit.onnx_op_type, w.summary.verdict))

    s.add_listener(watch)  # after the widget's own listener: it has seen the batch
    changes = []
    w.observe(lambda change: changes.append(change["new"]), names="summary")
    s.start()
    total = len(s.records)
    assert seen, "no culprit while the run streamed"
    n, op, verdict = seen[0]
    assert op == "Gemm" and verdict == "incomplete" and n < total
    assert w.summary.culprit.onnx_op_type == "Gemm" and w.summary.verdict == "fail"
    # synced when the culprit changes, not every batch (here: once, then the final one)
    assert len(changes) == 2 and len(seen) > 2


def test_one_copy_of_the_bundle_per_notebook():
    """The first live widget carries the JS bundle, the next ones a few lines that wait
    for it (three widgets made a 5.4 MB notebook); once the carrier is closed (gone from
    the page and the saved state), the next widget carries it again."""
    from onnx_sbs_nb.reports.view_state import SHIM_ESM

    recs = [Record(step=0, onnx_name="v", err_abs=0.0, status="ok")]
    widgets = [SbsWidget(records=recs) for _ in range(3)]
    carriers = [w for w in widgets if w._esm == view_state.bundle_js()]
    others = [w for w in widgets if w._esm == SHIM_ESM]
    # one of them carries it, unless a widget of an earlier test still does
    assert len(carriers) + len(others) == 3 and len(carriers) <= 1
    assert len(SHIM_ESM) < 1000 < len(view_state.bundle_js())
    from onnx_sbs_nb.notebook import widget as widget_module

    holder = widget_module._bundle_holder()
    assert holder is not None and holder._esm == view_state.bundle_js()
    holder.close()
    again = SbsWidget(records=recs)
    assert again._esm == view_state.bundle_js() and widget_module._bundle_holder() is again
    assert SbsWidget(records=recs)._esm == SHIM_ESM


def _report_state(text: str) -> dict:
    """The widget state an HTML report carries (gzipped when large)."""
    import base64
    import gzip
    import json
    import re

    m = re.search(
        r'<script type="application/json" id="onnx-sbs-state-0"([^>]*)>(.*?)</script>', text, re.S
    )
    data = json.loads(m.group(2))
    if "gzip" in m.group(1):
        data = json.loads(gzip.decompress(base64.b64decode(data)))
    return data


def test_a_generation_run_syncs_its_token_streams_and_the_parting_steps_records(tmp_path):
    """Issue 51, item 4: the widget over a generation parity run syncs the two token
    streams (decoded by the user's callable) as ``timeline``; its rows are the parting
    step compared node by node (``records_step``), and the saved report carries both."""
    pytest.importorskip("transformers")
    from onnx_sbs_nb import generation_parity

    from ..corpus.cache_decoders import export_case, scaled_cache_output

    case = export_case("dynamic_cache", "dynamic")
    parity = generation_parity(case.ep, scaled_cache_output(case.onx, 1.5), case.kwargs(), steps=5)
    w = SbsWidget(records=parity, decode=lambda t: f"tok{t}")
    w.wait()
    tl = w.timeline
    assert w.trait_metadata("timeline", "sync") and "timeline" in STATE_TRAITS
    assert tl["parted_at"] == parity.diverged_at == 0 and tl["parted_by"] == "cache"
    assert tl["margin"] == parity.steps[0].margin
    assert tl["sides"][0]["text"][0][0] == f"tok{parity.steps[0].torch_tokens[0]}"
    # the step's node-by-node records are the rows the table shows
    assert tl["records_step"] == 0 and tl["records"] == w.rows["n"] == len(parity.records) > 0
    assert w.state()["timeline"] == tl
    saved = _report_state(w.save_html(tmp_path / "gen.html").read_text(encoding="utf-8"))
    assert saved["timeline"] == tl and saved["rows"]["n"] == tl["records"]
    # a kind with no timeline syncs none
    plain = SbsWidget(records=[Record(ep_name="a", onnx_name="a", err_abs=0.0)])
    assert plain.timeline is None and widget_state([])["timeline"] is None
