"""Calling the user's compare function (``compare=fn``) so that nothing it does reaches the run.

The function is the user's code, and it may be wrong in any way: it gets copies of the two
values (writing into them changes nothing the run reads), and what it returns is read
defensively: a Mapping whose ``items()`` raise, keys or values whose ``str()`` raises, a
``None``, 20,000 entries or a 20 MB string make that pair's error or are cut to
:data:`MAX_EXTRA_KEYS` entries of :data:`MAX_EXTRA_TEXT` characters, with a note; numbers
too large for a float and non-finite ones are kept as their text ("inf", "1e+400"), which
every report writes.  The run goes on.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# numpy and torch are read from sys.modules, not imported: the report modules import this
# one, and `onnx-sbs --help` must answer before either loads (a value of theirs exists
# only once they are loaded)

#: entries of the returned dict kept per pair (the rest are counted in the note)
MAX_EXTRA_KEYS = 32
#: characters kept of a key or a string value
MAX_EXTRA_TEXT = 200
#: the Record.extra key of the note saying what was cut
NOTE_KEY = "compare_note"
_MAX_READ = 1_000_000


class CompareFunctionError(Exception):
    """The user's compare function failed on one pair: the message says how."""


@dataclass
class CompareResult:
    passed: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _is_tensor(v: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(v, torch.Tensor)


def _is_numpy_scalar(v: Any) -> bool:
    np = sys.modules.get("numpy")
    return np is not None and isinstance(v, np.generic)


def _as_bool(value: Any) -> bool | None:
    """``passed`` as a bool: a bool, a numpy bool or a one-element torch bool tensor
    (``(e - g).abs().le(1e-3).all()``: the function is given torch tensors)."""
    if isinstance(value, bool):
        return value
    np = sys.modules.get("numpy")
    if np is not None and isinstance(value, np.bool_):
        return bool(value)
    if _is_tensor(value) and value.dtype == sys.modules["torch"].bool and value.numel() == 1:
        return bool(value.item())
    return None


def _cut(text: str) -> str:
    return text if len(text) <= MAX_EXTRA_TEXT else text[:MAX_EXTRA_TEXT] + "…"


def plain_value(v: Any) -> Any:
    """A value of the user's dict as a plain record value: bool, int, a finite float,
    None or text (non-finite and out-of-range numbers as their text, others cut)."""
    if _is_numpy_scalar(v) or (_is_tensor(v) and v.numel() == 1):
        v = v.item()
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        # an int beyond a double's exact range is written as text: reports, spreadsheets and
        # JSON readers take floats (and Python's str() refuses ints of 4,300+ digits)
        return v if abs(v) < 2**53 else _big_int_text(v)
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)  # "inf", "nan": JSON has no such numbers
    return _cut(v if isinstance(v, str) else str(v))


def _big_int_text(v: int) -> str:
    """``1.000e+400`` for ``10**400``, without str() or float() of the whole int."""
    digits = max(1, math.floor(math.log10(abs(v))) + 1)
    lead = abs(v) // 10 ** max(0, digits - 4)  # the first four digits
    while lead >= 10_000:  # log10's rounding at a power of ten
        lead //= 10
        digits += 1
    text = str(lead).ljust(4, "0")
    return f"{'-' if v < 0 else ''}{text[0]}.{text[1:]}e+{digits - 1}"


def call_compare(
    fn: Callable, name: str, expected: torch.Tensor, got: torch.Tensor
) -> CompareResult:
    """``fn(expected, got)`` on copies, its answer read; CompareFunctionError otherwise."""
    try:
        # copies: an in-place write by the user's code never reaches the run's values
        found = fn(expected.detach().clone(), got.detach().clone())
    except Exception as exc:  # the user's code: its failure is this pair's error
        raise CompareFunctionError(f"compare function {name} raised {_describe(exc)}") from None
    if not isinstance(found, Mapping):
        raise CompareFunctionError(
            f"compare function {name} returned a {type(found).__name__}, not a dict "
            "(return {'passed': bool, ...})"
        )
    try:
        return _read(found, name)
    except CompareFunctionError:
        raise
    except Exception as exc:  # items(), str() or a comparison of the user's objects raised
        raise CompareFunctionError(
            f"compare function {name} returned a dict that cannot be read: {_describe(exc)}"
        ) from None


def _read(found: Mapping, name: str) -> CompareResult:
    result = CompareResult()
    cut = 0
    # bounded: a Mapping's items() may be endless
    for key, value in itertools.islice(found.items(), _MAX_READ):
        if isinstance(key, str) and key == "passed":
            passed = _as_bool(value)
            if passed is None:
                raise CompareFunctionError(
                    f"compare function {name} returned passed={_safe_repr(value)}: not a bool"
                )
            result.passed = passed
        elif len(result.extra) < MAX_EXTRA_KEYS:
            result.extra[_cut(str(key))] = plain_value(value)
        else:
            cut += 1
    if cut:
        result.extra[NOTE_KEY] = (
            f"{cut} more entries returned, not kept (the first {MAX_EXTRA_KEYS} are)"
        )
    return result


def _safe_repr(value: Any) -> str:
    try:
        return _cut(repr(value))
    except Exception:
        return f"<a {type(value).__name__}>"


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "<its message cannot be read>"
    return f"{type(exc).__name__}: {_cut(text)}"
