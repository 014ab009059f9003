"""Loading a ``.pt2`` someone else wrote without running code from it.

``torch.export.load`` trusts the file.  In torch 2.13 a ``.pt2`` can run code while it
loads, or later when the program is decomposed, in five ways:

1. pickles: the sample inputs go through ``torch.load(weights_only=True)`` and, when that
   fails, ``torch.load(weights_only=False)``; pickled weights and constants (tensor
   subclasses) through ``torch.load(weights_only=False)``; opaque objects through
   ``pickle.loads``;
2. symbolic shapes: every ``expr_str`` of the program's JSON goes to ``sympy.sympify``,
   which evaluates the string with Python's ``eval``;
3. guards: the strings of ``guards_code`` are ``exec``-ed into a function the first time
   the program is unlifted (``ep.module()``, ``ep.run_decompositions()``);
4. compiled models: an AOTInductor model inside the archive is a shared library, loaded
   (native code) by ``torch.export.load``;
5. operators: a node's target is any attribute path under ``torch``, ``math`` or
   ``operator`` (torch's own verifier, which every ExportedProgram runs, rejects those
   that are not operators).

:func:`load_untrusted` closes 1-4 while torch loads: every ``torch.load`` is forced to
weights-only (``TORCH_FORCE_WEIGHTS_ONLY_LOAD``, read at each call), ``pickle.loads``
goes through torch's weights-only unpickler, symbolic expressions are checked to be
arithmetic before sympy sees them, compiled models are refused, and guard strings that
are not plain conditions on input sizes are dropped (they only re-check inputs in
``ep.module()``; the run checks its inputs itself).  A file whose content needs more
raises :class:`UntrustedContentError`.  What torch logs while it loads goes to this
module's logger at debug level.
"""

from __future__ import annotations

import ast
import contextlib
import io
import keyword
import logging
import os
import pickle
import re
import threading
import tokenize
import warnings
from collections.abc import Iterator
from typing import Any, NoReturn

import torch

log = logging.getLogger(__name__)

#: What the user can do about a refused file.
TRUST_HINT = (
    "if you trust where the file comes from, load it as torch.export.load does with "
    "trust_pickles=True (--trust-pickles for `onnx-sbs run` and %sbs)"
)

# torch modules whose globals are wrapped while a file loads (tested against the
# installed torch: a rename there must fail a test, not silently lose a guard)
PACKAGE_MODULE = "torch.export.pt2_archive._package"
SERIALIZE_MODULE = "torch._export.serde.serialize"
_TORCH_LOGGERS = ("torch.export", PACKAGE_MODULE, SERIALIZE_MODULE)
_ENV_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_ENV_NO_FORCE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
# the patched globals and the environment are process-wide: one load at a time
_LOCK = threading.RLock()


class UntrustedContentError(Exception):
    """Content of the file that only loads by running code from it (``reason`` says what).

    Not a RuntimeError: ``torch.export.load`` catches those and retries the file as an
    older format, which would hide the reason.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _Guard:
    """What one load refused or left out."""

    def __init__(self) -> None:
        self.refusals: list[str] = []
        self.notes: list[str] = []

    def refuse(self, reason: str) -> NoReturn:
        self.refusals.append(reason)
        raise UntrustedContentError(reason)


# ---- 1. pickles --------------------------------------------------------------------------

_GLOBAL = re.compile(r"GLOBAL (\S+) was not an allowed global")
_REDUCE = re.compile(r"unrecognized function (.+?)(?: \(|$)", re.M)


def unpickling_reason(e: BaseException) -> str | None:
    """What a refusal of torch's weights-only unpickler names, or None if ``e`` is not one."""
    text = str(e)
    if not isinstance(e, pickle.UnpicklingError) or "Weights only load failed" not in text:
        return None
    found = _GLOBAL.search(text) or _REDUCE.search(text)
    if found:
        what = f"calls {found.group(1).rstrip('.')}"
    else:
        first = text.split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
        what = f"needs more than tensors ({first[0] if first else 'unknown'})"
    return (
        f"a pickle in it {what} (torch.serialization.add_safe_globals([...]) allows a "
        "class you trust)"
    )


