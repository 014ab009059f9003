"""``%sbs``: run the side-by-side comparison of an exported program and its ONNX model.

    %load_ext onnx_sbs_nb
    %sbs ep onx inputs --atol 1e-4 --own-error
    w = %sbs model.pt2 model.onnx inputs.pt --background

Each of EP, ONNX and INPUTS is a variable of the user's namespace, a file path or a
Python expression of the notebook (``%sbs ep onx (x,)``; a list of inputs such as
``[(x,), (x + 1,)]`` is a run over many inputs).  The
magic returns an :class:`~onnx_sbs_nb.notebook.widget.SbsWidget` and shows it once (the run
executes in the cell unless ``--background``): ``w = %sbs ...`` binds it, as any line
magic's result; ``-o NAME`` also stores it as NAME, and the last one is always ``_sbs``.
In terminal IPython the widget's summary line is printed once, after the run.
"""

from __future__ import annotations

import argparse
import ast
import shlex
from pathlib import Path
from typing import Any

from ..errors import SbsInputError
from .run_args import add_run_arguments, options_from_args

LAST_WIDGET_NAME = "_sbs"


class SbsMagicError(ValueError):
    """Bad ``%sbs`` arguments; the message says which and how to fix them."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits the process by default
        raise SbsMagicError(f"%sbs: {message}\n\n{self.format_usage()}")

    def exit(self, status: int = 0, message: str | None = None) -> None:
        raise SbsMagicError(message or self.format_help())


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="%sbs", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("ep", help="ExportedProgram variable or .pt2 path")
    p.add_argument("onnx", help="onnx.ModelProto / ONNXProgram variable or .onnx path")
    p.add_argument("inputs", nargs="?", default=None, help="tuple/dict/tensor variable or .pt path")
    add_run_arguments(p)
    p.add_argument("--background", action="store_true", help="run in a thread")
    p.add_argument("--replay-root", default=None, help="folder for 'Save replay' bundles")
    p.add_argument("-o", "--out", default=None, help="store the widget in this variable")
    return p


def resolve(token: str, namespace: dict[str, Any], what: str) -> Any:
    """A value of the namespace (dotted names allowed), else an existing file path."""
    head, *rest = token.split(".")
    if head.isidentifier() and head in namespace:
        obj = namespace[head]
        for part in rest:
            if not hasattr(obj, part):
                raise SbsMagicError(f"%sbs: {what} {token!r}: {head!r} has no attribute {part!r}")
            obj = getattr(obj, part)
        return obj
    path = Path(token).expanduser()
    if path.exists():
        return str(path)
    try:
        # a Python expression of the notebook (`(x,)`, `[(x,), (x + 1,)]`, `d["a"]`): the
        # user's own code on their own line, evaluated as the cell would
        return eval(compile(token, f"<%sbs {what}>", "eval"), namespace)
    except Exception as e:
        why = f"{type(e).__name__}: {e}"
    raise SbsMagicError(
        f"%sbs: {what} {token!r} is neither a variable of the notebook nor an existing file, "
        f"and as a Python expression of the notebook it fails ({why})"
    )


_OPEN, _CLOSE, _QUOTES = "([{", ")]}", "'\""


def split_line(line: str) -> list[str]:
    """The words of a ``%sbs`` line as a shell splits them, except that a bracketed
    expression is one word with its spaces (``(x, y)``), kept as written."""
    words: list[str] = []
    word: list[str] = []
    depth, quote = 0, ""
    for ch in line:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in _QUOTES:
            quote = ch
        elif ch in _OPEN:
            depth += 1
        elif ch in _CLOSE:
            depth = max(0, depth - 1)
        elif ch.isspace() and depth == 0:
            if word:
                words.append("".join(word))
                word = []
            continue
        word.append(ch)
    if quote:
        raise ValueError("No closing quotation")
    if word:
        words.append("".join(word))
    # shell quoting applies to the plain words; an expression (brackets) keeps its quotes
    return [w if any(c in _OPEN for c in w) else _one_word(w) for w in words]


def _one_word(word: str) -> str:
    parts = shlex.split(word)
    return parts[0] if len(parts) == 1 else word


def parse_line(line: str, namespace: dict[str, Any]) -> tuple[dict[str, Any], argparse.Namespace]:
    """The SbsWidget keyword arguments for one ``%sbs`` line, and the parsed options."""
    try:
        argv = split_line(line)
    except ValueError as e:
        raise SbsMagicError(f"%sbs: cannot split the line: {e}") from None
    ns = make_parser().parse_args(argv)
    try:
        options = options_from_args(ns)
    except SbsInputError as e:
        raise SbsMagicError(f"%sbs: {e}") from None
    kwargs: dict[str, Any] = {
        "ep": resolve(ns.ep, namespace, "EP"),
        "onx": resolve(ns.onnx, namespace, "ONNX"),
        "inputs": resolve(ns.inputs, namespace, "INPUTS") if ns.inputs is not None else None,
        "options": options,
        "background": ns.background,
    }
    if ns.replay_root:
        kwargs["replay_root"] = ns.replay_root
    if ns.out is not None and not ns.out.isidentifier():
        raise SbsMagicError(f"%sbs: -o {ns.out!r} is not a valid variable name")
    return kwargs, ns


# The cell each shell is running (transformed as IPython runs it), kept by the
# pre/post_run_cell events the extension registers.
_RUNNING: dict[int, str] = {}


def _track_cells(ipython: Any) -> None:
    def pre(info: Any) -> None:
        cell = getattr(info, "transformed_cell", None)
        if cell is None:
            cell = ipython.transform_cell(getattr(info, "raw_cell", "") or "")
        _RUNNING[id(ipython)] = cell

    def post(_result: Any) -> None:
        _RUNNING.pop(id(ipython), None)

    ipython.events.register("pre_run_cell", pre)
    ipython.events.register("post_run_cell", post)


def _sbs_call(node: ast.AST | None) -> str | None:
    """The line of ``get_ipython().run_line_magic('sbs', line)`` (what IPython turns
    ``%sbs line`` into), else None."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "run_line_magic"
        and len(node.args) >= 2
        and all(isinstance(a, ast.Constant) for a in node.args[:2])
        and node.args[0].value == "sbs"
    ):
        return str(node.args[1].value)
    return None


