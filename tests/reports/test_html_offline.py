"""The self-contained HTML report in headless Chromium with the network blocked.

A real run of the demo model whose ONNX value names were replaced by markup: the report
must show it as text, fire no dialog and load nothing from the network.  A real run of a
tiny Llama with one wrong activation: at 1500 px and 800 px, in the light and the dark
scheme, the culprit card, the layers, the graph around a node and the layout hold
(element geometry); screenshots go to test-artifacts/.
"""

from __future__ import annotations

import os
import pathlib

import pytest

from onnx_sbs_nb.records import Record

from ..browser import CHROMIUM, GEOMETRY_JS, check_layout, launch

EVIL = "<img src=x onerror=alert(1)>"

# true once every row the table shows belongs to layer ``group`` (and one does)
SHOWS_ONLY_GROUP_JS = """(group) => {
    const mods = [...document.querySelectorAll(".sbs-root .sbs-tr .sbs-module")].filter((e) => {
        const r = e.getBoundingClientRect();
        return r.width > 0 && r.height > 0;
    }).map((e) => e.textContent);
    return mods.length > 0 && mods.every((m) => m === group || m.startsWith(group + "."));
}"""

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM), reason="needs Debian's chromium at /usr/bin/chromium"
)


def rename_value(onx, old: str, new: str) -> None:
    """Renames an ONNX value everywhere it appears (a hostile but valid model)."""
    for node in onx.graph.node:
        node.input[:] = [new if i == old else i for i in node.input]
        node.output[:] = [new if o == old else o for o in node.output]
        if old in node.name:
            node.name = new


@pytest.fixture(scope="module")
def evil_records() -> list[Record]:
    from onnx_sbs_nb.align.run import run_aligned
    from onnx_sbs_nb.cli.demo import build_demo

    case = build_demo()
    rename_value(case.onx, "gelu", EVIL)
    recs = list(run_aligned(case.ep, case.onx, case.args, own_error=True))
    assert any(r.onnx_name == EVIL for r in recs), [r.onnx_name for r in recs]
    return recs


@pytest.fixture(scope="module")
def report_file(evil_records, tmp_path_factory) -> pathlib.Path:
    from onnx_sbs_nb.reports.report import write_report

    return write_report(evil_records, tmp_path_factory.mktemp("html") / f"{EVIL[:4]}r.html")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = launch(pw)
        yield b
        b.close()


class Page:
    """A page with the network blocked that records dialogs, errors and outside requests."""

    def __init__(self, browser, javascript: bool = True, **options) -> None:
        self.context = browser.new_context(java_script_enabled=javascript, **options)
        self.page = self.context.new_page()
        self.dialogs: list[str] = []
        self.errors: list[str] = []
        self.blocked: list[str] = []
        self.page.on("dialog", self._dialog)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.route("**/*", self._route)

    def _dialog(self, d) -> None:
        self.dialogs.append(d.message)
        d.dismiss()

    def _route(self, route) -> None:
        url = route.request.url
        if url.startswith(("file:", "blob:", "data:")):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def close(self) -> None:
        self.context.close()


