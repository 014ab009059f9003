"""Input shapes checked against what the program was exported for, before anything runs.

A program exported with static dimensions only computes those; one exported with dynamic
dimensions holds their ranges (``ep.range_constraints``), which dimensions must be equal
(the same symbol, or a derived one: ``s0 + 1``) and the guards its code made
(``ep._guards_code``).  Inputs are refused exactly where torch's own module
(``ep.module()``) refuses them, naming the input, the dimension, the guard and, where the
program still knows it, the source line that made the guard; anything else runs.

torch gives every dynamic dimension the lower bound 2 by convention (its 0/1
specialization); ``ep.module()`` accepts 0 and 1 there all the same, and so do we: a
lower bound is a guard only above 2.
"""

from __future__ import annotations

import ast
import math
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import SbsInputError


def _bound(value: Any) -> int | None:
    try:
        v = int(value)
    # an infinite bound; int() of torch's int_oo raises AttributeError inside sympy
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None
    return v


def _shape_env(program: torch.export.ExportedProgram) -> Any:
    """The shape environment of the export, when the program still holds it (a loaded
    ``.pt2`` does not): it knows where each range and guard came from."""
    for node in program.graph.nodes:
        if node.op != "placeholder":
            continue
        mode = getattr(node.meta.get("val"), "fake_mode", None)
        env = getattr(mode, "shape_env", None)
        if env is not None:
            return env
    return None


def _where(sloc: Any) -> str:
    """A guard's origin in words: the user's line, the dynamic_shapes given, torch's
    convention, or the ranges a loaded program was saved with; never a line of torch's
    own code (a loaded ``.pt2`` names its deserializer's)."""
    text = str(sloc or "").strip()
    if not text:
        return ""
    if "0/1 specialization" in text:
        return "torch's 0/1 specialization"
    if "fakify" in text or "non_strict_utils" in text:
        return "the dynamic_shapes given to the export"
    if getattr(sloc, "maybe_user_loc", None) is None and _in_torch(sloc):
        if "serde" in text:
            return "the ranges the program was saved with"
        return "torch's export"  # a frame of torch's own, which says nothing to the user
    return f"the line {text.strip('()')}"


def _in_torch(sloc: Any) -> bool:
    """Whether a guard's only location is a frame of torch's own code."""
    frame = getattr(sloc, "framework_loc", None)
    filename = getattr(frame, "filename", None)
    if not isinstance(filename, str):
        return False
    root = os.path.dirname(os.path.abspath(torch.__file__))
    return os.path.abspath(filename).startswith(root + os.sep)


def _dim_names(env: Any) -> dict[Any, str]:
    """symbol -> the name the user gave its dimension (``Dim("L")``), where the export's
    shape environment still knows it (a loaded ``.pt2`` does not): torch's ``s53`` means
    nothing to the user."""
    names = getattr(env, "source_name_to_debug_name", None) or {}
    found: dict[Any, str] = {}
    for symbol, sources in (getattr(env, "var_to_sources", None) or {}).items():
        for source in sources:
            name = names.get(getattr(source, "name", None))
            if name:
                found[symbol] = str(name)
                break
    return found


@dataclass
class _Sizes:
    """Symbols bound to the sizes seen so far, as torch's input check unifies them."""

    env: Any
    values: dict[Any, int] = field(default_factory=dict)  # symbol -> size
    seen: dict[Any, tuple[str, int, int]] = field(default_factory=dict)  # symbol -> first use

    def in_words(self, expr: Any) -> str:
        """``expr`` with each symbol under the name the user gave it ("L in "); "" for a
        lone symbol whose name is lost (a loaded ``.pt2``): ``s53`` says nothing."""
        names = _dim_names(self.env)
        symbols = getattr(expr, "free_symbols", set())
        if getattr(expr, "is_Symbol", False) and expr not in names:
            return ""
        subs = {s: names[s] for s in symbols if s in names}
        if not subs:
            return f"{expr} in "
        import sympy

        return f"{expr.subs({s: sympy.Symbol(n) for s, n in subs.items()})} in "

    def range_origin(self, symbol: Any, side: str) -> str:
        slocs = getattr(self.env, "var_to_range_sloc", None) or {}
        sloc = slocs.get(symbol)
        return _where(getattr(sloc, side, None)) if sloc is not None else ""


