"""The cyclic garbage collector, paused while a run is set up.

Setting a run up allocates hundreds of thousands of small objects (fx nodes of the
prepared program, pairing tables, the plan) that all survive: on a 5,000-node graph the
collector's full passes over them took a third of the set-up time, and found nothing to
free.  Only the engine's own set-up runs paused (no user code runs in between); the
collector is restored as it was, whatever happens.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