def test_report_renders_offline(report_file, evil_records, browser):
    p = Page(browser)
    try:
        page = p.page
        page.goto(report_file.as_uri())
        page.wait_for_selector(".sbs-root .sbs-tr", timeout=20000)
        # the red count says how many only inherit their error, as the terminal does
        # (a failing graph output that only carries its error counts among them)
        inherit = sum(r.inherits for r in evil_records)
        failed = sum(r.failed for r in evil_records)
        assert inherit > sum(r.drifted for r in evil_records) > 0
        assert page.locator(".sbs-status .sbs-failing").inner_text() == (
            f"{failed} failing, of which {inherit} only inherit their error"
        )
        rows = page.locator(".sbs-tr")
        assert rows.count() > 5
        artifacts = pathlib.Path(__file__).resolve().parents[2] / "test-artifacts"
        artifacts.mkdir(exist_ok=True)
        page.set_viewport_size({"width": 1500, "height": 1000})
        page.screenshot(path=str(artifacts / "shared_html_report.png"))
        # summary: the answer names the broken LayerNormalization's value
        status = page.locator(".sbs-status").inner_text()
        assert "layer_norm" in status, status
        # the chart is drawn (plotly, inlined)
        page.wait_for_selector(".sbs-chart .main-svg", timeout=20000)
        assert page.locator(".sbs-chart .main-svg").count() >= 1
        # the hostile name is text, not markup
        assert EVIL in page.locator(".sbs-table").inner_text()
        assert page.locator("img[src='x']").count() == 0
        # filters narrow the table
        page.fill(".sbs-f-text", "layer_norm")
        page.wait_for_function(
            "() => !document.querySelector('.sbs-tbody').innerText.includes('softmax')",
            timeout=10000,
        )
        assert "layer_norm" in page.locator(".sbs-tbody").inner_text()
        # the script-free fallback made way for the interactive view
        assert page.locator(".onnx-sbs-fallback").count() == 0
        page.wait_for_timeout(200)  # let a late onerror fire, if one were to
        assert p.dialogs == [] and p.errors == [] and p.blocked == []
    finally:
        p.close()


def _x_ticks(page) -> list[str]:
    return [t for t in page.locator(".sbs-chart .xtick text").all_text_contents() if t]


def test_zoomed_chart_ticks_only_whole_nodes(report_file, browser):
    """Zoomed in on a few nodes, the x axis labels nodes, never node 2.5; the zoom
    survives a redraw (a resize); a double click gives plotly its own ticks back."""
    p = Page(browser, viewport={"width": 1200, "height": 900})
    try:
        page = p.page
        page.goto(report_file.as_uri())
        page.wait_for_selector(".sbs-chart .main-svg", timeout=20000)
        page.wait_for_timeout(700)  # the chart settles at its container's width
        wide = _x_ticks(page)
        box = page.locator(".sbs-chart .nsewdrag").first.bounding_box()
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * 0.20, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.60, y + 2, steps=5)
        page.mouse.up()
        page.wait_for_function(
            "(before) => [...document.querySelectorAll('.sbs-chart .xtick text')]"
            ".map((e) => e.textContent).join() !== before",
            arg=",".join(wide),
            timeout=10000,
        )
        page.wait_for_timeout(300)
        zoomed = _x_ticks(page)
        assert zoomed and all(t.lstrip("−-").isdigit() for t in zoomed), zoomed
        assert 2 <= len(zoomed) <= 4 and len(set(zoomed)) == len(zoomed), zoomed
        page.set_viewport_size({"width": 1000, "height": 900})
        page.wait_for_timeout(900)  # resized and redrawn (throttled)
        assert _x_ticks(page) == zoomed
        page.locator(".sbs-chart .nsewdrag").first.dblclick(
            position={"x": box["width"] * 0.5, "y": box["height"] * 0.5}
        )
        page.wait_for_timeout(500)
        again = _x_ticks(page)
        assert len(again) > len(zoomed) and all(t.isdigit() for t in again), again
        assert p.errors == [] and p.blocked == []
    finally:
        p.close()


def test_report_without_javascript_shows_the_fallback(report_file, browser):
    p = Page(browser, javascript=False)
    try:
        page = p.page
        page.goto(report_file.as_uri())
        fallback = page.locator(".onnx-sbs-fallback")
        assert fallback.is_visible()
        text = fallback.inner_text()
        assert "verdict: FAIL" in text and EVIL in text and "layer_norm" in text
        chart = page.locator(".onnx-sbs-fallback .onnx-sbs-chart img")
        assert chart.count() == 1 and chart.evaluate("i => i.complete && i.naturalWidth") > 0
        assert page.locator(".onnx-sbs-fallback svg").count() == 0
        # the one image is the chart: the hostile name's img is text
        assert page.locator("img:not([src^='data:image/png;base64,'])").count() == 0
        assert p.dialogs == [] and p.blocked == []
    finally:
        p.close()


