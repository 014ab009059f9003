"""Issue 47: hostile files and broken runs, third pass (input folders, compare functions,
verdict policies, bundles, the notebook export, the diff).  Each test is one row of the
issue: the attack, and what must hold."""

from __future__ import annotations

import html.parser
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from onnx_sbs_nb import run_aligned

ROOT = Path(__file__).resolve().parents[1]


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def small():
    """A faithful export: its run passes."""
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ep = torch.export.export(Small(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    return ep, onx, (x,)


def _cli(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnx_sbs_nb", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)},
    )


# --------------------------------------------------------------- rows 1-2: notebook export
class _Active(html.parser.HTMLParser):
    """What in a page can run: inline scripts' text and event-handler / javascript: attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[str] = []
        self.handlers: list[tuple[str, str, str]] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        for name, value in attrs:
            v = "".join((value or "").split()).lower()
            if name.startswith("on") or v.startswith("javascript:"):
                self.handlers.append((tag, name, value or ""))
        self._in_script = tag == "script"

    def handle_endtag(self, tag):
        self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts.append(data)


def _hostile_notebook(small):
    import nbformat
    from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

    from onnx_sbs_nb.notebook_export import WIDGET_STATE_MIME, WIDGET_VIEW_MIME
    from onnx_sbs_nb.report_html import report_state

    ep, onx, x = small
    state = report_state(list(run_aligned(ep, onx, x)))
    state["_anywidget_id"] = "onnx_sbs_nb.widget.SbsWidget"
    # a sender's own front end, named so the old export took it for the package's bundle
    state["_esm"] = "export function renderStatic(el){ window.SENDER_ESM_RAN = 1 }"
    state["_css"] = "</style><script>window.SENDER_CSS_RAN=1</script>"
    view = new_output(
        "display_data",
        data={WIDGET_VIEW_MIME: {"model_id": "m1", "version_major": 2, "version_minor": 1}},
    )
    evil = new_output(
        "display_data",
        data={
            "text/html": '<img src="x" onerror="window.SENDER_HTML_RAN=1"><b>kept</b>'
            '<a href="javascript:window.SENDER_LINK=1">l</a><script>window.SENDER_S=1</script>',
            "text/plain": "x",
        },
    )
    js = new_output("display_data", data={"application/javascript": "window.SENDER_JS=1"})
    nb = new_notebook(
        cells=[
            new_markdown_cell('# t\n<img src=y onerror="window.SENDER_MD=1">'),
            new_code_cell("w", outputs=[view]),
            new_code_cell("h", outputs=[evil, js]),
        ]
    )
    nb.metadata["widgets"] = {
        WIDGET_STATE_MIME: {"version_major": 2, "version_minor": 0, "state": {"m1": {"state": state}}}
    }
    return nbformat.from_dict(nb)


def test_row1_row2_notebook_export_runs_none_of_the_senders_code(small):
    pytest.importorskip("nbconvert")
    from onnx_sbs_nb.notebook_export import notebook_html
    from onnx_sbs_nb.view_state import bundle_js

    result = notebook_html(_hostile_notebook(small))
    assert result.views == 1
    page = _Active()
    page.feed(result.html)
    active = "\n".join(page.scripts)
    # row 1: the installed bundle renders the view, never the state's _esm/_css
    assert "SENDER_ESM_RAN" not in result.html and "SENDER_CSS_RAN" not in result.html
    assert bundle_js()[:200] in result.html or "renderStatic" in active
    # row 2: the sender's HTML outputs and markdown are shown as an untrusted notebook is
    assert page.handlers == []
    for marker in ("SENDER_HTML_RAN", "SENDER_LINK", "SENDER_S", "SENDER_JS", "SENDER_MD"):
        assert marker not in active, marker
    assert "<b>kept</b>" in result.html  # formatting stays