def _weights_only_loads(guard: _Guard, data: bytes) -> Any:
    from torch import _weights_only_unpickler

    try:
        return _weights_only_unpickler.load(io.BytesIO(data), encoding="utf-8")
    except pickle.UnpicklingError as e:
        guard.refuse(f"an opaque object in it is a pickle that needs code to load ({e})")


class _PickleModule:
    """``pickle`` as ``_package`` sees it while loading: ``loads`` is weights-only."""

    def __init__(self, guard: _Guard) -> None:
        self._guard = guard

    def loads(self, data: bytes, *args: Any, **kwargs: Any) -> Any:
        return _weights_only_loads(self._guard, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(pickle, name)


# ---- 2. symbolic expressions -------------------------------------------------------------

_EXPR_OPS = frozenset("+ - * / ** // % ( ) , = < > <= >= == != & | ~ ^".split())
_EXPR_STRING = re.compile(r"""^(?:'[\w.+-]*'|"[\w.+-]*")$""")
_EXPR_TOKENS = frozenset(
    {tokenize.NAME, tokenize.NUMBER, tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER}
)
# sympy functions that are plain Python functions, not sympy classes, and only compute
_SYMPY_FUNCTIONS = frozenset({"sqrt"})
_sympy_names: dict[str, bool] | None = None


def _sympy_namespace() -> dict[str, bool]:
    """Each name ``sympify`` resolves by itself -> whether it is a mathematical object."""
    global _sympy_names
    if _sympy_names is None:
        import builtins

        import sympy

        ns: dict[str, Any] = {}
        exec("from sympy import *", ns)  # what sympify's parser evaluates strings in
        names = {n: False for n in dir(builtins)}
        for n, v in ns.items():
            names[n] = (isinstance(v, type) and issubclass(v, sympy.Basic)) or isinstance(
                v, sympy.Basic
            )
        names.update(dict.fromkeys(_SYMPY_FUNCTIONS, True))
        names.update({"True": True, "False": True})
        _sympy_names = names
    return _sympy_names


def unsafe_sym_expr(text: str, local_names: Any = ()) -> str | None:
    """Why ``text`` is not an arithmetic expression that sympy may parse, or None.

    torch writes expressions with ``srepr``: ``Add(Mul(Integer(2), Symbol('s17',
    positive=True, integer=True)), Integer(1))``.  Allowed: numbers, arithmetic and
    comparison operators, parentheses, commas, keyword arguments, string literals that
    are a name or a number (a symbol's name, a Float's digits), sympy's mathematical
    classes and constants, names ``sympify`` makes symbols of, and ``local_names`` (the
    deserializer's own functions and symbols).  Not allowed: attribute access,
    subscripts, builtins, sympy's Python functions (``sympify``, ``lambdify``, ...) and
    any other string (sympy's classes sympify their string arguments with ``eval``).
    """
    if not isinstance(text, str):
        return None
    known = _sympy_namespace()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text.strip()).readline))
    except (tokenize.TokenError, SyntaxError) as e:
        return f"it does not tokenize ({e})"
    for k, tok in enumerate(tokens):
        if tok.type == tokenize.OP:
            if tok.string not in _EXPR_OPS:
                return f"it uses {tok.string!r}"
            continue
        if tok.type == tokenize.STRING:
            if not _EXPR_STRING.match(tok.string):
                return f"it holds the string {tok.string[:40]}"
            continue
        if tok.type not in _EXPR_TOKENS:
            return f"it holds {tokenize.tok_name[tok.type]} {tok.string!r}"
        if tok.type != tokenize.NAME:
            continue
        name = tok.string
        if name.startswith("_") or (keyword.iskeyword(name) and name not in known):
            return f"it names {name!r}"
        if k + 1 < len(tokens) and tokens[k + 1].string == "=":
            continue  # a keyword argument: positive=True
        if name in local_names:
            continue
        if name in known and not known[name]:
            return f"it calls {name!r}"
    return None