def test_report_is_one_file_with_nothing_external(report_file):
    text = report_file.read_text(encoding="utf-8")
    assert "<img src=x" not in text
    # scripts and styles only: plotly's bundle holds a plain link to its site
    for marker in ('src="http', "src='http", "<link", "import('http", 'import("http'):
        assert marker not in text
    assert text.count("renderStatic") >= 1


def test_large_report_is_compressed_and_renders(browser, tmp_path):
    """20,000 rows: the state is gzipped in the file and inflated by the browser."""
    from onnx_sbs_nb.reports.html import load_bundle, script_json
    from onnx_sbs_nb.reports.report import write_report
    from onnx_sbs_nb.reports.view_state import widget_state

    ops = ["MatMul", "Add", "Mul", "Softmax", "Reshape"]
    recs = [
        Record(
            step=i,
            ep_id_node=i,
            onnx_id_node=i,
            ep_name=f"fx_node_{i}",
            onnx_name=f"val_{i}" if i != 12345 else EVIL,
            ep_target="aten.mm.default",
            onnx_op_type=ops[i % 5],
            ep_shape_type="float32[2x64x64]",
            onnx_shape_type="float32[2x64x64]",
            err_abs=1e-7 * (1 + i % 13),
            err_rel=1e-6,
            passed=True,
            atol=1e-4,
            rtol=1e-4,
            paired_by="name",
        )
        for i in range(20000)
    ]
    path = write_report(recs, tmp_path / "big.html")
    text = path.read_text(encoding="utf-8")
    plain = len(script_json(widget_state(recs)))  # already columns: half of per-row JSON
    assert 'data-encoding="gzip+base64"' in text
    state_size = len(text) - len(load_bundle())
    assert state_size < plain / 2, (state_size, plain)
    p = Page(browser)
    try:
        p.page.goto(path.as_uri())
        p.page.wait_for_selector(".sbs-root .sbs-tr", timeout=30000)
        assert "20000" in p.page.locator(".sbs-count").inner_text().replace(",", "")
        p.page.fill(".sbs-f-text", "onerror")
        p.page.wait_for_function(
            "() => document.querySelector('.sbs-tbody').innerText.includes('onerror=alert')",
            timeout=10000,
        )
        assert p.page.locator("img").count() == 0
        assert p.dialogs == [] and p.errors == [] and p.blocked == []
    finally:
        p.close()


@pytest.fixture(scope="module")
def llama_report(tmp_path_factory):
    """The report of a tiny Llama whose second MLP activation is wrong (its Sigmoid made a
    HardSigmoid), with the ONNX graph; returns (path, culprit)."""
    import onnx

    from onnx_sbs_nb.align.run import run_aligned
    from onnx_sbs_nb.reports.html import (
        fallback_html,
        load_bundle,
        page_html,
        report_state,
        view_html,
    )

    from ..models import tiny_llama

    ep, onx, args = tiny_llama()  # cached: the engine tests export the same one
    onx = onnx.ModelProto.FromString(onx.SerializeToString())
    [n for n in onx.graph.node if n.op_type == "Sigmoid"][1].op_type = "HardSigmoid"
    recs = list(run_aligned(ep, onx, args, own_error=True))
    state = report_state(recs, model=onx)
    body = view_html(state, "onnx-sbs-state-0", fallback_html(recs, state["summary"]))
    path = tmp_path_factory.mktemp("llama") / "llama.html"
    path.write_text(page_html("tiny Llama", body, load_bundle()), encoding="utf-8")
    return path, state["summary"]["culprit"]


