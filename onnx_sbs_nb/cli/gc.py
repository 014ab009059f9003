"""Python's cyclic garbage collector in the ``onnx-sbs`` process, which is ours alone.

A command-line run allocates a few hundred thousand objects that live until it exits:
torch, onnx and onnxruntime's modules and registries (about 170,000 once imported), the
loaded program, the prepared program, the records.  With the default thresholds, each
full collection walks all of them again: on the 4-layer tiny Llama five full collections
(0.5 s of a 3.5 s command), on a 5,000-node chain nine (1.5 s of 8 s).  None of that
finds garbage worth the walk: the modules live for the whole process.

So the command collects nothing while it imports, then freezes what the imports made
(frozen objects are left out of every later collection: ``gc.freeze``), and makes its
young collections rarer (every :data:`YOUNG_THRESHOLD` allocations instead of 700, which
lets short-lived objects die before they are promoted, so no full collection comes due
on these runs).  The run's own garbage is still collected.  A library call never does
this: a notebook's process is the user's.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# Python 3.13 raised its own default from 700 to 2000; garbage cycles wait at most this
# many allocations, a few megabytes of small objects.
YOUNG_THRESHOLD = 10_000


@contextmanager
def one_command_gc() -> Iterator[Callable[[], None]]:
    """The collector as one command wants it (see the module's docstring).

    Yields ``imports_done``, to call once the heavy modules are imported.  On exit the
    collector is as it was (a test or a host calling the command in-process keeps its
    own settings), and a host that froze objects itself is left alone.
    """
    enabled = gc.isenabled()
    thresholds = gc.get_threshold()
    # unfreezing would hand a host's own frozen objects back to the collector
    ours_to_freeze = gc.get_freeze_count() == 0
    gc.disable()

    def imports_done() -> None:
        if ours_to_freeze:
            gc.freeze()
        gc.set_threshold(max(thresholds[0], YOUNG_THRESHOLD), *thresholds[1:])
        if enabled:
            gc.enable()

    try:
        yield imports_done
    finally:
        gc.set_threshold(*thresholds)
        if ours_to_freeze:
            gc.unfreeze()
        if enabled:
            gc.enable()
        else:
            gc.disable()


__all__ = ["YOUNG_THRESHOLD", "one_command_gc"]
