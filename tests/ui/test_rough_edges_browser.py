"""The rough edges of the front end (issue 48), in a real browser.

- A received executed notebook, trusted, with a kernel: the view drawn from its saved
  widget state has no run behind it.  It says so and offers no button that would wait
  for a kernel that never answers (it used to show "save_culprit: working..." for
  minutes, every button disabled).
- The answer card of a run without own-error reruns says "error", not "own error".

Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import copy
import os

import pytest

from onnx_sbs_nb.reports import view_state

from .test_shared_notebook_browser import _open_untrusted, _trust, quickstart_executed  # noqa: F401
from .test_widget_browser import _accept_kernel_dialog

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not view_state.BUNDLE_PATH.is_file() and not os.environ.get("CI"),
        reason="widget bundle not built (cd js && npm run build)",
    ),
]


def test_a_received_notebook_says_it_has_no_run_and_never_locks(
    lab,
    page,
    artifacts,
    quickstart_executed,  # noqa: F811
):
    nb = copy.deepcopy(quickstart_executed)
    assert "application/vnd.jupyter.widget-state+json" in nb.metadata.get("widgets", {})
    fallback = _open_untrusted(lab, page, nb, "received.ipynb")
    fallback.first.scroll_into_view_if_needed()
    # the kernel started (the notebook's own): what a reader with a kernel has
    page.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']").first.wait_for(
        state="attached", timeout=120_000
    )
    _accept_kernel_dialog(page)
    for attempt in range(3):  # a busy machine can drop the first keys on a fresh page
        try:
            _trust(page)  # trusted: the saved state draws the views; the kernel has none
            break
        except Exception:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")
    view = page.locator(".sbs-root").first
    view.wait_for(timeout=60_000)
    note = view.locator(".sbs-detached")
    note.wait_for(state="visible", timeout=30_000)
    assert "run its cell again" in note.inner_text()
    # no button that waits for an answer is offered
    for cls in ("sbs-btn-culprit", "sbs-btn-export", "sbs-btn-stop", "sbs-btn-cuda"):
        assert not view.locator(f".{cls}").is_visible(), cls
    # the table, the card and the detail still work: select the culprit from the card
    view.locator(".sbs-card .sbs-culprit").first.click()
    view.locator(".sbs-detail").wait_for()
    assert view.locator(".sbs-node-actions").count() == 0
    # no detail "loading" that would wait for the kernel forever
    assert view.locator(".sbs-loading").count() == 0
    assert "working" not in view.locator(".sbs-toolbar").inner_text()
    view.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(artifacts / "received_notebook_no_run.png"))
    # 1500x1000, the view's top at the top of the notebook: the table's first rows are on
    # the first screen (the layer tree starts closed: open, it left them below)
    assert view.locator(".sbs-layers").evaluate("e => e.open") is False
    screen = page.viewport_size["height"]
    rows = view.locator(".sbs-tr")
    rows.nth(2).wait_for()
    third = rows.nth(2).bounding_box()
    assert third["y"] + third["height"] <= screen, (third, screen)
    assert page.js_errors == []


def test_the_static_table_fits_800_px(lab, page, artifacts, quickstart_executed):  # noqa: F811
    page.set_viewport_size({"width": 800, "height": 1000})
    nb = copy.deepcopy(quickstart_executed)
    fallback = _open_untrusted(lab, page, nb, "narrow.ipynb")
    box = fallback.first
    box.evaluate("e => e.scrollIntoView({block: 'start'})")
    table = box.locator(".onnx-sbs-worst")
    # the error and verdict columns are inside the output that holds the table (no
    # sideways scroll to reach them), in the window, for the header and the culprit's row
    area_right = table.evaluate(
        "t => (t.closest('.jp-OutputArea-output') || t.parentElement).getBoundingClientRect().right"
    )
    heads = table.locator("th")
    labels = [heads.nth(k).inner_text() for k in range(heads.count())]
    first = table.locator("tbody tr").first.locator("td")
    assert "gelu" in first.nth(labels.index("fx node")).inner_text()
    for label in ("abs error", "verdict"):
        k = labels.index(label)
        for cell in (heads.nth(k).bounding_box(), first.nth(k).bounding_box()):
            assert cell["x"] + cell["width"] <= min(area_right, 800) + 1, (label, cell)
    page.screenshot(path=str(artifacts / "static_table_800px.png"))
    assert page.js_errors == []


def test_the_answer_card_says_error_without_an_own_error_run(page, tmp_path, artifacts):
    """A run without own-error reruns: the card's label is "error"; with them, "own
    error" (the HTML report renders the widget's own card, offline).  A comparison of two
    ONNX models counts "nodes of the reference model", not torch nodes."""
    import warnings

    import onnx
    import torch

    from onnx_sbs_nb import AlignedRun, run_aligned_onnx, summarize
    from onnx_sbs_nb.reports.html import write_report_html

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 4))
    x = torch.randn(3, 6)
    ep = torch.export.export(model.eval(), (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    good = onnx.ModelProto()
    good.CopyFrom(onx)
    next(n for n in onx.graph.node if n.op_type == "Tanh").op_type = "Sigmoid"
    for own in (False, True):
        records = list(AlignedRun(ep, onx, (x,), own_error=own))
        path = tmp_path / f"own_{own}.html"
        write_report_html(records, path, summary=summarize(records), title="card")
        page.goto(path.as_uri())
        card = page.locator(".sbs-root .sbs-card.sbs-card-fail")
        card.wait_for(timeout=30_000)
        labels = card.locator(".sbs-card-grid > .sbs-muted").all_text_contents()
        assert ("own error" in labels) is own and ("error" in labels) is not own, labels
        page.screenshot(path=str(artifacts / f"answer_card_own_{own}.png"))
        assert "torch nodes" in card.locator(".sbs-card-coverage").inner_text()
    # two ONNX models (onnx-sbs diff): the coverage counts the reference's nodes as such
    records = list(run_aligned_onnx(good, onx, (x,)))
    path = tmp_path / "diff.html"
    write_report_html(records, path, summary=summarize(records), title="diff")
    page.goto(path.as_uri())
    coverage = page.locator(".sbs-root .sbs-card .sbs-card-coverage")
    coverage.wait_for(timeout=30_000)
    text = coverage.inner_text()
    assert "nodes of the reference model" in text and "torch" not in text, text
    assert page.js_errors == []
