"""SbsSession: the controller every view uses (real engine, real exporter)."""

from __future__ import annotations

import threading

import onnx
import pytest
import torch

from onnx_sbs_nb.notebook.session import (
    FAILED,
    FINISHED,
    IDLE,
    STOPPED,
    ActionError,
    SbsSession,
    split_inputs,
)
from onnx_sbs_nb.records import Record
from tests.models import MLP, export


def _broken_mlp() -> tuple:
    """An MLP whose second ONNX Gemm scales its product by 1.01: that node is to blame."""
    torch.manual_seed(0)
    x = (torch.randn(3, 8),)
    ep, onx = export(MLP(), x)
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    gemm = [n for n in onx.graph.node if n.op_type == "Gemm"][1]
    for a in list(gemm.attribute):
        if a.name == "alpha":
            gemm.attribute.remove(a)
    gemm.attribute.append(onnx.helper.make_attribute("alpha", 1.01))
    return ep, onx, x


@pytest.fixture(scope="module")
def model():
    return _broken_mlp()


def test_split_inputs_forms():
    t = torch.zeros(2)
    assert split_inputs((t,)) == ((t,), None)
    assert split_inputs([t]) == ((t,), None)
    assert split_inputs({"x": t}) == (None, {"x": t})
    assert split_inputs("inputs.pt") == ("inputs.pt", None)
    args, kwargs = split_inputs(t)
    assert args[0] is t and kwargs is None
    with pytest.raises(TypeError, match="inputs must be"):
        split_inputs(3)


def test_in_thread_run_keeps_records_and_summary(model):
    ep, onx, x = model
    events = []
    s = SbsSession(ep, onx, x, own_error=True, batch_interval=0)
    s.add_listener(lambda ev, p: events.append((ev, p)))
    assert s.state == IDLE
    s.start()
    assert s.state == FINISHED
    recs = s.records
    assert recs and all(isinstance(r, Record) for r in recs)
    assert [r.step for r in recs] == list(range(len(recs)))
    # streamed batches are contiguous and cover every record exactly once
    streamed = [r for ev, p in events if ev == "rows" for r in p["records"]]
    assert streamed == recs
    assert events[-1][0] == "finished"
    st = s.status
    assert st["state"] == FINISHED and st["finished"] and st["rows"] == len(recs)
    assert st["failures"] >= 1
    summary = s.summary
    first = summary["first_own_failure"]
    assert first is not None and first["onnx_op_type"] == "Gemm" and first["passed2"] is False


def test_background_run_and_thread_safe_listeners(model):
    ep, onx, x = model
    seen: list[int] = []
    threads = set()
    lock = threading.Lock()

    def listener(ev, payload):
        if ev == "rows":
            threads.add(threading.current_thread().name)
            with lock:
                assert payload["start"] == len(seen)
                seen.extend(r.step for r in payload["records"])

    s = SbsSession(ep, onx, x, background=True, batch_interval=0)
    s.add_listener(listener)
    s.start()
    snapshots = []
    while not s.wait(0.001):
        snapshots.append(len(s.records))  # reading while the thread appends
    assert s.state == FINISHED
    assert seen == [r.step for r in s.records]
    assert snapshots == sorted(snapshots)
    assert threads == {"sbs-run"}


def test_stop_mid_run_keeps_rows(model):
    ep, onx, x = model
    s = SbsSession(ep, onx, x, batch_interval=0)
    s.add_listener(lambda ev, p: s.stop() if ev == "rows" else None)
    s.start()
    assert s.state == STOPPED
    n = len(s.records)
    assert 1 <= n < s.status["total_onnx_nodes"] + len(onx.graph.initializer)
    assert s.records == s.run.records[:n]
    assert s.status["stopped"]


def test_keyboard_interrupt_stops_keeping_rows_then_actions_work(model, tmp_path):
    ep, onx, x = model
    s = SbsSession(ep, onx, x, batch_interval=0, replay_root=tmp_path)
    calls = []

    def interrupt(ev, payload):
        calls.append(ev)
        if ev == "rows" and sum(c == "rows" for c in calls) == 10:
            raise KeyboardInterrupt  # what a kernel interrupt does during an in-cell run

    s.add_listener(interrupt)
    s.start()  # must not raise
    assert s.state == STOPPED
    recs = s.records
    assert len(recs) >= 10
    node = next(r for r in recs if r.onnx_id_node is not None and r.onnx_id_node >= 0)
    res = s.rerun_in_torch(node)
    assert res["error"] is None and res["outputs"]


