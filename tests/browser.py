"""Debian's Chromium for the browser tests (Playwright's own browser downloads do not work)."""

from __future__ import annotations

import os

CHROMIUM = os.environ.get("SBS_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium keeps dialing out through a closed network.
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def launch(playwright, **kwargs):
    """A headless Chromium browser from a sync Playwright instance."""
    return playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, **kwargs)
