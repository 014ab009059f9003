"""One-pass comparisons in C (``sbs_native.c``), loaded with ctypes.

The package build (``hatch_build.py``) compiles the library next to this file when a C
compiler is there; without it :data:`NATIVE` is None and ``diff.py`` computes the same
numbers with numpy, in several passes.  The C code gives the numpy path's results bit
for bit (``tests/test_native.py`` checks both on the same values).
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

import numpy as np

# the library's sbs_native_version(): a library from another version is not used
VERSION = 1

_C_DOUBLES = ctypes.c_double * 6
_POINTERS = (ctypes.c_void_p, ctypes.c_void_p)


def library_name() -> str:
    """The file name of the built library on this platform."""
    if sys.platform == "win32":
        return "_sbs_native.dll"
    if sys.platform == "darwin":
        return "_sbs_native.dylib"
    return "_sbs_native.so"


def _address(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class Native:
    """The library's functions, typed."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib
        numbers = (ctypes.c_int64, ctypes.c_double, ctypes.c_double, ctypes.c_void_p)
        self._compare = {}
        for dtype, name in ((np.float32, "sbs_compare_f32"), (np.float64, "sbs_compare_f64")):
            fn = getattr(lib, name)
            fn.argtypes = (*_POINTERS, *numbers)
            fn.restype = ctypes.c_int
            self._compare[np.dtype(dtype)] = fn
        self._transposed = lib.sbs_equal_transposed
        self._transposed.argtypes = (*_POINTERS, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
        self._transposed.restype = ctypes.c_int
        self._same = lib.sbs_same_bytes
        self._same.argtypes = (*_POINTERS, ctypes.c_int64)
        self._same.restype = ctypes.c_int

    def compares(self, dtype: np.dtype) -> bool:
        return dtype in self._compare

    def compare(
        self, e: np.ndarray, g: np.ndarray, atol: float, rtol: float
    ) -> tuple[float, float, float, float, float, float]:
        """(max |e - g|, max |e - g| / (|e| + atol), non-finite disagreements, count of
        |e - g| > 0.1, > 0.01, > atol + rtol |e|) over C-ordered arrays of one float dtype
        that ``compares`` (see sbs_native.c)."""
        out = _C_DOUBLES()
        self._compare[e.dtype](_address(e), _address(g), e.size, atol, rtol, out)
        return tuple(out)  # type: ignore[return-value]

    def same_bytes(self, a: np.ndarray, b: np.ndarray) -> bool:
        """Whether two C-ordered arrays hold the same bytes."""
        return bool(self._same(_address(a), _address(b), a.nbytes))

    def equal_transposed(self, a: np.ndarray, b: np.ndarray) -> bool | None:
        """Whether C-ordered ``b`` holds C-ordered 2-D ``a`` transposed, byte for byte
        (None: an item size the library does not handle)."""
        rows, cols = a.shape
        found = self._transposed(_address(a), _address(b), rows, cols, a.itemsize)
        return None if found < 0 else bool(found)


def load(path: Path | None = None) -> Native | None:
    """The library next to this file, or None when it was not built (or is another
    version's)."""
    path = path or Path(__file__).with_name(library_name())
    if not path.is_file():
        return None
    try:
        lib = ctypes.CDLL(str(path))
        lib.sbs_native_version.restype = ctypes.c_int
        if lib.sbs_native_version() != VERSION:
            return None
        return Native(lib)
    except (OSError, AttributeError):
        return None


NATIVE: Native | None = load()

__all__ = ["NATIVE", "VERSION", "Native", "library_name", "load"]
