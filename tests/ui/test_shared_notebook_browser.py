"""A shared notebook opened as a colleague opens it: a fresh JupyterLab, the executed
notebook copied in, never trusted.

JupyterLab renders an untrusted notebook's HTML through its sanitizer and draws no widget
from saved state, so what the reader gets is the widget's static summary.  It must read
well there: the verdict, the culprit and a readable table on the first screen, the chart
as an image the sanitizer keeps, and no text that only made sense inside an SVG (every
point's tooltip, inline, used to push the table off screen).  Both saves are checked:
JupyterLab's default (no widget state) and widget state saved.  Screenshots of each go to
test-artifacts/.
"""

from __future__ import annotations

import copy
import os
import re

import nbformat
import pytest

from onnx_sbs_nb.reports import view_state
from onnx_sbs_nb.reports.view_state import SHIM_ESM

from ..test_notebooks import execute
from .conftest import REPO

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not view_state.BUNDLE_PATH.is_file() and not os.environ.get("CI"),
        reason="widget bundle not built (cd js && npm run build)",
    ),
]


@pytest.fixture(scope="module")
def quickstart_executed(tmp_path_factory):
    """notebooks/01_quickstart.ipynb executed once, widget state stored (nbclient)."""
    mp = pytest.MonkeyPatch()
    path = os.environ.get("PYTHONPATH", "")
    mp.setenv("PYTHONPATH", str(REPO) + (os.pathsep + path if path else ""))
    try:
        work = tmp_path_factory.mktemp("quickstart")
        return execute(REPO / "notebooks" / "01_quickstart.ipynb", work)
    finally:
        mp.undo()


def _open_untrusted(lab, page, nb, name: str):
    path = lab.root / name
    nbformat.write(nb, path)  # written, not signed: JupyterLab treats it as untrusted
    page.goto(f"{lab.url}/lab/tree/{name}?token={lab.token}&reset")
    page.locator(".jp-Notebook").first.wait_for(timeout=120_000)
    fallback = page.locator(".jp-OutputArea-output .onnx-sbs-fallback")
    fallback.first.wait_for(timeout=60_000)
    return fallback


@pytest.mark.parametrize("saved_state", [False, True], ids=["lab-default-save", "state-saved"])
def test_untrusted_shared_notebook_reads_well(
    lab, page, artifacts, quickstart_executed, saved_state
):
    nb = copy.deepcopy(quickstart_executed)
    if not saved_state:
        nb.metadata.pop("widgets", None)
    else:
        assert "application/vnd.jupyter.widget-state+json" in nb.metadata.get("widgets", {})
    name = f"shared_{'state' if saved_state else 'default'}.ipynb"
    fallback = _open_untrusted(lab, page, nb, name)
    assert fallback.count() == 2  # one summary per widget (SbsWidget and %sbs), once each
    box = fallback.first
    box.scroll_into_view_if_needed()
    # untrusted: no widget drawn from the saved state, and the static summary is what shows
    assert page.locator(".sbs-root").count() == 0
    area = box.locator("xpath=ancestor::div[contains(@class,'jp-OutputArea')][1]")
    text = area.inner_text()
    # nothing that belonged inside a chart, no wall of text: a chart made every node's
    # tooltip a line here (hundreds of "val_.. (Op) err" strings)
    assert "err_abs per node (log10)" not in text
    values = re.findall(r"\bval_\d+\b", text)
    assert len(values) <= 40, (len(values), text[:2000])
    assert len(text) < 4000, len(text)
    # the first screen a colleague sees of it: the summary's top at the window's top
    box.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(artifacts / f"shared_untrusted_{name[:-6]}.png"))

    # the answer first, then the culprit, then a readable table, on the first screen
    top = box.bounding_box()["y"]
    screen = page.viewport_size["height"]
    head = box.locator("div").first
    assert "verdict: FAIL" in head.inner_text() and "of which" in head.inner_text()
    culprit = box.locator(".onnx-sbs-culprit")
    assert "gelu" in culprit.inner_text()
    first_row = box.locator(".onnx-sbs-worst tbody tr").first
    assert "gelu" in first_row.inner_text()  # the culprit's row leads the table
    row_box = first_row.bounding_box()
    assert row_box["y"] + row_box["height"] - top < screen, (top, row_box, screen)
    # the table is legible: its cells are not squeezed into a column of letters
    assert box.locator(".onnx-sbs-worst").bounding_box()["width"] > 400
    # the chart survived the sanitizer as an image that decodes
    img = box.locator(".onnx-sbs-chart img")
    assert img.count() == 1
    assert img.evaluate("i => i.complete && i.naturalWidth") > 0
    assert box.locator("svg").count() == 0
    img.scroll_into_view_if_needed()
    page.screenshot(path=str(artifacts / f"shared_untrusted_{name[:-6]}_chart.png"))
    assert page.js_errors == []
    if saved_state:
        # one copy of the JS bundle in the notebook, however many widgets it holds
        states = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
        esms = [v["state"].get("_esm", "") for v in states.values()]
        bundle = view_state.bundle_js()
        assert sum(e == bundle for e in esms) == 1 and sum(e == SHIM_ESM for e in esms) == 1
        assert len(nbformat.writes(nb)) < 1.5 * len(bundle)
        _trust(page)
        # trusted, the saved state draws the interactive view without a kernel run, and
        # it hides the static summary
        view = page.locator(".sbs-root").first
        view.wait_for(timeout=60_000)
        view.locator(".sbs-card.sbs-card-fail .sbs-culprit").wait_for(timeout=60_000)
        assert "gelu" in view.locator(".sbs-card .sbs-culprit").inner_text()
        # both widgets draw: the one carrying the bundle and the one waiting for it
        page.locator(".sbs-root").nth(1).wait_for(timeout=60_000)
        assert page.locator(".sbs-root").count() == 2
        page.locator(".onnx-sbs-fallback:visible").first.wait_for(state="detached", timeout=5000)
        assert page.locator(".onnx-sbs-fallback:visible").count() == 0
        view.scroll_into_view_if_needed()
        page.screenshot(path=str(artifacts / "shared_trusted_state.png"))
        assert page.js_errors == []


def _trust(page) -> None:
    """Trust the notebook as a reader does: the command palette's "Trust Notebook"."""
    page.locator(".jp-Notebook").first.click(position={"x": 5, "y": 5})
    page.keyboard.press("Control+Shift+C")
    palette = page.locator(".lm-CommandPalette-input")
    palette.wait_for()
    palette.fill("Trust Notebook")
    page.locator(".lm-CommandPalette-item", has_text="Trust Notebook").first.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=10_000)
    dialog.locator(".jp-Dialog-button.jp-mod-accept").click()
    dialog.wait_for(state="detached")
