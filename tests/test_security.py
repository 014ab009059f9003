"""Issue 12 through the Python API: a stopped run is never a pass, writes stay in the
chosen folder, bad options are SbsInputError before anything runs."""

from __future__ import annotations

import pytest
import torch

from onnx_sbs_nb.align.engine.runners import OnnxruntimeRunner
from onnx_sbs_nb.align.run import AlignedRun, run_aligned
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.notebook.session import SbsSession
from tests.notebook.test_session import _broken_mlp


@pytest.fixture(scope="module")
def model():
    return _broken_mlp()


class StopsTheSession(OnnxruntimeRunner):
    """Presses Stop while the second ONNX node runs."""

    def __init__(self) -> None:
        super().__init__()
        self.session: SbsSession | None = None
        self.calls = 0

    def prepare(self, node, ctx):
        fn = super().prepare(node, ctx)

        def run(inputs):
            self.calls += 1
            if self.calls == 2 and self.session is not None:
                self.session.stop()
            return fn(inputs)

        return run


def test_stopped_session_is_stopped_not_pass(model):
    ep, onx, x = model
    runner = StopsTheSession()
    s = SbsSession(ep, onx, x, runner=runner, batch_interval=0)
    runner.session = s
    assert s.summary["verdict"] == "incomplete"  # not started: nothing proves anything
    s.start()
    assert s.state == "stopped"
    summary = s.summary
    totals = summary["totals"]
    assert summary["verdict"] == "stopped"
    assert summary["completion"]["state"] == "stopped"
    assert 0 < totals["nodes_done"] < totals["nodes_total"] == len(onx.graph.node)
    # every pair compared so far passes: that is still not a PASS
    assert all(r.passed is not False for r in s.records)


def test_stopped_widget_is_stopped_not_pass(model):
    pytest.importorskip("anywidget")
    from onnx_sbs_nb.notebook.widget import SbsWidget

    ep, onx, x = model
    runner = StopsTheSession()
    w = SbsWidget(ep, onx, x, runner=runner, batch_interval=0)
    runner.session = w.session
    w.session.start()
    assert w.summary["verdict"] == "stopped"
    assert w.summary["totals"]["nodes_done"] < w.summary["totals"]["nodes_total"]
    assert w.get_summary().verdict == "stopped"  # the Python-side Summary says so too


def test_finished_session_has_its_verdict(model):
    ep, onx, x = model
    s = SbsSession(ep, onx, x, batch_interval=0).start()
    assert s.summary["verdict"] == "fail"  # the broken Gemm
    assert s.summary["completion"] == {
        "state": "finished",
        "nodes_done": len(onx.graph.node),
        "nodes_total": len(onx.graph.node),
        "reason": None,
    }


def test_replay_sidecar_replaces_a_planted_link(model, tmp_path):
    """save_replay writes <bundle>.replay.json: a link planted at that name must not carry
    the write outside the replay folder."""
    ep, onx, x = model
    s = SbsSession(ep, onx, x, batch_interval=0, replay_root=tmp_path / "replays").start()
    node = next(r for r in s.records if r.onnx_op_type == "Gemm")
    first = s.save_replay(node)
    outside = tmp_path / "outside.txt"
    outside.write_text("precious")
    first.config.unlink()
    first.config.symlink_to(outside)
    again = s.save_replay(node)
    assert again.config == first.config and not again.config.is_symlink()
    assert outside.read_text() == "precious"
    assert '"names"' in again.config.read_text()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"atol": "1e-3"}, "atol must be a number"),
        ({"rtol": float("nan")}, "finite number"),
        ({"atol": -1.0}, "finite number"),
        ({"runner": "bogus"}, "unknown runner"),
        ({"runner": 3}, "cannot use a int"),
        ({"trust_pickles": "yes"}, "trust_pickles must be True or False"),
        ({"replay_dir": "a\x00b", "replay": {"names": ["x"]}}, "folder path"),
        ({"replay": {"names": 5}, "replay_dir": "r"}, "bad replay configuration"),
        ({"frobnicate": 1}, "unknown option"),
    ],
)
def test_bad_api_options_are_input_errors_before_the_run(model, options, message):
    ep, onx, x = model
    for make in (AlignedRun, run_aligned, SbsSession):
        with pytest.raises(SbsInputError, match=message):
            make(ep, onx, x, **options)


def test_replay_dir_that_is_a_file(model, tmp_path):
    ep, onx, x = model
    f = tmp_path / "a_file"
    f.write_text("x")
    with pytest.raises(SbsInputError, match="is a file"):
        AlignedRun(ep, onx, x, replay={"names": ["x"]}, replay_dir=f)


def test_int64_outputs_compared_exactly():
    """A program whose int64 output differs by one at 2**60: a failure, not a pass."""
    import onnx
    from onnx import TensorProto

    class AddBig(torch.nn.Module):
        def forward(self, x):
            return x + (2**60)

    x = torch.zeros(2, dtype=torch.int64)
    ep = torch.export.export(AddBig(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    # the export is faithful; make the constant 2**60 + 1, as a corrupt export would
    for init in onx.graph.initializer:
        if init.data_type == TensorProto.INT64 and onnx.numpy_helper.to_array(init).size == 1:
            v = onnx.numpy_helper.to_array(init)
            if int(v.reshape(-1)[0]) == 2**60:
                init.CopyFrom(onnx.numpy_helper.from_array(v + 1, init.name))
    for node in onx.graph.node:
        if node.op_type == "Constant":
            t = onnx.numpy_helper.to_array(node.attribute[0].t)
            if t.dtype.kind == "i" and t.size == 1 and int(t.reshape(-1)[0]) == 2**60:
                node.attribute[0].t.CopyFrom(onnx.numpy_helper.from_array(t + 1))
    out = [r for r in run_aligned(ep, onx, (x,)) if r.kind == "output"]
    assert out and out[0].passed is False and out[0].err_abs == 1.0
