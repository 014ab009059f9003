"""Hatchling build hook: builds the widget's JS bundle so that ``pip install .`` and
``pip install -e .`` produce ``onnx_sbs_nb/static/widget.js`` (git-ignored, never
committed).  Enabled in pyproject.toml by ``[tool.hatch.build.targets.wheel.hooks.custom]``.

Set ``ONNX_SBS_SKIP_JS_BUILD=1`` to skip it (the package then works without the widget
and the HTML report until ``cd js && npm ci && npm run build`` is run).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BUNDLE = Path("onnx_sbs_nb") / "static" / "widget.js"


def _newest_source(js: Path) -> float:
    files = [js / "build.mjs", js / "package.json", js / "package-lock.json"]
    files += [p for p in (js / "src").rglob("*") if p.is_file()]
    return max((p.stat().st_mtime for p in files if p.exists()), default=0.0)


def build_bundle(root: Path, *, force: bool = False) -> Path:
    """Build the bundle under *root* when it is missing or older than its sources."""
    js = root / "js"
    out = root / BUNDLE
    if not (js / "package.json").is_file():
        if out.is_file():
            return out  # an sdist built elsewhere that ships the bundle
        raise RuntimeError(f"{js / 'package.json'} is missing: cannot build {out}")
    if not force and out.is_file() and out.stat().st_mtime >= _newest_source(js):
        return out
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError(
            f"building onnx_sbs_nb needs node >= 18 and npm to build {BUNDLE} (the notebook "
            "widget and the HTML report); install them, or set ONNX_SBS_SKIP_JS_BUILD=1 to "
            "install without the widget"
        )
    lock = js / "package-lock.json"
    stamp = js / "node_modules" / ".package-lock.json"
    if not stamp.is_file() or (lock.is_file() and lock.stat().st_mtime > stamp.stat().st_mtime):
        cmd = [npm, "ci" if lock.is_file() else "install", "--no-audit", "--no-fund"]
        subprocess.run(cmd, cwd=js, check=True)
    subprocess.run([npm, "run", "build"], cwd=js, check=True)
    if not out.is_file():
        raise RuntimeError(f"the JS build finished but {out} was not written")
    return out


class JsBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("ONNX_SBS_SKIP_JS_BUILD") == "1":
            return
        build_bundle(Path(self.root))
        build_data.setdefault("artifacts", []).append(BUNDLE.as_posix())