class _SympyModule:
    """``sympy`` as the deserializer sees it while loading: ``sympify`` checks its input."""

    def __init__(self, guard: _Guard) -> None:
        import sympy

        self._guard = guard
        self._sympy = sympy

    def sympify(self, a: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(a, str):
            local_names = kwargs.get("locals") or (args[0] if args else None) or {}
            why = unsafe_sym_expr(a, local_names)
            if why is not None:
                self._guard.refuse(
                    f"a symbolic shape expression in it is not arithmetic ({why}): {a[:120]!r}"
                )
        return self._sympy.sympify(a, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sympy, name)


class _TypingModule:
    """``typing`` as the deserializer sees it while loading: ``get_type_hints`` answers
    once per schema class.  The deserializer asks it again for every object it rebuilds
    (every node, argument and tensor description): about half of what deserializing a
    ``.pt2`` costs.  The schema classes do not change during a load, nor do their hints."""

    def __init__(self) -> None:
        import typing

        self._typing = typing
        self._hints: dict[tuple, dict[str, Any]] = {}

    def get_type_hints(
        self, obj: Any, globalns: Any = None, localns: Any = None, include_extras: bool = False
    ) -> dict[str, Any]:
        try:
            key = (obj, id(globalns), id(localns), include_extras)
            hints = self._hints.get(key)
        except TypeError:  # an unhashable object: asked as it comes
            return self._typing.get_type_hints(obj, globalns, localns, include_extras)
        if hints is None:
            hints = self._typing.get_type_hints(obj, globalns, localns, include_extras)
            self._hints[key] = hints
        return dict(hints)  # the caller's own copy, as typing gives

    def __getattr__(self, name: str) -> Any:
        return getattr(self._typing, name)


# ---- 3. guards ---------------------------------------------------------------------------

# what torch writes in guards: sizes of inputs (L['x'].size()[0]), comparisons, arithmetic
# and the functions of SYMPY_INTERP and math
_GUARD_NAMES = frozenset(
    {"L", "math", "torch", "inf", "Max", "Min", "Abs", "Mod"}
    | {"int", "float", "bool", "abs", "min", "max", "round"}  # builtins on numbers only
)
_GUARD_ATTRS = frozenset(
    {
        "size",
        "stride",
        "storage_offset",
        "dim",
        "numel",
        "isnan",
        "isinf",
        "isfinite",
        "floor",
        "ceil",
        "trunc",
        "sqrt",
        "inf",
        "sym_int",
        "sym_float",
        "sym_max",
        "sym_min",
        "sym_not",
        "sym_ite",
        "sym_sqrt",
        "sym_sum",
    }
)
_GUARD_NODES = (
    ast.Expression,
    ast.Compare,
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Subscript,
    ast.Call,
    ast.Name,
    ast.Attribute,
    ast.Constant,
    ast.Tuple,
    ast.Load,
    ast.boolop,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
)
_GUARD_KEY = re.compile(r"^\w*$")


def unsafe_guard(code: str) -> str | None:
    """Why a guard string is not a plain condition on input sizes, or None when it is.

    torch pastes the guard into generated source (``torch._assert(<guard>, "Guard failed:
    <guard>")``) and executes it: only names, attributes and string keys from a small set
    pass, so the guard can neither reach other code nor close the message's quotes.
    """
    if not isinstance(code, str):
        return "it is not a string"
    try:
        tree = ast.parse(code, mode="eval")
    except SyntaxError as e:
        return f"it does not parse ({e.msg})"
    for node in ast.walk(tree):
        if not isinstance(node, _GUARD_NODES):
            return f"it holds a {type(node).__name__}"
        if isinstance(node, ast.Name) and node.id not in _GUARD_NAMES:
            return f"it names {node.id!r}"
        if isinstance(node, ast.Attribute) and node.attr not in _GUARD_ATTRS:
            return f"it reads .{node.attr}"
        if isinstance(node, ast.Call) and node.keywords:
            return "it passes keywords"
        if isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, str) and not _GUARD_KEY.match(v):
                return f"it holds the string {v!r}"
            if not isinstance(v, str | int | float | bool) and v is not None:
                return f"it holds a {type(v).__name__}"
    return None


