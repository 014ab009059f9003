"""RunOptions: every option validated once, with a message that names the fix."""

from __future__ import annotations

import pytest

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.engine.options import RunOptions
from onnx_sbs_nb.align.post.replay import ReplayConfig
from onnx_sbs_nb.errors import SbsInputError

from ...models import Chain, export


@pytest.fixture(scope="module")
def chain():
    import torch

    x = torch.randn(3, 4)
    ep, onx = export(Chain(), (x,))
    return ep, onx, (x,)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"atol": "1e-3"}, "atol must be a number"),
        ({"rtol": float("nan")}, "rtol must be a finite number >= 0"),
        ({"atol": -1.0}, "atol must be a finite number >= 0"),
        ({"atol": True}, "atol must be a number"),
        ({"runner": "ort"}, "unknown runner 'ort'"),
        ({"runner": 3}, "cannot use a int as a node runner"),
        ({"reset": "some"}, "reset must be None or 'all'"),
        ({"reset_names": [1]}, "reset_names must be value names"),
        ({"own_error": "yes"}, "own_error must be True or False"),
        ({"device": "tpu"}, "device must be 'cpu' or 'cuda"),
        ({"replay": ReplayConfig(names=["x"])}, "needs replay_dir="),
        ({"replay": {"names": 3}, "replay_dir": "d"}, "bad replay configuration"),
        ({"replay_dir": "a\x00b", "replay": ReplayConfig()}, "replay_dir must be a folder"),
        ({"tolerance": 1}, "unknown option 'tolerance'"),
    ],
)
def test_bad_options_are_refused_at_the_call(chain, kwargs, message):
    ep, onx, args = chain
    with pytest.raises(SbsInputError, match=message):
        run_aligned(ep, onx, args, **kwargs)


def test_replay_dir_that_is_a_file(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SbsInputError, match="is a file"):
        RunOptions(replay=ReplayConfig(), replay_dir=f)


def test_aliases_and_replace():
    o = RunOptions.from_kwargs(rerun_with_torch_inputs=True, atol=1)
    assert o.own_error and o.atol == 1.0 and o.needs_torch_inputs
    p = o.replace(reset="all")
    assert p.reset == "all" and p.own_error and o.reset is None
    assert RunOptions.from_kwargs({"atol": 0.5}, rtol=0.1).to_dict()["rtol"] == 0.1
    assert not RunOptions().needs_torch_inputs


def test_strict_travels_from_the_flags_to_the_session_summary():
    """``--strict`` / ``strict=True``: validated with the other options, kept in the
    options' dict (the .jsonl header), and applied to the session's summary."""
    import argparse

    from onnx_sbs_nb.notebook.run_args import add_run_arguments, options_from_args
    from onnx_sbs_nb.notebook.session import SbsSession

    p = argparse.ArgumentParser()
    add_run_arguments(p)
    assert options_from_args(p.parse_args(["--strict"])).strict is True
    assert options_from_args(p.parse_args([])).strict is False
    assert RunOptions(strict=True).to_dict()["strict"] is True
    with pytest.raises(SbsInputError, match="strict must be True or False"):
        RunOptions(strict="yes")
    torch_ = pytest.importorskip("torch")
    x = torch_.randn(3, 4)
    ep, onx = export(Chain(), (x,))
    session = SbsSession(ep, onx, (x,), strict=True)
    session.wait()
    assert session.summary.strict and session.summary["strict"] is True