@pytest.mark.parametrize("width", [1500, 800])
def test_report_layout_culprit_layers_and_graph(llama_report, browser, width):
    """Any width, either scheme: the answer first (with its module path), error columns
    in view, computed nodes first, a usable chart, exact zeros on their own line, layers
    that filter the table, a graph whose nodes move the selection."""
    from ..ui.conftest import ARTIFACTS

    path, culprit = llama_report
    module = culprit["ep_module"]
    assert module and module.endswith("layers.1.mlp.act_fn"), culprit
    ARTIFACTS.mkdir(exist_ok=True)
    for scheme in ("light", "dark"):
        p = Page(browser, viewport={"width": width, "height": 1000}, color_scheme=scheme)
        try:
            page = p.page
            page.goto(path.as_uri())
            root = page.locator(".sbs-root")
            root.locator(".sbs-chart .main-svg").first.wait_for(timeout=30000)
            card = root.locator(".sbs-card.sbs-card-fail")
            name = culprit["ep_user_name"] or culprit["ep_name"]
            assert card.locator(".sbs-culprit").inner_text() == name
            assert card.locator(".sbs-card-module").inner_text() == module
            assert "own error" in card.inner_text() and culprit["why"] in card.inner_text()
            page.wait_for_timeout(700)  # the chart settles at its container's width
            check_layout(root.evaluate(GEOMETRY_JS), dark=scheme == "dark")

            # exact zeros: a strip labelled 0 under the log axis, not a point at 1e-12
            assert "0" in root.locator(".sbs-chart .y2tick text").all_text_contents()
            # the culprit is one click away, and its neighbourhood moves the selection
            card.locator(".sbs-culprit").click()
            assert root.locator(".sbs-detail-name").inner_text() == name
            link = root.locator(".sbs-around .sbs-g-link").first
            row = link.get_attribute("data-row")
            link.click()
            root.locator(f".sbs-tr.sbs-sel[data-row='{row}']").wait_for()
            assert root.locator(".sbs-detail-title").inner_text().startswith(f"#{row} ")
            # error by layer (closed at first, so the table starts on the first screen):
            # opened, the culprit's layer is in view; a click filters the table
            root.locator(".sbs-layers > summary").click()
            layer = root.locator(".sbs-lrow.sbs-lfocus.sbs-lfail .sbs-lgroup").last
            assert layer.is_visible()
            layer.click()
            group = root.locator(".sbs-chip-name").inner_text()
            assert module.startswith(group) and "layers.1" in group, group
            # the table redraws on the next animation frame (and the count reads "n of m"
            # before the click already: weights are hidden): wait for the filtered rows
            page.wait_for_function(SHOWS_ONLY_GROUP_JS, arg=group, timeout=15000)
            mods = root.locator(".sbs-tr:visible .sbs-module").all_text_contents()
            assert mods and all(m == group or m.startswith(f"{group}.") for m in mods), mods
            root.locator(".sbs-chip-x").click()
            root.locator(".sbs-chip").wait_for(state="hidden")
            assert root.locator(".sbs-lsel").count() == 0
            card.locator(".sbs-culprit").click()
            page.screenshot(path=str(ARTIFACTS / f"report_{width}_{scheme}.png"), full_page=True)
            assert p.dialogs == [] and p.errors == [] and p.blocked == []
        finally:
            p.close()


def test_report_of_a_drifting_faithful_export_passes_and_says_why(browser, tmp_path):
    """Values beyond tolerance that no node makes (rounding a cancellation amplifies):
    the report's card says PASS and why, with JavaScript and without."""
    from onnx_sbs_nb.reports.report import write_report

    from ..models import cancellation_run

    records, _ = cancellation_run(contract=True)
    assert any(r.drifted for r in records)
    path = write_report(records, tmp_path / "drift.html")
    p = Page(browser)
    try:
        p.page.goto(path.as_uri())
        card = p.page.locator(".sbs-card.sbs-card-pass")
        card.wait_for(timeout=20000)
        text = card.inner_text()
        assert "the outputs agree" in text and "drift beyond tolerance" in text, text
        assert p.errors == [] and p.blocked == []
    finally:
        p.close()
    assert "verdict: PASS" in path.read_text() and "drift:" in path.read_text()


