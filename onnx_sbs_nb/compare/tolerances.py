"""Default tolerances per dtype: the one table the comparisons and the summary read.

Plain Python: the summary (and every view that only reads records) uses it without
importing torch or numpy.
"""

from __future__ import annotations

# (atol, rtol) per dtype when the user gives none: accumulated float32 rounding between
# two runtimes stays well below 1e-4 on exported models; half types carry ~3 digits.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
    "complex64": (1e-4, 1e-4),
    "complex128": (1e-7, 1e-7),
}
FP8_TOLERANCE = (1.25e-1, 1.25e-1)
EXACT = (0.0, 0.0)


def default_tolerance(dtype_name: str) -> tuple[float, float]:
    """(atol, rtol) of a dtype by name ("float32"); integers and the unknown are exact."""
    if dtype_name in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[dtype_name]
    if dtype_name.startswith("float8"):
        return FP8_TOLERANCE
    return EXACT
