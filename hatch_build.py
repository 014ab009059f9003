"""Hatchling build hook: builds the widget's JS bundle so that ``pip install .`` and
``pip install -e .`` produce ``onnx_sbs_nb/static/widget.js`` (git-ignored, never
committed), and the comparisons' C extension ``onnx_sbs_nb/native/_sbs_native*.so`` when
a C compiler and Python's headers are there (without it the package compares with numpy,
more slowly).  Enabled in pyproject.toml by ``[tool.hatch.build.targets.wheel.hooks.custom]``.

Set ``ONNX_SBS_SKIP_JS_BUILD=1`` to skip the bundle (the package then works without the
widget and the HTML report until ``cd js && npm ci && npm run build`` is run), and
``ONNX_SBS_SKIP_NATIVE_BUILD=1`` to skip the extension.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BUNDLE = Path("onnx_sbs_nb") / "static" / "widget.js"
NATIVE_SOURCE = Path("onnx_sbs_nb") / "native" / "sbs_native.c"


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


# The stable ABI the C module keeps to (Py_buffer joined it in 3.11): built on 3.11 or
# later, one module and one wheel (cp311-abi3-<platform>) serve every later CPython.
LIMITED_API = (3, 11)


def abi3() -> bool:
    """Whether this interpreter builds the module for the stable ABI (not on Windows,
    where the package has no C module)."""
    return sys.version_info >= LIMITED_API and sys.platform != "win32"


def native_library() -> Path:
    """Where the extension module goes (the name onnx_sbs_nb/native/__init__.py imports)."""
    if abi3():
        return NATIVE_SOURCE.with_name("_sbs_native.abi3.so")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    return NATIVE_SOURCE.with_name("_sbs_native" + suffix)


def wheel_tag() -> str | None:
    """The tag of a wheel holding the stable-ABI module (None: the interpreter's own tag,
    which hatchling infers)."""
    if not abi3():
        return None
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"cp{LIMITED_API[0]}{LIMITED_API[1]}-abi3-{platform}"


def _no_native(why: str) -> None:
    print(f"onnx_sbs_nb: {why}: comparisons run in numpy (slower)", file=sys.stderr)


def build_native(root: Path, *, force: bool = False) -> Path | None:
    """Compile the comparisons' extension module under *root* when it is missing or older
    than its source; None (and a warning) when no C compiler or no Python headers can:
    the package then compares with numpy."""
    src, out = root / NATIVE_SOURCE, root / native_library()
    if not src.is_file():
        return out if out.is_file() else None
    if not force and out.is_file() and out.stat().st_mtime >= src.stat().st_mtime:
        return out
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc = cc.split()[0]
    if shutil.which(cc) is None:
        cc = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), "")
    if not cc or sys.platform == "win32":
        _no_native("no C compiler")
        return None
    include = sysconfig.get_paths()["include"]
    if not (Path(include) / "Python.h").is_file():
        _no_native(f"no Python.h in {include} (install Python's development headers)")
        return None
    tmp = out.with_name(out.name + ".tmp")
    # -ffp-contract=off: a * b + c rounds twice, as numpy computes it
    cmd = [cc, "-O3", "-fPIC", "-shared", "-ffp-contract=off", "-Wno-psabi", f"-I{include}"]
    if abi3():
        # the headers then hide everything outside the stable ABI: using it fails the build
        cmd.append(f"-DPy_LIMITED_API=0x{LIMITED_API[0]:02X}{LIMITED_API[1]:02X}0000")
    if sys.platform == "darwin":
        cmd += ["-undefined", "dynamic_lookup"]  # Python's symbols come from the interpreter
    cmd += ["-o", str(tmp), str(src)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        _no_native(f"the C module did not build ({detail.strip()[:500]})")
        tmp.unlink(missing_ok=True)
        return None
    os.replace(tmp, out)
    # the ctypes library of earlier versions, beside it, is never loaded again, nor a
    # module built for one interpreter only (import would prefer it to the abi3 one)
    stale = [out.with_name(o) for o in ("_sbs_native.so", "_sbs_native.dylib", "_sbs_native.dll")]
    stale += list(out.parent.glob("_sbs_native.cpython-*"))
    for old in stale:
        if old != out:
            old.unlink(missing_ok=True)
    return out


class JsBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        if os.environ.get("ONNX_SBS_SKIP_JS_BUILD") != "1":
            build_bundle(Path(self.root))
            build_data.setdefault("artifacts", []).append(BUNDLE.as_posix())
        if os.environ.get("ONNX_SBS_SKIP_NATIVE_BUILD") != "1":
            if build_native(Path(self.root)) is not None:
                build_data.setdefault("artifacts", []).append(native_library().as_posix())
                # a platform library inside: the wheel is for this platform only, and for
                # every CPython from 3.11 on (abi3) where the interpreter can build that
                build_data["pure_python"] = False
                tag = wheel_tag()
                if tag is None:
                    build_data["infer_tag"] = True
                else:
                    build_data["tag"] = tag
