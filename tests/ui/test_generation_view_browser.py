"""The generation parity view in headless Chromium (issue 51, item 4): a real generation
parity run (a tiny Llama exported with its cache, a fault planted in the cache its ONNX
model writes) viewed by a real widget, whose state the bundle renders live (over a
stand-in for the anywidget model, as test_inputs_picker_browser.py) and in the saved HTML
report: the two token streams, the parting step marked with its margin, and one click on
it selects that step's node-by-node records in the table.  Tokens come from a decoder
that returns markup: they show as text, never as elements."""

from __future__ import annotations

import base64
import json
import os

import pytest

from onnx_sbs_nb.reports import view_state

from .conftest import ARTIFACTS
from .test_inputs_picker_browser import PAGE

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not view_state.BUNDLE_PATH.is_file() and not os.environ.get("CI"),
        reason="widget bundle not built (cd js && npm run build)",
    ),
]

HOSTILE = '<img src=x onerror="window.pwned=1">'


def _decode(token: int) -> str:
    # untrusted text, as a tokenizer's can be: markup, spaces, a newline
    return f"{HOSTILE}{token}" if token % 2 else f" w{token}\n"


@pytest.fixture(scope="module")
def widget():
    pytest.importorskip("transformers")
    from onnx_sbs_nb import SbsWidget, generation_parity

    from ..corpus.cache_decoders import export_case, scaled_cache_output

    case = export_case("dynamic_cache", "dynamic")
    onx = scaled_cache_output(case.onx, 1.5)  # the cache written 1.5 times too large
    parity = generation_parity(case.ep, onx, case.kwargs(), steps=6)
    w = SbsWidget(records=parity, decode=_decode)
    w.wait()
    return w


def _check_streams(page, root, tl) -> None:
    streams = root.locator(".sbs-streams")
    streams.wait_for()
    assert "part at step 0 of 6" in streams.locator(".sbs-streams-verdict").inner_text()
    assert "margin between torch's two best logits" in streams.inner_text()
    labels = streams.locator(".sbs-stream-label").all_inner_texts()
    assert labels[:2] == ["torch · row 0", "ONNX model · row 0"] and len(labels) == 4
    # every step of both streams, decoded, as text
    first = streams.locator(".sbs-tok[data-side='0'][data-step='0']").first
    expected = tl["sides"][0]["text"][0][0].replace("\n", "⏎").replace(" ", "·")
    assert first.inner_text() == expected
    assert streams.locator(".sbs-tok").count() == 2 * 2 * 6
    assert streams.locator("img").count() == 0 and page.evaluate("window.pwned") is None
    # the parting step, marked in both streams of each row, its margin on hover
    parted = streams.locator("button.sbs-tok-parted")
    assert parted.count() == 4
    title = parted.first.get_attribute("title")
    assert "margin between torch's two best logits" in title and "the decodes part here" in title
    # the tokens that differ between the two sides are marked, both of each pair
    torch_rows, onnx_rows = (side["tokens"] for side in tl["sides"])
    differ = sum(a != b for t, o in zip(torch_rows, onnx_rows) for a, b in zip(t, o))
    assert differ and streams.locator(".sbs-tok-diff").count() == 2 * differ


def _check_click_shows_records(root, tl) -> None:
    assert root.locator(".sbs-tr.sbs-sel").count() == 0
    root.locator(".sbs-streams button.sbs-tok-parted").first.click()
    shown = root.locator(".sbs-streams-shown")
    shown.wait_for()
    assert (
        f"step 0 compared node by node on torch's inputs and cache ({tl['records']} records)"
        in shown.inner_text()
    )
    # that step's records are the table's: its culprit is selected there
    sel = root.locator(".sbs-tr.sbs-sel")
    sel.wait_for()
    assert sel.count() == 1 and "sbs-fail" in sel.get_attribute("class")
    assert root.locator(".sbs-nrows").inner_text() == f"{tl['records']} records"


def test_the_token_streams_the_parting_step_and_its_records(widget, page, tmp_path):
    w = widget
    tl = w.timeline
    assert tl["parted_at"] == 0 and tl["records_step"] == 0
    state = {**w.state(), "uid": "ab12"}
    html = PAGE.format(
        bundle=base64.b64encode(view_state.bundle_js().encode()).decode(),
        state=json.dumps(state).replace("<", "\\u003c"),
    )
    path = tmp_path / "generation.html"
    path.write_text(html, encoding="utf-8")
    page.goto(path.as_uri())
    page.wait_for_function("window.ready === true")
    root = page.locator(".sbs-root")
    _check_streams(page, root, tl)
    _check_click_shows_records(root, tl)
    assert any(k == "selected" and v >= 0 for k, v in page.evaluate("window.sets"))
    ARTIFACTS.mkdir(exist_ok=True)
    root.locator(".sbs-streams").screenshot(path=str(ARTIFACTS / "generation-streams.png"))
    assert page.js_errors == []

    # the saved report draws the same view, offline, and the button links the same way
    report = w.save_html(tmp_path / "report.html")
    page.goto(report.as_uri())
    root = page.locator(".sbs-root")
    _check_streams(page, root, tl)
    root.locator(".sbs-streams-show").click()
    root.locator(".sbs-streams-shown").wait_for()
    assert root.locator(".sbs-tr.sbs-sel").count() == 1
    assert page.js_errors == []
