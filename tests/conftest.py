"""Session-wide settings shared by every test module."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _private_cache_dir(tmp_path_factory):
    """The engine's on-disk cache goes to a folder of this session, never the user's home
    (subprocesses started by tests inherit it)."""
    previous = os.environ.get("ONNX_SBS_CACHE_DIR")
    os.environ["ONNX_SBS_CACHE_DIR"] = str(tmp_path_factory.mktemp("sbs-cache"))
    yield
    if previous is None:
        os.environ.pop("ONNX_SBS_CACHE_DIR", None)
    else:
        os.environ["ONNX_SBS_CACHE_DIR"] = previous
