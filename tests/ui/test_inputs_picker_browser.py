"""The input picker of a widget over many inputs, in headless Chromium: the bundle renders
a live view over a stand-in for the anywidget model holding a real widget's state (a
real run over 16 inputs), the picker lists the inputs and marks the failing one, picking
one sets ``inputs.shown`` on the model, and the kernel's answer (that input's rows and
summary, computed by the real widget) redraws the table and the culprit card."""

from __future__ import annotations

import base64
import json
import os

import pytest
import torch

from onnx_sbs_nb import SbsWidget
from onnx_sbs_nb.reports import view_state
from tests.align.test_many_inputs import BAD_ABS, AbsThenLinear
from tests.models import export

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,
    pytest.mark.skipif(
        not view_state.BUNDLE_PATH.is_file() and not os.environ.get("CI"),
        reason="widget bundle not built (cd js && npm run build)",
    ),
]

# A stand-in for the anywidget model: get/set/on/off as the bundle uses them; set() from
# the view is recorded, window.kernel(state) plays the kernel's answer.
PAGE = """<!doctype html><html><head><meta charset="utf-8"></head><body>
<div id="app"></div>
<script type="text/plain" id="bundle">{bundle}</script>
<script type="application/json" id="state">{state}</script>
<script type="module">
const b64 = document.getElementById("bundle").textContent;
const code = new TextDecoder().decode(Uint8Array.from(atob(b64), (c) => c.charCodeAt(0)));
const mod = await import(URL.createObjectURL(new Blob([code], {{type: "text/javascript"}})));
const state = JSON.parse(document.getElementById("state").textContent);
const handlers = {{}};
window.sets = [];
const fire = (k) => (handlers["change:" + k] || []).forEach((cb) => cb());
const model = {{
  get: (k) => state[k],
  set: (k, v) => {{ state[k] = v; window.sets.push([k, v]); }},
  save_changes: () => {{}},
  send: () => {{}},
  on: (ev, cb) => (handlers[ev] ||= []).push(cb),
  off: (ev, cb) => (handlers[ev] = (handlers[ev] || []).filter((f) => f !== cb)),
}};
window.kernel = (next) => {{
  for (const [k, v] of Object.entries(next)) {{ state[k] = v; fire(k); }}
}};
mod.default.initialize({{ model }});
mod.default.render({{ model, el: document.getElementById("app"), experimental: null }});
window.ready = true;
</script></body></html>"""


def _state(w) -> dict:
    return {**w.state(), "inputs": w.inputs, "uid": "ab12"}


def test_picker_lists_inputs_and_shows_one(page, tmp_path):
    torch.manual_seed(0)
    ep, onx = export(AbsThenLinear(), (torch.rand(3, 8),))
    (node,) = [n for n in onx.graph.node if n.op_type == "Abs"]
    node.op_type = "Identity"  # wrong where x < 0: on one input only
    g = torch.Generator().manual_seed(2)
    xs = torch.rand(16, 3, 8, generator=g)
    xs[BAD_ABS, 1, 5] = -0.75
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xs), batch_size=None)
    w = SbsWidget(ep, onx, inputs=loader)
    w.wait()
    worst = _state(w)
    w.show_input(0)
    one = _state(w)
    html = PAGE.format(
        bundle=base64.b64encode(view_state.bundle_js().encode()).decode(),
        state=json.dumps(worst).replace("<", "\\u003c"),
    )
    path = tmp_path / "picker.html"
    path.write_text(html, encoding="utf-8")
    page.goto(path.as_uri())
    page.wait_for_function("window.ready === true")
    root = page.locator(".sbs-root")
    picker = root.locator("select.sbs-inputs")
    assert picker.is_visible()
    options = picker.locator("option").all_inner_texts()
    assert options[0] == "worst over 16 inputs (1 failing)"
    assert len(options) == 17 and "fails" in options[1 + BAD_ABS]
    assert sum("fails" in o for o in options) == 1
    assert root.locator(".sbs-status").inner_text().count("16/16 inputs") == 1
    card = root.locator(".sbs-card")
    assert f"on input {BAD_ABS}" in card.inner_text()
    # picking input 0 asks the kernel for it...
    picker.select_option("0")
    sets = page.evaluate("window.sets")
    assert ["inputs", {**worst["inputs"], "shown": 0}] in sets
    # ...whose answer redraws the view: input 0 passes
    page.evaluate("(s) => window.kernel(s)", {k: one[k] for k in ("rows", "summary", "inputs")})
    assert picker.input_value() == "0"
    root.locator(".sbs-card").filter(has_text="PASS").first.wait_for(timeout=10_000)
    assert page.js_errors == []
