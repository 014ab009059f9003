"""The smallest failing piece (issue 38, item 4): the culprit's replay bundle, written and
replayed from what the run knows, through the API, the session's action and the CLI."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import onnx
import pytest
import torch

from onnx_sbs_nb import AlignedRun, load_replay, save_culprit_bundle
from onnx_sbs_nb.cli.main import main
from onnx_sbs_nb.notebook.session import SbsSession


class Block(torch.nn.Module):
    """Enough nodes that the smallest piece is much smaller than the model."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.norm = torch.nn.LayerNorm(32)
        self.b = torch.nn.Linear(32, 32)
        self.c = torch.nn.Linear(32, 8)

    def forward(self, x):
        h = torch.relu(self.a(x))
        h = self.norm(h)
        h = torch.tanh(self.b(h)) * 2.0
        return self.c(h)


def _export() -> tuple[torch.export.ExportedProgram, onnx.ModelProto, tuple]:
    torch.manual_seed(0)
    x = torch.randn(4, 16)
    ep = torch.export.export(Block().eval(), (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    return ep, onx, (x,)


def _planted(onx: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The Tanh swapped for a Sigmoid: a lowering bug in one node, mid-graph."""
    bad = onnx.ModelProto()
    bad.CopyFrom(onx)
    node = next(n for n in bad.graph.node if n.op_type == "Tanh")
    node.op_type = "Sigmoid"
    return bad, node.name


@pytest.fixture(scope="module")
def exported():
    return _export()


def test_the_culprits_bundle_is_the_smallest_piece_and_replays_the_error(exported, tmp_path):
    ep, onx, args = exported
    bad, culprit_node = _planted(onx)
    run = AlignedRun(ep, bad, args)
    list(run)
    bundle = save_culprit_bundle(run, tmp_path / "bundles")
    assert bundle is not None
    assert bundle.folder.parent == tmp_path / "bundles"
    assert bundle.node == culprit_node and "tanh" in bundle.culprit
    # from the nearest values with a torch twin: the Tanh's input is one, so one node
    assert bundle.nodes == 1 < len(bad.graph.node)
    assert bundle.reproduced and bundle.replayed_error > 0.1
    assert bundle.replayed_error == pytest.approx(bundle.own_error, rel=1e-3)
    saved = json.loads((bundle.folder / "culprit.json").read_text())
    assert saved["replay"]["reproduced"] is True
    assert saved["culprit"]["onnx_node"] == culprit_node
    # a colleague opens it without running anything from it and sees the same error
    replay = load_replay(bundle.folder)
    assert replay.outputs[0]["torch_inputs"]["max_abs"] == pytest.approx(bundle.replayed_error)
    assert "reproduces" in bundle.to_text()


def test_a_faithful_run_has_no_culprit_bundle(exported, tmp_path):
    ep, onx, args = exported
    run = AlignedRun(ep, onx, args)
    list(run)
    assert save_culprit_bundle(run, tmp_path) is None
    assert not any(tmp_path.iterdir())


def test_the_sessions_action_saves_it(exported, tmp_path):
    ep, onx, args = exported
    bad, culprit_node = _planted(onx)
    session = SbsSession(ep, bad, args, replay_root=tmp_path).start()
    session.wait()
    done = session.act("save_culprit")
    assert done.ok, done.message
    assert Path(done.result["folder"]).parent == tmp_path
    assert done.result["node"] == culprit_node and done.result["reproduced"] is True
    faithful = SbsSession(ep, onx, args, replay_root=tmp_path / "none").start()
    faithful.wait()
    answer = faithful.act("save_culprit")
    assert not answer.ok and "no culprit" in answer.message


def test_the_cli_writes_and_replays_it(exported, tmp_path, capsys):
    ep, onx, args = exported
    bad, culprit_node = _planted(onx)
    torch.export.save(ep, tmp_path / "p.pt2")
    onnx.save(bad, tmp_path / "m.onnx")
    torch.save(args, tmp_path / "x.pt")
    out = tmp_path / "out"
    files = [str(tmp_path / n) for n in ("p.pt2", "m.onnx", "x.pt")]
    reports = [str(out / "r.csv"), str(out / "r.html")]
    code = main(["run", *files, "-o", *reports, "--no-progress", "--replay-culprit"])
    printed = capsys.readouterr().out
    assert code == 1, printed
    bundles = list((out / "sbs_replays").iterdir())
    assert len(bundles) == 1 and (bundles[0] / "culprit.json").is_file()
    # the terminal and the report say where it is and that it shows the error
    line = next(x for x in printed.splitlines() if "replay bundle:" in x)
    assert str(bundles[0]) in line and "reproduces" in line, printed
    page = (out / "r.html").read_text()
    assert "replay bundle" in page and bundles[0].name in page
    # with --replay-dir and no other selection, the bundle goes there
    there = tmp_path / "here"
    code = main(
        ["run", *files, "-o", str(out / "r2.csv"), "--no-progress", "--replay-culprit",
         "--replay-dir", str(there)]
    )  # fmt: skip
    assert code == 1 and len(list(there.iterdir())) == 1


class ReluScale(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0 + 1.0


def test_over_many_inputs_the_bundle_holds_the_input_that_shows_it(tmp_path):
    """Relu lowered as Abs differs only where a value is negative: over four inputs, only
    input 2 has any; the bundle is made of that input's values and reproduces."""
    from onnx_sbs_nb import aligned_over_inputs

    inputs = [(torch.rand(3, 5),), (torch.rand(3, 5),), (-torch.rand(3, 5),), (torch.rand(3, 5),)]
    ep = torch.export.export(ReluScale(), inputs[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, inputs[0], dynamo=True, verbose=False).model_proto
    next(n for n in onx.graph.node if n.op_type == "Relu").op_type = "Abs"
    run = aligned_over_inputs(ep, onx, inputs)
    list(run)
    bundle = save_culprit_bundle(run, tmp_path)
    assert bundle is not None and bundle.input_index == 2, bundle
    assert bundle.reproduced and bundle.nodes == 1
    assert "on input 2" in bundle.to_text()
    saved = json.loads((bundle.folder / "culprit.json").read_text())
    assert saved["replay"]["input_index"] == 2 and saved["culprit"]["input_index"] == 2
    # the bundle's inputs are input 2's values
    fed = torch.load(bundle.folder / "torch_inputs.pt", weights_only=True)
    assert any(torch.equal(v, inputs[2][0]) for v in fed.values())