def _refuse_range(name: str, d: int, got: int, expr: Any, vr: Any, sizes: _Sizes) -> None:
    low, high = _bound(vr.lower), _bound(vr.upper)
    side = None
    # torch's module allows 0 and 1 below a lower bound of 2 (its convention)
    if low is not None and low > 2 and got < low:
        side = "lower"
    elif high is not None and got > high:
        side = "upper"
    if side is None:
        return
    origins = {sizes.range_origin(s, side) for s in getattr(expr, "free_symbols", ())} - {""}
    origin = f"; the bound comes from {', '.join(sorted(origins))}" if origins else ""
    raise SbsInputError(
        f"input {name!r} has size {got} in dimension {d}, outside the range the program "
        f"was exported for ({sizes.in_words(expr)}[{vr.lower}, {vr.upper}]), which "
        "torch's own module "
        f"refuses too{origin}: pass sizes in that range, or export with a wider Dim"
    )


def _unify(name: str, d: int, got: int, want: Any, sizes: _Sizes) -> None:
    """Binds the dimension's symbol to its size, refusing a size that contradicts an
    earlier binding (torch's equality and derived-dimension checks)."""
    import sympy
    from torch.utils._sympy.solve import try_solve

    expr = want.node.expr
    symbols = expr.free_symbols
    if len(symbols) != 1:
        return  # torch checks such dimensions at run time, in the program's asserts
    symbol = next(iter(symbols))
    if symbol in sizes.values:
        expected = expr.subs(symbol, sizes.values[symbol])
        if expected != got:
            other, od, osize = sizes.seen[symbol]
            if isinstance(expr, sympy.Symbol):
                raise SbsInputError(
                    f"input {name!r} has size {got} in dimension {d} but {other!r} has "
                    f"{osize} in dimension {od}: the program requires them equal ({symbol})"
                )
            raise SbsInputError(
                f"input {name!r} has size {got} in dimension {d} but {other!r} has {osize} "
                f"in dimension {od}: the program requires {expr} there, {expected} "
                f"(they are related through {symbol})"
            )
        return
    if isinstance(expr, sympy.Symbol):
        sizes.values[symbol] = got
    else:
        solution = try_solve(sympy.Eq(expr, got), symbol)
        if solution is None or not getattr(solution[1], "is_integer", False):
            raise SbsInputError(
                f"input {name!r} has size {got} in dimension {d}, which is not of the form "
                f"{expr} for an integer {symbol}, as the program requires"
            )
        sizes.values[symbol] = int(solution[1])
    sizes.seen[symbol] = (name, d, got)


def _guard_origins(env: Any) -> dict[str, str]:
    """{guard code: where it was made} for the guards torch kept in ``_guards_code``."""
    if env is None:
        return {}
    try:
        from torch.fx.experimental.symbolic_shapes import ShapeGuardPythonPrinter

        printer = ShapeGuardPythonPrinter(env.var_to_sources, lambda s: s.name, env.var_to_sources)
        return {printer.doprint(g.expr): _where(getattr(g, "sloc", "")) for g in env.guards}
    except Exception:  # a private API: without it the guard is named without its line
        return {}


class _Input:
    """``L['x']`` in a guard: the input's sizes, nothing else."""

    def __init__(self, value: torch.Tensor) -> None:
        self._shape = tuple(int(s) for s in value.shape)

    def size(self, dim: int | None = None) -> Any:
        return self._shape if dim is None else self._shape[dim]

    def dim(self) -> int:
        return len(self._shape)


# what a guard's arithmetic may do where this package evaluates it: torch writes sums,
# products, quotients and small powers of sizes; a file could write 2**2**64, 'a' * 10**10
# or 1 << 10**9, which would take the machine's time or memory
_CHEAP_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow)
_MAX_GUARD_CHARS = 4096
_MAX_INT = 2**63


