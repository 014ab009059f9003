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
something else than a dict, makes that pair's error, and the run goes on.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .convert import to_torch
from .diff import value_dtype_name
from .errors import SbsInputError

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
        raise SbsInputError(f"a verdict must be a string such as 'snr>=30', got {text!r}")
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
                    self._by_dtype[key.replace("torch.", "")] = conds
        else:
            self._other = _conditions(spec, "verdict")

    def conditions(self, dtype: str) -> tuple[Condition, ...] | None:
        """The conditions for values of ``dtype``; None: the atol/rtol verdict."""
        return self._by_dtype.get(dtype, self._other)

    def all_conditions(self) -> list[tuple[Condition, ...]]:
        return [c for c in (self._other, *self._by_dtype.values()) if c]

    def describe(self) -> Any:
        if isinstance(self.spec, Mapping):
            return {k: v if isinstance(v, str | None) else list(v) for k, v in self.spec.items()}
        return self.spec if isinstance(self.spec, str) else list(self.spec)


def _plain(v: Any) -> Any:
    """A value of the user's dict as a plain record value (str for anything else)."""
    if isinstance(v, np.generic) or (isinstance(v, torch.Tensor) and v.numel() == 1):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)  # "inf", "nan": JSON (the widget's) has no such numbers
    if v is None or isinstance(v, bool | int | float | str):
        return v
    return str(v)[:200]


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
            if conds is not None:
                ok = all(c.holds(d) for c in conds) and not d.err_nan
                d.passed = ok and not d.dtype_mismatch
                d.decided = "the verdict " + " and ".join(c.text for c in conds)
        if self.compare is not None:
            self._user_check(d, expected, got)

    def _user_check(self, d: Any, expected: Any, got: Any) -> None:
        name = function_name(self.compare)
        try:
            e = to_torch(expected).detach()
            g = to_torch(got, e.device).detach()
            found = self.compare(e, g)
        except Exception as exc:  # the user's code: its failure is this pair's error
            d.error = f"compare function {name} raised {type(exc).__name__}: {exc}"
            d.passed = False
            return
        if not isinstance(found, Mapping):
            d.error = f"compare function {name} returned a {type(found).__name__}, not a dict"
            d.passed = False
            return
        extra = {}
        for key, value in found.items():
            if key == "passed":
                if not isinstance(value, bool | np.bool_):
                    d.error = f"compare function {name} returned passed={value!r}: not a bool"
                    d.passed = False
                    continue
                d.passed = bool(value) and not d.shape_mismatch
                d.decided = f"your compare function {name}"
            else:
                extra[str(key)] = _plain(value)
        d.extra = extra or None


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
            module = importlib.import_module(where)
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