def _drop_unsafe_guards(ep: torch.export.ExportedProgram, guard: _Guard) -> None:
    codes = getattr(ep, "_guards_code", None)
    if not codes:
        return
    kept = []
    for code in codes:
        why = unsafe_guard(code)
        if why is None:
            kept.append(code)
        else:
            guard.notes.append(f"a guard of the file was dropped ({why}): {str(code)[:120]!r}")
    ep._guards_code = kept


# ---- 4. compiled models ------------------------------------------------------------------


def _refuse_compiled(guard: _Guard) -> Any:
    def load_aoti(*args: Any, **kwargs: Any) -> NoReturn:
        guard.refuse(
            "it holds an AOTInductor-compiled model: a shared library that would run "
            "native code as it loads"
        )

    return load_aoti


# ---- the load ----------------------------------------------------------------------------


class _ToDebug(logging.Filter):
    """torch's records, re-logged here at debug level (the caller's message says enough)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            # a filter's exception reaches the caller (logging guards handlers only): torch
            # 2.13 logs its weights-only fallback with one argument for two %s
            message = f"{record.msg} {record.args!r}"
        log.debug(
            "torch (%s, %s): %s", record.name, record.levelname, message, exc_info=record.exc_info
        )
        return False


@contextlib.contextmanager
def torch_logs_to_debug() -> Iterator[None]:
    """What torch logs and warns while it loads a file goes to this module's debug log."""
    flt = _ToDebug()
    loggers = [logging.getLogger(name) for name in _TORCH_LOGGERS]
    for lg in loggers:
        lg.addFilter(flt)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield
        for w in caught:
            log.debug("torch warned: %s", w.message)
    finally:
        for lg in loggers:
            lg.removeFilter(flt)


@contextlib.contextmanager
def _patched(module: Any, name: str, value: Any) -> Iterator[None]:
    if not hasattr(module, name):
        log.debug("%s.%s is gone in this torch: not wrapped", module.__name__, name)
        yield
        return
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


@contextlib.contextmanager
def _environment(**values: str | None) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    for k, v in values.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_untrusted(path: str) -> tuple[torch.export.ExportedProgram, list[str]]:
    """``torch.export.load(path)`` without running code from the file.

    Returns the program and notes about what was left out (guards that are not plain
    size conditions).  Raises :class:`UntrustedContentError`
    when the program itself needs code to load; other exceptions are torch's own (a
    damaged or foreign file).
    """
    import importlib

    package = importlib.import_module(PACKAGE_MODULE)
    serialize = importlib.import_module(SERIALIZE_MODULE)
    guard = _Guard()
    with contextlib.ExitStack() as stack:
        stack.enter_context(_LOCK)
        stack.enter_context(_environment(**{_ENV_FORCE: "1", _ENV_NO_FORCE: None}))
        stack.enter_context(_patched(package, "pickle", _PickleModule(guard)))
        stack.enter_context(_patched(package, "_load_aoti", _refuse_compiled(guard)))
        stack.enter_context(_patched(serialize, "sympy", _SympyModule(guard)))
        stack.enter_context(_patched(serialize, "typing", _TypingModule()))
        try:
            ep = torch.export.load(path)
        except Exception as e:
            if guard.refusals:  # whatever torch made of our refusal, it is the reason
                raise UntrustedContentError(guard.refusals[0]) from e
            reason = unpickling_reason(e)
            if reason is not None:
                raise UntrustedContentError(reason) from e
            raise
    _drop_unsafe_guards(ep, guard)
    for note in guard.notes:
        log.debug("%s: %s", path, note)
    return ep, guard.notes


def load_trusted(path: str) -> torch.export.ExportedProgram:
    """``torch.export.load(path)``, pickles and all, with the type hints answered once."""
    import importlib

    serialize = importlib.import_module(SERIALIZE_MODULE)
    with _LOCK, _patched(serialize, "typing", _TypingModule()):
        return torch.export.load(path)


__all__ = [
    "TRUST_HINT",
    "UntrustedContentError",
    "load_trusted",
    "load_untrusted",
    "torch_logs_to_debug",
    "unpickling_reason",
    "unsafe_guard",
    "unsafe_sym_expr",
]