def test_actions_on_a_finished_run(model, tmp_path):
    ep, onx, x = model
    s = SbsSession(ep, onx, x, own_error=True, replay_root=tmp_path / "r")
    s.start()
    bad = next(r for r in s.records if r.passed2 is False)
    detail = s.node_detail(bad)
    assert detail["op_type"] and detail["inputs"]
    res = s.rerun_in_torch(bad.onnx_name)
    assert res["device"] == "cpu" and res["outputs"]
    saved = s.save_replay(bad)
    assert saved.bundle.is_dir() and saved.bundle.parent == (tmp_path / "r").resolve()
    from onnx_sbs_nb.align.post.replay import ReplayConfig

    cfg = ReplayConfig.load(saved.config)
    assert cfg.names == [bad.onnx_node_name]  # the node itself, by name
    assert saved.config.parent == saved.bundle.parent
    weight = next(r for r in s.records if r.kind == "weight")
    with pytest.raises(ActionError, match="not the output of an ONNX node"):
        s.rerun_in_torch(weight)


def test_device_and_misuse_errors(model):
    ep, onx, x = model
    s = SbsSession(ep, onx, x)
    with pytest.raises(ActionError, match="device must be 'cpu' or 'cuda"):
        s.set_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ActionError, match="cannot use 'cuda'.*no CUDA device"):
            s.set_device("cuda")
    with pytest.raises(ActionError, match="name of an ONNX node"):
        s.rerun_in_torch("")
    s.start()
    s.start()  # a second start does nothing
    assert s.state == FINISHED


def test_action_refused_while_running(model):
    ep, onx, x = model
    gate = threading.Event()
    entered = threading.Event()

    def hold(ev, payload):
        if ev == "rows" and not gate.is_set():
            entered.set()
            gate.wait(30)

    s = SbsSession(ep, onx, x, background=True, batch_interval=0)
    s.add_listener(hold)
    s.start()
    assert entered.wait(30)
    try:
        with pytest.raises(ActionError, match="still going"):
            s.rerun_in_torch(s.records[-1].onnx_name or "x")
    finally:
        gate.set()
    assert s.wait(60)


def test_engine_error_is_kept_not_raised():
    def broken():
        yield Record(ep_name="a", onnx_name="a", err_abs=0.0)
        raise ValueError("boom in the engine")

    s = SbsSession.from_run(broken())
    s.start()
    assert s.state == FAILED
    assert "boom in the engine" in s.error
    assert len(s.records) == 1
    with pytest.raises(ActionError, match="rerun does not apply to records"):
        s.rerun_in_torch("a")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_rerun_on_cuda(model):
    ep, onx, x = model
    s = SbsSession(ep, onx, x)
    s.start()
    s.set_device("cuda")
    node = next(r for r in s.records if r.onnx_id_node is not None and r.onnx_id_node >= 0)
    assert s.rerun_in_torch(node)["device"].startswith("cuda")


def test_save_replay_of_one_node_name_in_two_models_keeps_both(tmp_path):
    """Two models with a node of the same name (the demo's LayerNormalization, broken and
    faithful), saved into one folder: each bundle has its own folder and selection file;
    saving the first again refreshes its own folder and adds none."""
    import onnx as onnx_

    from onnx_sbs_nb.cli.demo import build_demo

    root = tmp_path / "replays"
    saved = []
    for inject in (True, False):
        case = build_demo(inject=inject)
        s = SbsSession(case.ep, case.onx, case.args, batch_interval=0, replay_root=root)
        s.start()
        rec = next(r for r in s.records if r.onnx_op_type == "LayerNormalization")
        saved.append((s, rec, s.save_replay(rec)))
    (s1, rec1, a), (_, _, b) = saved
    assert a.bundle != b.bundle and a.config != b.config
    assert a.bundle.parent == b.bundle.parent == root.resolve()
    for one, inject in ((a, True), (b, False)):
        model = onnx_.load(str(one.bundle / "model.onnx"))
        eps = onnx_.helper.get_attribute_value(
            next(att for att in model.graph.node[-1].attribute if att.name == "epsilon")
        )
        # each folder still holds its own model's node: nothing was replaced
        assert (abs(eps - 0.5) < 1e-6) == inject, (one.bundle, eps)
        assert one.config.is_file()
    again = s1.save_replay(rec1)
    assert again.bundle == a.bundle
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == sorted(
        [a.bundle.name, b.bundle.name]
    )