def test_running_view_names_the_culprit_so_far(evil_records, browser, tmp_path):
    """A view of a run still going (what the live widget shows mid-run) names the culprit
    so far in its card, with the run's progress, as soon as the culprit's record is in."""
    from onnx_sbs_nb.align.blame.summary import summarize
    from onnx_sbs_nb.reports.html import report_html

    culprit = summarize(evil_records).culprit
    k = next(i for i, r in enumerate(evil_records) if r.step == culprit.step) + 2
    recs = evil_records[:k]
    status = {"state": "running", "done_onnx_nodes": 5, "total_onnx_nodes": 40}
    path = tmp_path / "running.html"
    path.write_text(report_html(recs, summarize(recs), status=status), encoding="utf-8")
    p = Page(browser)
    try:
        page = p.page
        page.goto(path.as_uri())
        card = page.locator(".sbs-card")
        card.wait_for(timeout=20000)
        assert "culprit so far" in card.locator(".sbs-card-label").inner_text()
        assert "5 of 40 ONNX nodes" in card.locator(".sbs-card-label").inner_text()
        assert "layer_norm" in card.locator(".sbs-culprit").inner_text()
        assert card.locator(".sbs-verdict").inner_text() == "RUNNING"
        assert p.errors == []
    finally:
        p.close()


def test_restored_detail_keeps_its_columns_and_says_each_field_once(browser, tmp_path):
    """A notebook saved with the detail of a node (its node detail and a rerun) comes back
    with its JSON keys sorted (nbformat): the tables keep their columns in order, and the
    node's id shows once, not in the node section and again under the rerun."""
    import json as json_

    from onnx_sbs_nb.cli.demo import build_demo
    from onnx_sbs_nb.notebook.session import SbsSession
    from onnx_sbs_nb.reports.html import (
        fallback_html,
        load_bundle,
        page_html,
        report_state,
        view_html,
    )

    case = build_demo()
    s = SbsSession(case.ep, case.onx, case.args, own_error=True, batch_interval=0).start()
    row, rec = next((i, r) for i, r in enumerate(s.records) if r.onnx_op_type == "Gelu")
    details = {"row": row, "node": s.node_detail(rec), "rerun": s.rerun_in_torch(rec)}
    restored = json_.loads(json_.dumps(jsonable_(details), sort_keys=True))
    state = report_state(s.records, s.summary, model=case.onx)
    state.update(selected=row, details=restored)
    body = view_html(state, "onnx-sbs-state-0", fallback_html(s.records, s.summary))
    path = tmp_path / "restored.html"
    path.write_text(page_html("restored", body, load_bundle()), encoding="utf-8")
    p = Page(browser)
    try:
        page = p.page
        page.goto(path.as_uri())
        detail = page.locator(".sbs-detail")
        detail.locator(".sbs-node").wait_for(timeout=20000)
        heads = detail.locator(".sbs-node .sbs-mini").first.locator("th").all_inner_texts()
        assert heads[:3] == ["value", "torch partner", "paired by"], heads
        heads = detail.locator(".sbs-rerun .sbs-mini").first.locator("th").all_inner_texts()
        assert heads[:3] == ["value", "torch partner", "shape"], heads
        labels = detail.locator(".sbs-dt").all_inner_texts()
        assert labels.count("onnx_id_node") == 1, labels
        assert p.errors == []
    finally:
        p.close()


def jsonable_(obj):
    from onnx_sbs_nb.reports.view_state import jsonable

    return jsonable(obj)


