"""The example notebooks execute (nbclient), and an executed one exports to an offline report.

The export is opened in headless Chromium with the network blocked: the SbsWidget output
must render from the widget state saved in the notebook (rows, chart, summary), and with
that state removed (JupyterLab's default save) the widget's static summary must show
instead, saying why and how to get the interactive view.  Stock ``nbconvert --to html``
offline shows no blank widget cell either way.
"""

from __future__ import annotations

import copy
import os
import pathlib

import pytest

from onnx_sbs_nb.cli.main import EXIT_PASS, main

from .browser import CHROMIUM, launch

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
LLAMA = ROOT / "notebooks" / "02_llama_discrepancy.ipynb"
ARTIFACTS = ROOT / "test-artifacts"  # screenshots of each sharing path, to look at


def screenshot(page, name: str, top) -> None:
    """The page at 1500x1000 with ``top`` (a locator) at the top of the window."""
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1500, "height": 1000})
    top.evaluate("e => e.scrollIntoView({block: 'start'})")
    page.screenshot(path=str(ARTIFACTS / name))


pytestmark = pytest.mark.slow


def execute(path: pathlib.Path, workdir: pathlib.Path):
    import nbclient
    import nbformat

    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        store_widget_state=True,
        resources={"metadata": {"path": str(workdir)}},
    )
    client.execute()
    return nb


