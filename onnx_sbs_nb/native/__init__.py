"""One-pass comparisons in C (``sbs_native.c``), an extension module.

The package build (``hatch_build.py``) compiles ``_sbs_native`` next to this file when a C
compiler and Python's headers are there; without it :data:`NATIVE` is None and
``diff.py`` computes the same numbers with numpy, in several passes.  The C code gives the
numpy path's results bit for bit (``tests/compare/test_native.py`` checks both on the same
values).
"""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np

# the module's VERSION: a module built from another version's source is not used
VERSION = 4
MODULE = "_sbs_native"


class Native:
    """The module's functions (its own builtins: a call goes straight to C)."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        # compare(e, g, atol, rtol[, measures[, ranks]]) -> (max |e - g|, max |e - g| /
        # (|e| + atol), non-finite disagreements, count of |e - g| > 0.1, > 0.01, > atol +
        # rtol |e|, sum e^2, sum g^2, sum e g, sum (e - g)^2 (in double), max ulp distance)
        # over C-ordered arrays of one float dtype that ``compares`` (see sbs_native.c);
        # with ``ranks``, what ranks() gives for them follows, from the same pass
        self.compare = module.compare
        # ranks(e, g, (r, ...)): the r-th smallest |e - g| (0 where both sides hold the
        # same non-finite value, inf where they disagree), ranks ascending, at most 8
        self.ranks = module.ranks
        # same_bytes(a, b): whether two C-ordered arrays hold the same bytes
        self.same_bytes = module.same_bytes
        # equal_transposed(a, b): whether C-ordered ``b`` holds C-ordered 2-D ``a``
        # transposed, byte for byte (None: an item size the module does not handle)
        self.equal_transposed = module.equal_transposed
        self._floats = frozenset((np.dtype(np.float32), np.dtype(np.float64)))

    def compares(self, dtype: np.dtype) -> bool:
        return dtype in self._floats


def load(path: Path | None = None) -> Native | None:
    """The module next to this file (or at ``path``), or None when it was not built (or
    is another version's)."""
    try:
        if path is None:
            module = importlib.import_module(f"{__name__}.{MODULE}")
        else:
            spec = importlib.util.spec_from_file_location(MODULE, path)
            if spec is None or spec.loader is None:
                return None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    if getattr(module, "VERSION", None) != VERSION:
        return None
    return Native(module)


NATIVE: Native | None = load()

__all__ = ["MODULE", "NATIVE", "VERSION", "Native", "load"]
