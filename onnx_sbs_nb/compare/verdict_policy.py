"""Verdicts on any measure (``verdict="snr>=30"``) and the user's own check
(``compare=fn``): the :class:`Judge` that ``diff.compare`` asks after measuring.

A verdict expression is ``<measure><op><number>``: a record field (``err_snr``) or its
short name (``snr``), one of ``<= < >= > == !=``, and a number (``inf`` allowed).  It is
parsed, never evaluated as code.  A policy is one expression, a list of them (all must
hold), or a dict from dtype name (``"float16"``) to either, with ``"*"`` for the other
dtypes; a dtype the dict leaves out (and no ``"*"``) keeps the atol/rtol verdict.  Any
verdict fails where NaN/inf disagree, and where shapes or dtypes differ.

The user's compare function ``fn(expected, got) -> dict`` gets both values as torch
tensors (on the torch value's device); the dict's ``"passed"`` (a bool) overrides the
verdict, its other entries land in ``Record.extra``.  A function that raises, or returns
something else than a readable dict, makes that pair's ``check_error`` (the function's
failure, never the model's), and the run goes on: see ``user_compare.py``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..convert import to_torch
from ..errors import SbsInputError
from .user_compare import CompareFunctionError, call_compare
from .value_facts import value_dtype_name

# short names of the measures a verdict may name; the record fields are accepted as well
ALIASES = {
    "abs": "err_abs",
    "rel": "err_rel",
    "nan": "err_nan",
    "h01": "err_h01",
    "h001": "err_h001",
    "cos": "err_cos",
    "cosine": "err_cos",
    "snr": "err_snr",
    "l2": "err_l2",
    "p50": "err_p50",
    "p99": "err_p99",
    "ulp": "err_ulp",
}
MEASURES = frozenset(ALIASES.values())
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": lambda a, b: a <= b,
    ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    ">": lambda a, b: a > b,
}
_EXPR = re.compile(
    r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=|==|!=|<|>)\s*"
    r"([-+]?(?:inf|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?))\s*$"
)
_HELP = (
    "write <measure><op><number>, e.g. 'snr>=30' or 'cos>=0.999', with a measure among "
    + ", ".join(sorted(ALIASES))
    + " (or its record field, e.g. err_snr) and an op among <=, <, >=, >, ==, !="
)
# how a record's comment says which conditions of the verdict a value fails
VERDICT_NOTE = "beyond the verdict"
# a verdict expression longer than this is no <measure><op><number>
MAX_EXPR = 100
# dict keys meaning "every other dtype"
_ANY_DTYPE = ("*", "default")


@dataclass(frozen=True)
class Condition:
    """One parsed ``<measure><op><number>``."""

    field: str
    op: str
    value: float
    text: str

    def holds(self, d: Any) -> bool:
        got = getattr(d, self.field, None)
        return got is not None and not math.isnan(got) and _OPS[self.op](got, self.value)


def parse_condition(text: Any) -> Condition:
    """A verdict expression, or SbsInputError naming the fix."""
    if not isinstance(text, str):
        raise SbsInputError(f"a verdict must be a string such as 'snr>=30', got {text!r:.80}")
    if len(text) > MAX_EXPR:
        # checked before the pattern, whose backtracking over 16,000 digits takes seconds
        raise SbsInputError(
            f"the verdict {text[:40]!r}... is {len(text)} characters long: a verdict is "
            f"<measure><op><number>, under {MAX_EXPR} characters"
        )
    m = _EXPR.match(text)
    if m is None:
        raise SbsInputError(f"cannot read the verdict {text!r}: {_HELP}")
    name, op, number = m.groups()
    field = ALIASES.get(name.lower(), name)
    if field not in MEASURES:
        raise SbsInputError(f"unknown measure {name!r} in the verdict {text!r}: {_HELP}")
    return Condition(field, op, float(number), text.strip())


def _conditions(value: Any, where: str) -> tuple[Condition, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return (parse_condition(value),)
    if isinstance(value, list | tuple) and value:
        return tuple(parse_condition(v) for v in value)
    raise SbsInputError(
        f"{where} must be an expression such as 'snr>=30', a list of them, or None, got {value!r}"
    )


def _short(field: str) -> str:
    return next((k for k, v in ALIASES.items() if v == field), field)


def dtype_key(key: str) -> str:
    """A verdict dict's dtype key as values name their dtype ("float" -> "float32"), or
    SbsInputError: a misspelt dtype would never apply, silently."""
    name = key.replace("torch.", "")
    dtype = getattr(torch, name, None)
    if isinstance(dtype, torch.dtype):
        return str(dtype).replace("torch.", "")
    dtypes = (d for d in vars(torch).values() if isinstance(d, torch.dtype))
    known = sorted({str(d).replace("torch.", "") for d in dtypes})
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise SbsInputError(
        f"the verdict names the dtype {key!r:.60}, which no value has{hint}: use a dtype name "
        f"such as float32, float16, bfloat16, int64 or bool, or '*' for every other dtype"
    )


# what each measure can be: (lowest, highest); a condition outside can never hold
_RANGES = {
    "err_cos": (-1.0, 1.0),
    "err_snr": (-math.inf, math.inf),
    "err_nan": (0.0, 1.0),
    "err_h01": (0.0, 1.0),
    "err_h001": (0.0, 1.0),
}


def check_satisfiable(conds: tuple[Condition, ...]) -> None:
    """Refuses conditions that no value can meet: outside what the measure can be
    (``cos>=1.5``), or contradicting each other on one measure (``abs<=1`` with ``abs>1``)."""
    bounds: dict[str, tuple[float, bool, float, bool, list[str]]] = {}
    for c in conds:
        lo, hi = _RANGES.get(c.field, (0.0, math.inf))
        lo, lo_in, hi, hi_in, texts = bounds.get(c.field, (lo, True, hi, True, []))
        v = c.value
        if c.op in (">=", ">", "==") and (v > lo or (v == lo and c.op == ">")):
            lo, lo_in = v, c.op != ">"
        if c.op in ("<=", "<", "==") and (v < hi or (v == hi and c.op == "<")):
            hi, hi_in = v, c.op != "<"
        texts = [*texts, c.text]
        bounds[c.field] = (lo, lo_in, hi, hi_in, texts)
        if lo > hi or (lo == hi and not (lo_in and hi_in)):
            low, high = _RANGES.get(c.field, (0.0, math.inf))
            raise SbsInputError(
                f"the verdict {' and '.join(repr(t) for t in texts)} can never hold: "
                f"{c.field} is between {low:g} and {high:g}, and no value meets all of it; "
                "every pair would fail"
            )


class VerdictPolicy:
    """The conditions a pair must meet, per dtype (see the module's docstring)."""

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self._by_dtype: dict[str, tuple[Condition, ...] | None] = {}
        self._other: tuple[Condition, ...] | None = None
        if isinstance(spec, Mapping):
            if not spec:
                raise SbsInputError("verdict={} names no dtype: give at least one entry")
            for key, value in spec.items():
                if not isinstance(key, str):
                    raise SbsInputError(f"verdict dict keys are dtype names, got {key!r}")
                conds = _conditions(value, f"verdict[{key!r}]")
                if key in _ANY_DTYPE:
                    self._other = conds
                else:
                    self._by_dtype[dtype_key(key)] = conds
        else:
            self._other = _conditions(spec, "verdict")
        for conds in self.all_conditions():
            check_satisfiable(conds)

    def conditions(self, dtype: str) -> tuple[Condition, ...] | None:
        """The conditions for values of ``dtype``; None: the atol/rtol verdict."""
        return self._by_dtype.get(dtype, self._other)

    def all_conditions(self) -> list[tuple[Condition, ...]]:
        return [c for c in (self._other, *self._by_dtype.values()) if c]

    def describe(self) -> Any:
        if isinstance(self.spec, Mapping):
            return {k: v if isinstance(v, str | None) else list(v) for k, v in self.spec.items()}
        return self.spec if isinstance(self.spec, str) else list(self.spec)


def function_name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


class Judge:
    """What ``diff.compare`` asks after measuring: the verdict policy and the user's
    compare function (either may be missing)."""

    def __init__(
        self, policy: VerdictPolicy | None, compare: Callable | None, measures: bool = True
    ) -> None:
        self.policy = policy
        self.compare = compare
        self.measures = measures  # False: cosine, SNR, L2, quantiles and ulps not computed

    @property
    def own(self) -> Judge | None:
        """The judge of the own-error comparison (the node rerun on torch inputs): the
        same verdict and the same compare function as the first comparison, so that
        whose error a value is is decided as whether it fails."""
        if self.policy is None and self.compare is None and self.measures:
            return None
        return self

    def apply(self, d: Any, expected: Any, got: Any) -> None:
        if self.policy is not None:
            conds = self.policy.conditions(value_dtype_name(expected))
            # a measure a dtype has not (ulps or SNR of integers and bools) does not judge
            # it; where none applies, the default verdict (exact for integers) stands
            conds = [c for c in conds or () if getattr(d, c.field, None) is not None]
            if conds:
                ok = all(c.holds(d) for c in conds) and not d.err_nan
                d.passed = ok and not d.dtype_mismatch
                failed = [
                    f"{c.text} ({_short(c.field)} {getattr(d, c.field):.3g})"
                    for c in conds
                    if not c.holds(d)
                ]
                if failed and not d.shape_mismatch and not d.dtype_mismatch:
                    # the reason in the policy's words, not in atol/rtol's
                    d.note = f"{VERDICT_NOTE} {' and '.join(failed)}"
                d.decided = "the verdict " + " and ".join(c.text for c in conds)
        if self.compare is not None:
            self._user_check(d, expected, got)

    def _user_check(self, d: Any, expected: Any, got: Any) -> None:
        name = function_name(self.compare)
        try:
            e = to_torch(expected).detach()
            g = to_torch(got, e.device).detach()
            found = call_compare(self.compare, name, e, g)
        except CompareFunctionError as exc:  # that pair's error; the run goes on
            d.error = str(exc)
            d.passed = None
            return
        except Exception as exc:
            d.error = f"compare function {name}: the values could not be given to it ({exc})"
            d.passed = None
            return
        if found.passed is not None:
            d.passed = found.passed and not d.shape_mismatch
            d.decided = f"your compare function {name}"
        d.extra = found.extra or None


# the measures computed whatever ``measures=`` says
_ALWAYS = frozenset({"err_abs", "err_rel", "err_nan", "err_h01", "err_h001"})


def make_judge(verdict: Any, compare: Any, measures: bool = True) -> Judge | None:
    """The judge of ``verdict=``, ``compare=`` and ``measures=`` (None when it would
    change nothing); bad values raise SbsInputError before anything runs."""
    policy = None if verdict is None else VerdictPolicy(verdict)
    if policy is not None and not measures:
        named = {c.field for conds in policy.all_conditions() for c in conds} - _ALWAYS
        if named:
            raise SbsInputError(
                f"verdict names {', '.join(sorted(named))} but measures=False does not "
                "compute it: drop measures=False (--no-measures) or judge on abs/rel"
            )
    if compare is not None and not callable(compare):
        raise SbsInputError(
            f"compare must be a function f(expected, got) -> dict, got {type(compare).__name__}"
        )
    if policy is None and compare is None and measures:
        return None
    return Judge(policy, compare, measures)


def _import_from_cwd(name: str) -> Any:
    """``import name`` with the current folder searched first, as ``python -m`` does:
    the ``onnx-sbs`` console script's own path is its bin folder, where a user's
    ``mycheck.py`` beside their models is not."""
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(name)
    finally:
        if added and cwd in sys.path:
            sys.path.remove(cwd)


def load_compare_function(spec: str) -> Callable:
    """``module:fn`` (a module importable by name) or ``path/to/file.py:fn``: the
    function the user named on their own command line."""
    where, sep, name = spec.rpartition(":")
    if not sep or not where or not name.isidentifier():
        raise SbsInputError(
            f"--compare-func {spec!r}: write module:function or path/to/file.py:function"
        )
    try:
        if where.endswith(".py") or "/" in where or "\\" in where:
            path = Path(where)
            if not path.is_file():
                raise SbsInputError(f"--compare-func: no file {where!r}")
            mod_name = f"_sbs_compare_{abs(hash(str(path.resolve())))}"
            spec_ = importlib.util.spec_from_file_location(mod_name, path)
            if spec_ is None or spec_.loader is None:
                raise SbsInputError(f"--compare-func: cannot load {where!r} as Python")
            module = importlib.util.module_from_spec(spec_)
            sys.modules[mod_name] = module
            spec_.loader.exec_module(module)
        else:
            module = _import_from_cwd(where)
    except SbsInputError:
        raise
    except Exception as exc:
        raise SbsInputError(
            f"--compare-func {spec!r}: importing {where!r} failed: {type(exc).__name__}: {exc}"
        ) from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise SbsInputError(f"--compare-func {spec!r}: {where!r} has no function {name!r}")
    return fn


__all__ = [
    "ALIASES",
    "Condition",
    "Judge",
    "MEASURES",
    "VerdictPolicy",
    "load_compare_function",
    "make_judge",
    "parse_condition",
]