@pytest.fixture(scope="module")
def executed(tmp_path_factory, monkeypatch_module):
    """Each notebook executed once for the module, in its own scratch folder."""
    # the kernel is a subprocess: it must import this source tree
    path = os.environ.get("PYTHONPATH", "")
    monkeypatch_module.setenv("PYTHONPATH", str(ROOT) + (os.pathsep + path if path else ""))
    cache: dict[pathlib.Path, object] = {}

    def get(nb_path: pathlib.Path):
        if nb_path not in cache:
            try:
                cache[nb_path] = execute(nb_path, tmp_path_factory.mktemp(nb_path.stem))
            except Exception as e:  # executed once: later tests fail fast with the same error
                cache[nb_path] = e
        if isinstance(cache[nb_path], Exception):
            raise cache[nb_path]
        return cache[nb_path]

    return get


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip("needs Debian's chromium at /usr/bin/chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = launch(pw)
        yield b
        b.close()


def open_offline(browser, path: pathlib.Path):
    """Opens ``path`` with every non-file request aborted; returns (context, page, log)."""
    ctx = browser.new_context()
    page = ctx.new_page()
    log: dict[str, list[str]] = {"blocked": [], "dialogs": [], "errors": []}

    def route(r):
        if r.request.url.startswith(("file:", "blob:", "data:")):
            r.continue_()
        else:
            log["blocked"].append(r.request.url)
            r.abort()

    page.route("**/*", route)
    page.on("dialog", lambda d: (log["dialogs"].append(d.message), d.dismiss()))
    page.on("pageerror", lambda e: log["errors"].append(str(e)))
    page.goto(path.as_uri())
    return ctx, page, log


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(nb_path, executed):
    nb = executed(nb_path)
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", (cell.source, out)
    if nb_path == LLAMA:
        text = "".join(
            o.get("text", "")
            for c in nb.cells
            for o in c.get("outputs", [])
            if o.get("name") == "stdout"
        )
        assert "verdict: FAIL" in text and "verdict: PASS" in text
        assert "on torch_inputs: max abs" in text  # the replay bundle's script ran
        assert "llama_report.html" in text and "opens offline" in text  # save_html


@pytest.fixture(scope="module")
def llama_nb(executed):
    return executed(LLAMA)


def test_export_renders_widget_offline(llama_nb, browser, tmp_path, capsys):
    import nbformat

    src = tmp_path / "llama.ipynb"
    nbformat.write(llama_nb, src)
    out = tmp_path / "llama.html"
    assert main(["notebook", str(src), "-o", str(out)]) == EXIT_PASS
    assert "1 SbsWidget view(s) rendered" in capsys.readouterr().out
    text = out.read_text(encoding="utf-8")
    assert "html-manager" not in text and "unpkg.com" not in text
    assert "application/vnd.jupyter.widget-view+json" not in text
    ctx, page, log = open_offline(browser, out)
    try:
        page.wait_for_selector(".sbs-root .sbs-tr", timeout=30000)
        assert page.locator(".sbs-tr").count() > 20  # rows from the saved state
        page.wait_for_selector(".sbs-chart .main-svg", timeout=30000)
        status = page.locator(".sbs-status").inner_text()
        assert "finished" in status and "culprit:" in status, status
        assert "culprit" in page.locator(".sbs-card").inner_text()
        # the rest of the notebook is there, as nbconvert renders it
        body = page.locator("body").inner_text()
        assert "verdict: FAIL" in body and "tiny Llama" in body
        assert page.locator(".onnx-sbs-fallback").count() == 0  # replaced by the live view
        assert page.locator("button.sbs-btn").count() == 0  # no kernel: no action buttons
        assert log["dialogs"] == [] and log["errors"] == []
        assert log["blocked"] == []  # no CDN script left (no math here, so no MathJax)
        screenshot(page, "shared_onnx_sbs_notebook_state.png", page.locator(".sbs-root").first)
    finally:
        ctx.close()


def test_export_without_widget_state_shows_fallback(llama_nb, browser, tmp_path):
    from onnx_sbs_nb.reports.notebook import notebook_html

    nb = copy.deepcopy(llama_nb)
    nb.metadata.pop("widgets", None)
    result = notebook_html(nb)
    assert result.views == 0 and result.fallbacks >= 1
    out = tmp_path / "fallback.html"
    out.write_text(result.html, encoding="utf-8")
    ctx, page, log = open_offline(browser, out)
    try:
        fallback = page.locator(".onnx-sbs-fallback").first
        assert fallback.is_visible()
        text = fallback.inner_text()
        assert "verdict: FAIL" in text  # refreshed with the summary when the run ended
        assert "culprit" in text
        # why the interactive view is missing, and how to keep it next time
        assert "Save Widget State Automatically" in text and "save_html" in text
        assert page.locator(".onnx-sbs-fallback table tr").count() > 5
        assert page.locator(".onnx-sbs-fallback .onnx-sbs-chart img").count() >= 1
        assert page.locator(".onnx-sbs-fallback svg").count() == 0
        assert page.locator(".sbs-root").count() == 0
        assert page.locator(".onnx-sbs-fallback").count() == 1  # shown once, not twice
        assert log["dialogs"] == [] and log["errors"] == []
        screenshot(page, "shared_onnx_sbs_notebook_default_save.png", fallback)
    finally:
        ctx.close()


@pytest.mark.parametrize("saved_state", [True, False], ids=["state-saved", "lab-default-save"])
def test_stock_nbconvert_offline_shows_no_blank_widget(llama_nb, browser, tmp_path, saved_state):
    """``jupyter nbconvert --to html`` as it comes, opened offline: its widget manager
    (a CDN script) cannot load, and the widget's static summary is still there."""
    import nbconvert

    nb = copy.deepcopy(llama_nb)
    if not saved_state:
        nb.metadata.pop("widgets", None)
    body, _ = nbconvert.HTMLExporter(template_name="lab").from_notebook_node(nb)
    out = tmp_path / "stock.html"
    out.write_text(body, encoding="utf-8")
    ctx, page, log = open_offline(browser, out)
    try:
        fallback = page.locator(".onnx-sbs-fallback")
        assert fallback.count() == 1 and fallback.first.is_visible()
        text = fallback.first.inner_text()
        assert "verdict: FAIL" in text and "Save Widget State Automatically" in text
        assert page.locator(".onnx-sbs-fallback .onnx-sbs-chart img").count() >= 1
        assert page.locator(".onnx-sbs-fallback svg").count() == 0
        assert log["dialogs"] == []
        name = f"shared_stock_nbconvert_{'state' if saved_state else 'default'}.png"
        screenshot(page, name, fallback.first)
    finally:
        ctx.close()