def result_is_displayed(ipython: Any, line: str) -> bool:
    """Whether IPython will display what ``%sbs line`` returns: the rule its displayhook
    follows (``ast_node_interactivity``, a trailing ``;``), read on the cell being run."""
    from IPython.core.displayhook import DisplayHook

    if DisplayHook.semicolon_at_end_of_expression(line):
        return False  # silenced (the magic is marked output_can_be_silenced)
    cell = _RUNNING.get(id(ipython))
    if cell is None:
        return False  # not called from a cell being run (run_line_magic, a callback)
    try:
        body = ast.parse(cell).body
    except SyntaxError:  # a cell IPython could not have run: show it here
        return False
    calls = [c for c in ast.walk(ast.Module(body=body, type_ignores=[])) if _sbs_call(c)]

    def this(node: ast.AST | None) -> bool:
        found = _sbs_call(node)
        # one %sbs in the cell is this one; among several, the line tells (before $-expansion
        # it may differ, then this magic shows the widget itself)
        return found is not None and (len(calls) == 1 or found == line)

    mode = getattr(ipython, "ast_node_interactivity", "last_expr")
    last = body[-1] if body else None
    if mode == "all":
        return any(isinstance(n, ast.Expr) and this(n.value) for n in body)
    if mode in ("last_expr", "last"):
        return isinstance(last, ast.Expr) and this(last.value)
    if mode == "last_expr_or_assign":
        return isinstance(last, ast.Expr | ast.Assign | ast.AnnAssign) and this(last.value)
    return False


def sbs_magic(line: str, ipython: Any) -> Any:
    """Runs ``%sbs line``: returns the widget, shown once (here, unless IPython shows the
    result itself because the magic ends the cell)."""
    from IPython.display import display

    from .widget import SbsWidget

    kwargs, ns = parse_line(line.rstrip().removesuffix(";"), ipython.user_ns)
    widget = SbsWidget(**kwargs)
    ipython.user_ns[LAST_WIDGET_NAME] = widget
    if ns.out:
        ipython.user_ns[ns.out] = widget
    if not result_is_displayed(ipython, line):
        display(widget)  # runs in the cell unless --background
    return widget


def load_ipython_extension(ipython: Any) -> None:
    """Registers ``%sbs`` (``%load_ext onnx_sbs_nb``)."""

    from IPython.core.error import UsageError
    from IPython.core.magic import output_can_be_silenced

    @output_can_be_silenced  # `%sbs ...;` shows the widget without echoing it as a result
    def sbs(line: str) -> Any:
        try:
            return sbs_magic(line, ipython)
        except SbsMagicError as e:
            # IPython shows a UsageError as its message alone, without a traceback
            raise UsageError(str(e)) from None

    sbs.__doc__ = __doc__
    ipython.register_magic_function(sbs, magic_kind="line", magic_name="sbs")
    _track_cells(ipython)