@pytest.mark.parametrize("width", [500, 600, 800])
def test_chart_toolbar_never_sits_on_the_legend(report_file, browser, width):
    """The chart as narrow as an 800 px JupyterLab with its file browser open makes it:
    plotly's toolbar (shown on hover) and the legend do not overlap."""
    p = Page(browser, viewport={"width": width, "height": 900})
    try:
        page = p.page
        page.goto(report_file.as_uri())
        chart = page.locator(".sbs-chart").first
        chart.locator(".main-svg").first.wait_for(timeout=20000)
        page.wait_for_timeout(500)  # the chart settles at its container's width
        chart.hover()
        bar = chart.locator(".modebar").first.bounding_box()
        legend = chart.locator(".legend").first.bounding_box()
        assert bar and legend
        apart = (
            bar["x"] >= legend["x"] + legend["width"]
            or legend["x"] >= bar["x"] + bar["width"]
            or bar["y"] >= legend["y"] + legend["height"]
            or legend["y"] >= bar["y"] + bar["height"]
        )
        assert apart, (width, bar, legend)
    finally:
        p.close()


def test_a_pass_over_little_of_the_model_says_how_much_was_compared(browser, tmp_path):
    """A run that compared 1 of 10 ONNX nodes: the card's badge reads "PASS on 1 of 10
    ONNX nodes" and a line says what was compared and why the rest was not, with
    JavaScript and in the no-script fallback."""
    from onnx_sbs_nb.align.blame.summary import summarize
    from onnx_sbs_nb.reports.report import write_report

    records = [
        Record(step=0, status="ok", onnx_name="a", onnx_node_name="n_a", ep_name="a",
               ep_target="aten.add.Tensor", passed=True, err_abs=0.0)
    ] + [
        Record(step=k, status="unpaired_onnx", onnx_name=f"v{k}", onnx_node_name=f"n_v{k}")
        for k in range(1, 10)
    ]  # fmt: skip
    summary = summarize(records)
    assert summary.partial
    path = write_report(records, tmp_path / "partial.html", summary)
    p = Page(browser)
    try:
        p.page.goto(path.as_uri())
        card = p.page.locator(".sbs-card.sbs-card-pass")
        card.wait_for(timeout=20000)
        badge = card.locator(".sbs-verdict").inner_text()
        assert badge == "PASS on 1 of 10 ONNX nodes", badge
        line = card.locator(".sbs-card-coverage").inner_text()
        assert "1 of 10 ONNX nodes compared" in line and "9 no torch twin" in line, line
        assert p.errors == [] and p.blocked == []
    finally:
        p.close()
    html_text = path.read_text()
    assert "verdict: PASS on 1 of 10 ONNX nodes" in html_text
    assert "compared: 1 of 10 ONNX nodes compared" in html_text


def test_the_culprits_whole_stack_is_one_click_away_on_the_card(browser, tmp_path):
    """The card names the culprit's source line (the innermost frame of the model's code)
    and shows its whole stack on one click; the no-script fallback folds it under it."""
    from onnx_sbs_nb.cli.demo import build_demo
    from onnx_sbs_nb.notebook.session import SbsSession

    case = build_demo()
    s = SbsSession(case.ep, case.onx, case.args, own_error=True, batch_interval=0).start()
    detail = s.culprit_detail()
    assert detail is not None and "demo.py" in detail["node"]["stack_trace"]
    path = s.save_html(tmp_path / "stack.html")
    text = path.read_text(encoding="utf-8")
    assert '<details class="onnx-sbs-stack"><summary>whole stack</summary>' in text
    p = Page(browser)
    try:
        page = p.page
        page.goto(path.as_uri())
        card = page.locator(".sbs-card")
        card.wait_for(timeout=20000)
        assert "demo.py:" in card.locator(".sbs-card-source").inner_text()
        assert card.locator(".sbs-card-stack").count() == 0  # folded until asked
        card.locator(".sbs-card-stack-toggle").click()
        stack = card.locator(".sbs-card-stack").inner_text()
        assert "demo.py" in stack and "line" in stack and stack.count("File ") >= 2
        card.locator(".sbs-card-stack-toggle").click()
        assert card.locator(".sbs-card-stack").count() == 0
        assert p.errors == []
    finally:
        p.close()