def _cheap(code: str) -> bool:
    """A guard whose evaluation is bounded: small integers, no string arithmetic, powers
    only to a small constant exponent."""
    if len(code) > _MAX_GUARD_CHARS:
        return False
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError:
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            if abs(node.value) > _MAX_INT:
                return False
        if not isinstance(node, ast.BinOp):
            continue
        if not isinstance(node.op, _CHEAP_OPS):
            return False
        if any(
            isinstance(o, ast.Constant) and isinstance(o.value, str)
            for o in (node.left, node.right)
        ):
            return False
        if isinstance(node.op, ast.Pow) and not (
            isinstance(node.right, ast.Constant)
            and isinstance(node.right.value, int | float)
            and abs(node.right.value) <= 8
        ):
            return False
    return True


def _check_program_guards(
    program: torch.export.ExportedProgram, values: dict[str, Any], env: Any
) -> None:
    """Evaluates the guards the program's code made (``ep._guards_code``, which
    ``ep.module()`` runs) on the inputs they name; a guard naming an input that is not a
    plain tensor here is left to the run."""
    from .untrusted_pt2 import unsafe_guard

    codes = getattr(program, "_guards_code", None) or []
    if not codes:
        return
    inputs = {k: _Input(v) for k, v in values.items() if isinstance(v, torch.Tensor)}
    origins: dict[str, str] | None = None
    scope = {"L": inputs, "math": math, "torch": torch, "inf": math.inf}
    scope |= {f.__name__: f for f in (int, float, bool, abs, min, max, round)}
    for code in codes:
        if unsafe_guard(code) is not None or not _cheap(code):
            continue
        try:
            # the guard is a vetted expression over input sizes (unsafe_guard), as torch
            # itself pastes it into the code it runs
            tree = ast.parse(code, mode="eval")
            ok = eval(compile(tree, "<guard>", "eval"), {"__builtins__": {}}, scope)
        except Exception:
            continue  # an input it names is not a plain tensor here: the run decides
        if ok:
            continue
        if origins is None:
            origins = _guard_origins(env)
        where = origins.get(code, "")
        raise SbsInputError(
            f"the inputs break the program's guard {code!r}"
            + (f" (made by {where})" if where else "")
            + ": torch's own module refuses them too; pass inputs that hold it, or export "
            "again from inputs of that kind"
        )


def check_input_shapes(
    program: torch.export.ExportedProgram,
    values: dict[str, Any],
    user_inputs: list[str],
    exported: torch.export.ExportedProgram | None = None,
) -> None:
    """Raises SbsInputError when a user input's shape does not fit the program, as
    ``ep.module()`` decides it.  ``exported`` is the program as the user exported it (the
    prepared one may be a re-trace, without the export's guards and their origins)."""
    if exported is not None:
        names = {n.name for n in exported.graph.nodes if n.op == "placeholder"}
        if all(name in names for name in user_inputs):
            program = exported
    placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
    ranges = dict(program.range_constraints or {})
    sizes = _Sizes(_shape_env(program))
    for name in user_inputs:
        node = placeholders.get(name)
        value = values.get(name)
        expected = node.meta.get("val") if node is not None else None
        if not isinstance(expected, torch.Tensor) or not isinstance(value, torch.Tensor):
            continue
        if expected.dim() != value.dim():
            continue  # the rank check names this one
        for d, (want, got) in enumerate(zip(expected.shape, value.shape)):
            got = int(got)
            if isinstance(want, int):
                if want != got:
                    raise SbsInputError(
                        f"input {name!r} has size {got} in dimension {d} but the program was "
                        f"exported for {want} there (shape {tuple(expected.shape)}): pass "
                        "inputs of the exported shape, or export with dynamic_shapes="
                    )
                continue
            _unify(name, d, got, want, sizes)
            expr = want.node.expr
            if expr in ranges:
                _refuse_range(name, d, got, expr, ranges[expr], sizes)
    _check_program_guards(program, values, sizes.env)


__all__ = ["check_input_shapes"]
