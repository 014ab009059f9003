"""%sbs through IPython's own shell: variables, file paths, options, usage errors."""

from __future__ import annotations

import os

import pytest
import torch

from onnx_sbs_nb.reports import view_state
from tests.notebook.test_session import _broken_mlp

pytest.importorskip("IPython")
# CI must build the bundle: there a missing one fails loudly instead of skipping
pytestmark = pytest.mark.skipif(
    not view_state.BUNDLE_PATH.is_file() and not os.environ.get("CI"),
    reason="widget bundle not built (cd js && npm run build)",
)


@pytest.fixture(scope="module")
def ip():
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "onnx_sbs_nb")
    return shell


@pytest.fixture(scope="module")
def model():
    return _broken_mlp()


def test_variables_and_options(ip, model, capsys):
    ep, onx, x = model
    ip.user_ns.update(my_ep=ep, my_onx=onx, my_x=x)
    ip.run_line_magic("sbs", "my_ep my_onx my_x --atol 1e-4 --rtol 1e-3 --own-error -o w")
    w = ip.user_ns["w"]
    assert ip.user_ns["_sbs"] is w
    assert w.session.state == "finished"  # ran in the cell, as displayed
    assert w.atol == 1e-4 and w.rtol == 1e-3
    assert w.session.run.options.own_error and w.session.run.atol == 1e-4
    assert w.summary["first_own_failure"]["passed2"] is False
    assert "SbsWidget(finished" in capsys.readouterr().out  # the terminal shows the repr


def test_assignment_binds_the_widget_and_shows_it_once(ip, model, capsys):
    """``w = %sbs ...`` binds the widget as a line magic's result does; shown once, in the
    terminal as its summary line, whether the magic ends the cell or is assigned."""
    from onnx_sbs_nb.notebook.widget import SbsWidget

    ep, onx, x = model
    ip.user_ns.update(my_ep=ep, my_onx=onx, my_x=x)
    capsys.readouterr()
    ip.run_cell("w_bound = %sbs my_ep my_onx my_x --rerun", store_history=True)
    w = ip.user_ns["w_bound"]
    assert isinstance(w, SbsWidget) and w is ip.user_ns["_sbs"]
    assert w.session.state == "finished"  # shown, so run in the cell
    out = capsys.readouterr().out
    assert out.count("SbsWidget(finished") == 1, out
    assert "culprit" in out
    ip.run_cell("%sbs my_ep my_onx my_x", store_history=True)  # the cell's result
    out = capsys.readouterr().out
    assert out.count("SbsWidget(") == 1, out
    assert ip.user_ns["_"] is ip.user_ns["_sbs"]  # IPython displayed the returned widget
    ip.run_cell("%sbs my_ep my_onx my_x;", store_history=True)  # silenced result
    out = capsys.readouterr().out
    assert out.count("SbsWidget(") == 1, out  # the magic shows it itself


def test_file_paths_and_background(ip, model, tmp_path):
    ep, onx, x = model
    import onnx

    torch.export.save(ep, tmp_path / "m.pt2")
    onnx.save(onx, tmp_path / "m.onnx")
    torch.save(x, tmp_path / "in.pt")
    ip.run_line_magic(
        "sbs",
        f"{tmp_path / 'm.pt2'} {tmp_path / 'm.onnx'} {tmp_path / 'in.pt'} --background "
        "--runner reference",
    )
    w = ip.user_ns["_sbs"]
    assert w.session.background
    assert w.wait(120)
    assert w.session.state == "finished" and w.rows["n"] == len(w.session.records) > 0


def test_dotted_names(ip, model):
    ep, onx, x = model

    class Holder:
        pass

    h = Holder()
    h.ep, h.onx, h.x = ep, onx, x
    ip.user_ns["holder"] = h
    ip.run_line_magic("sbs", "holder.ep holder.onx holder.x -o w2")
    assert ip.user_ns["w2"].session.state == "finished"


@pytest.mark.parametrize(
    "line, message",
    [
        ("nope my_onx my_x", "neither a variable of the notebook nor an existing file"),
        ("my_ep", "the following arguments are required"),
        ("my_ep my_onx my_x --atol abc", "invalid float value"),
        ("my_ep my_onx my_x -o 1bad", "not a valid variable name"),
        ("my_ep my_onx my_x --reset a --reset-all", "not allowed with argument --reset"),
        ("my_ep my_onx 'unclosed", "cannot split"),
        ("my_ep.missing my_onx my_x", "has no attribute"),
    ],
)
def test_usage_errors(ip, model, line, message):
    from IPython.core.error import UsageError

    ep, onx, x = model
    ip.user_ns.update(my_ep=ep, my_onx=onx, my_x=x)
    with pytest.raises(UsageError, match=message):
        ip.run_line_magic("sbs", line)


def test_engine_input_errors_surface(ip, model):
    ep, onx, _ = model
    ip.user_ns.update(my_ep=ep, my_onx=onx, bad_x=(torch.randn(3, 8, dtype=torch.float64),))
    with pytest.raises(Exception, match="dtype"):
        ip.run_line_magic("sbs", "my_ep my_onx bad_x")
