"""A small on-disk cache of inert JSON files, so later processes skip repeated work.

Where: ``$ONNX_SBS_CACHE_DIR``, else ``$XDG_CACHE_HOME/onnx_sbs_nb``, else
``~/.cache/onnx_sbs_nb``; ``ONNX_SBS_CACHE_DIR=""`` (empty) turns the cache off.
What is cached never carries code: JSON only, read with ``json.loads`` and checked by
its reader, so a file that was tampered with can at worst be ignored or fail a check.
Names are built here from hashes and version strings, never from user input.
Every failure (read-only home, full disk, a concurrent writer) means "not cached".
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

ENV_DIR = "ONNX_SBS_CACHE_DIR"
MAX_BYTES = 64 * 1024 * 1024  # a cache file larger than this is not ours
_SAFE = re.compile(r"[^A-Za-z0-9._+-]")


def cache_dir() -> Path | None:
    configured = os.environ.get(ENV_DIR)
    if configured is not None:
        return Path(configured) if configured else None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "onnx_sbs_nb"


@functools.lru_cache(maxsize=1)
def versions() -> str:
    """The versions a cached decision depends on, as a file-name fragment."""
    from importlib import metadata

    import torch

    try:
        onnxscript = metadata.version("onnxscript")
    except metadata.PackageNotFoundError:
        onnxscript = "none"
    return _SAFE.sub("_", f"torch{torch.__version__}-onnxscript{onnxscript}")


def _path(name: str) -> Path | None:
    folder = cache_dir()
    if folder is None or _SAFE.search(name) or name.startswith("."):
        return None
    return folder / name


def read_json(name: str) -> Any:
    """The parsed content of a cache file, or None when absent or unreadable."""
    path = _path(name)
    if path is None:
        return None
    try:
        if path.stat().st_size > MAX_BYTES:
            return None
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None


def write_json(name: str, data: Any) -> bool:
    """Writes atomically (a reader never sees half a file); False when it could not."""
    path = _path(name)
    if path is None:
        return False
    try:
        text = json.dumps(data, separators=(",", ":"), allow_nan=False)
        if len(text) > MAX_BYTES:
            return False
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return True
    except (OSError, ValueError, TypeError):
        return False
