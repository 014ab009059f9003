"""Warm runs through the screen (``align/warm_screen.py``): a run of a program and model
already run twice on inputs of the same shapes is made by the screen where every pair
passes, with the records the engine gives field by field; anything else (a failing pair,
a weight changed in place, other shapes, own errors) goes to the engine."""

from __future__ import annotations

import gc

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch

from onnx_sbs_nb import summarize
from onnx_sbs_nb.align import screen as screen_module
from onnx_sbs_nb.align import warm_screen
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.align.screen import _fields
from onnx_sbs_nb.records import KIND_NODE, KIND_WEIGHT
from tests.align.test_screen import Mlp
from tests.models import export, tiny_llama


def _mlp(planted: bool = False, dynamic: bool = False):
    torch.manual_seed(0)
    x = torch.rand(4, 16)
    shapes = ({0: torch.export.Dim("batch", min=2, max=64)},) if dynamic else None
    ep, onx = export(Mlp(), (x,), dynamic_shapes=shapes)
    if planted:  # its Abs made an Identity: wrong only where x < 0
        (node,) = [n for n in onx.graph.node if n.op_type == "Abs"]
        node.op_type = "Identity"
    return ep, onx


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setattr(screen_module, "ENABLED", True)
    warm_screen._WARM.clear()
    yield
    warm_screen._WARM.clear()


def _run(ep, onx, args, **options):
    run = AlignedRun(ep, onx, args, **options)
    return run, list(run)


def _warmed(ep, onx, args, **options):
    """Two finished runs: the second builds the screen."""
    for _ in range(2):
        run, _ = _run(ep, onx, args, **options)
        assert not run.screened


def _engine(monkeypatch, ep, onx, args, **options):
    monkeypatch.setattr(screen_module, "ENABLED", False)
    try:
        return _run(ep, onx, args, **options)
    finally:
        monkeypatch.setattr(screen_module, "ENABLED", True)


def _same_records(mine, theirs):
    assert len(mine) == len(theirs)
    for a, b in zip(mine, theirs, strict=True):
        assert a.step == b.step
        assert _fields(a) == _fields(b), (a.onnx_name, a.ep_name)


def test_warm_run_on_a_new_input_is_the_engines_run(monkeypatch):
    ep, onx, (ids,) = tiny_llama()
    _warmed(ep, onx, (ids,))
    other = (ids * 7 + 3) % 128  # another input of the same shape
    run, recs = _run(ep, onx, (other,))
    assert run.screened and run.status.extra["screened"]
    engine_run, engine = _engine(monkeypatch, ep, onx, (other,))
    assert not engine_run.screened
    _same_records(recs, engine)
    assert run.records == recs
    for field in ("records", "failures", "max_err_abs", "max_err_name", "finished"):
        assert getattr(run.status, field) == getattr(engine_run.status, field)
    assert run.status.fraction == 1.0
    nodes = [r for r in recs if r.kind == KIND_NODE and r.err_abs]
    assert nodes and all(r.err_cos is not None and r.err_p99 is not None for r in nodes)
    # the errors are this input's: not the template run's
    _, first = _run(ep, onx, (ids,))
    assert [r.err_abs for r in first] != [r.err_abs for r in recs]


def test_a_failing_pair_goes_to_the_engine(monkeypatch):
    ep, onx = _mlp(planted=True)
    x = torch.rand(4, 16)
    _warmed(ep, onx, (x,))
    assert _run(ep, onx, (torch.rand(4, 16),))[0].screened
    bad = torch.rand(4, 16)
    bad[1, 5] = -0.75
    run, recs = _run(ep, onx, (bad,))
    assert not run.screened
    _, engine = _engine(monkeypatch, ep, onx, (bad,))
    _same_records(recs, engine)
    culprit = summarize(recs).culprit
    assert culprit.onnx_op_type == "Identity"
    assert culprit.onnx_name == summarize(engine).culprit.onnx_name
    # the screen is kept: an input where every pair passes is screened again
    assert _run(ep, onx, (x,))[0].screened


def test_an_initializer_changed_in_place_is_seen():
    ep, onx = _mlp()
    x = torch.rand(4, 16)
    _warmed(ep, onx, (x,))
    assert _run(ep, onx, (x,))[0].screened
    init = next(t for t in onx.graph.initializer if t.name.endswith("fc1.weight"))
    value = onnx.numpy_helper.to_array(init)
    init.CopyFrom(onnx.numpy_helper.from_array(value * np.float32(1.5), init.name))
    run, recs = _run(ep, onx, (x,))
    assert not run.screened and run.status.failures
    assert any(r.kind == KIND_WEIGHT and r.failed for r in recs)


def test_a_torch_weight_changed_in_place_is_seen():
    ep, onx = _mlp()
    x = torch.rand(4, 16)
    _warmed(ep, onx, (x,))
    assert _run(ep, onx, (x,))[0].screened
    with torch.no_grad():
        ep.state_dict["fc2.weight"].mul_(1.5)
    run, _ = _run(ep, onx, (x,))
    assert not run.screened and run.status.failures


def test_a_node_renamed_makes_another_model():
    ep, onx = _mlp()
    x = torch.rand(4, 16)
    _warmed(ep, onx, (x,))
    onx.graph.node[0].name = "renamed"
    assert not _run(ep, onx, (x,))[0].screened


def test_other_shapes_go_to_the_engine(monkeypatch):
    ep, onx = _mlp(dynamic=True)
    _warmed(ep, onx, (torch.rand(4, 16),))
    assert _run(ep, onx, (torch.rand(4, 16),))[0].screened
    x = torch.rand(6, 16)
    run, recs = _run(ep, onx, (x,))
    assert not run.screened and not run.status.failures
    _same_records(recs, _engine(monkeypatch, ep, onx, (x,))[1])
    # the example's shapes are still screened
    assert _run(ep, onx, (torch.rand(4, 16),))[0].screened


@pytest.mark.parametrize(
    "options",
    [{"own_error": True}, {"time_nodes": True}, {"reset": "all"}],
    ids=["own_error", "time_nodes", "reset"],
)
def test_runs_the_screen_cannot_reproduce_go_to_the_engine(options):
    ep, onx = _mlp()
    x = torch.rand(4, 16)
    _warmed(ep, onx, (x,), **options)
    assert not _run(ep, onx, (x,), **options)[0].screened


def test_options_are_part_of_the_key():
    ep, onx = _mlp()
    x = torch.rand(4, 16)
    _warmed(ep, onx, (x,))
    assert not _run(ep, onx, (x,), atol=1e-3)[0].screened
    assert _run(ep, onx, (x,))[0].screened


def test_a_stopped_warm_run_keeps_its_records():
    ep, onx = _mlp()
    x = torch.rand(4, 16)
    _warmed(ep, onx, (x,))
    run = AlignedRun(ep, onx, (x,))
    it = iter(run)
    first = [next(it) for _ in range(3)]
    run.stop()
    rest = list(it)
    assert run.screened and not rest
    assert run.records == first and run.status.stopped and run.status.records == 3
    assert run.status.done_onnx_nodes < run.status.total_onnx_nodes


def test_the_kept_screen_does_not_keep_the_program_alive():
    ep, onx = _mlp()
    x = torch.rand(4, 16)
    _warmed(ep, onx, (x,))
    assert len(warm_screen._WARM) == 1
    del ep, onx
    gc.collect()
    assert len(warm_screen._WARM) == 0
