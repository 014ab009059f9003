"""Fixtures of the browser tests: a JupyterLab server on loopback and headless Chromium.

Both are real: JupyterLab (>= 4.4) from the venv, Debian's /usr/bin/chromium driven by
Playwright (`playwright install` is not needed: the system browser is used).  Every
request the page makes outside 127.0.0.1 is refused, so nothing comes from a CDN.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from ..browser import CHROMIUM, launch

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    log: Path


def _lab_settings(settings: Path) -> None:
    """No news or update checks (they would reach out and pop up toasts)."""
    d = settings / "@jupyterlab" / "apputils-extension"
    d.mkdir(parents=True, exist_ok=True)
    (d / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False})
    )
    d = settings / "@jupyterlab" / "notebook-extension"
    d.mkdir(parents=True, exist_ok=True)
    # start the notebook's own kernel without the "Select Kernel" dialog, and render every
    # cell (windowing would leave off-screen widgets unrendered)
    (d / "tracker.jupyterlab-settings").write_text(
        json.dumps({"autoStartDefaultKernel": True, "windowingMode": "none"})
    )


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        b = launch(p, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def page(browser):
    ctx = browser.new_context(viewport={"width": 1500, "height": 1000})

    def only_loopback(route):
        url = route.request.url
        if url.startswith(("http://127.0.0.1", "ws://127.0.0.1", "file://", "data:", "blob:")):
            route.continue_()
        else:
            route.abort()

    ctx.route("**/*", only_loopback)
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.js_errors = errors
    try:
        yield pg
    finally:
        ctx.close()


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """A JupyterLab server in a temporary root, stopped (with its kernels) at the end."""
    pytest.importorskip("jupyterlab")
    base = tmp_path_factory.mktemp("lab")
    root = base / "root"
    root.mkdir()
    settings = base / "settings"
    _lab_settings(settings)
    port = _free_port()
    token = secrets.token_hex(16)
    env = dict(os.environ)
    env.update(
        JUPYTERLAB_SETTINGS_DIR=str(settings),
        JUPYTERLAB_WORKSPACES_DIR=str(base / "workspaces"),
        JUPYTER_RUNTIME_DIR=str(base / "runtime"),
        JUPYTER_CONFIG_DIR=str(base / "config"),
        PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        PYTHONWARNINGS="ignore",
    )
    log = base / "lab.log"
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        "--ServerApp.ip=127.0.0.1",
        f"--IdentityProvider.token={token}",
        "--allow-root",
        "--LabApp.extension_manager=readonly",
        f"--ServerApp.root_dir={root}",
        "--ServerApp.open_browser=False",
        "--LabApp.news_url=",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"jupyter lab did not start in 120 s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield Lab(url=url, token=token, root=root, log=log)
    finally:
        # SIGTERM lets the server shut its kernels down; then make sure the group is gone
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # leftover kernels of this server only
        except ProcessLookupError:
            pass


@pytest.fixture(scope="session")
def artifacts() -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


def copy_notebook(name: str, dest: Path) -> Path:
    src = REPO / "notebooks" / name
    out = dest / name
    shutil.copy(src, out)
    return out
