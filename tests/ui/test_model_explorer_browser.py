"""The node-data file in the real Model Explorer, in headless Chromium.

The Model Explorer server (``ai-edge-model-explorer``) opens the optimized graph of a
QDQ linear through the ``model-explorer-onnx`` adapter, with the node data written from
the side-by-side run of that graph; the page must list the culprit (the fused QGemm)
with its error, coloured as a failure.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import onnx
import pytest

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.pairing.optimized import optimize_model
from onnx_sbs_nb.reports.model_explorer import FAIL_COLOR, write_node_data

from ..quant_models import exported
from .conftest import _free_port

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        importlib.util.find_spec("model_explorer_onnx") is None and not os.environ.get("CI"),
        reason="Model Explorer not installed (pip install -e .[test])",
    ),
]


def _rgb(color: str) -> str:
    r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def _js_number(v: float) -> str:
    """How the page prints a number (JavaScript's shortest form)."""
    return str(int(v)) if float(v).is_integer() else repr(float(v))


@pytest.fixture(scope="module")
def explorer(tmp_path_factory):
    ep, onx, args = exported("linear")
    om = optimize_model(onx, "all")
    folder = tmp_path_factory.mktemp("model_explorer")
    model_path = folder / "optimized.onnx"
    onnx.save(om.model, str(model_path))
    recs = list(run_aligned(ep, om.model, args))
    data_path = write_node_data(recs, folder / "run.node_data.json", om.model)
    port = _free_port()
    log = folder / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "model_explorer",
        str(model_path),
        "--extensions=model_explorer_onnx",
        f"--node_data_paths={data_path}",
        "--no_open_in_browser",
        "--host=127.0.0.1",
        f"--port={port}",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None:
            if proc.poll() is not None:
                raise RuntimeError(f"model-explorer exited:\n{log.read_text()[-3000:]}")
            text = log.read_text(errors="replace")
            if "server at:" in text:
                rest = text.split("server at:", 1)[1].split()
                if rest:
                    url = rest[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"model-explorer did not start:\n{text[-3000:]}")
            time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
            assert r.status == 200
        culprit = next(r for r in recs if r.failed)
        yield url, culprit, json.loads(data_path.read_text())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def test_overlay_shows_the_culprits_error(explorer, page):
    url, culprit, data = explorer
    assert culprit.onnx_op_type == "QGemm"
    page.goto(url)
    row = page.locator("tr", has=page.locator("td.node-label", has_text="com.microsoft::QGemm"))
    row.first.wait_for(timeout=90_000)
    assert row.count() == 1
    cell = row.first.locator("td.value-col")
    assert cell.inner_text().strip() == _js_number(culprit.err_abs)
    style = cell.get_attribute("style") or ""
    assert _rgb(FAIL_COLOR) in style
    # a node within tolerance shows its value too, without the failure colour
    ok_row = page.locator("tr", has=page.locator("td.node-label", has_text="QuantizeLinear"))
    assert ok_row.first.locator("td.value-col").inner_text().strip() == "0"
    assert _rgb(FAIL_COLOR) not in (
        ok_row.first.locator("td.value-col").get_attribute("style") or ""
    )
    assert "node_linear" in data["main_graph"]["results"]
    assert not page.js_errors, page.js_errors
