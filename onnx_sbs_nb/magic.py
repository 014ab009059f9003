"""``%sbs``: run the side-by-side comparison of an exported program and its ONNX model.

    %load_ext onnx_sbs_nb
    %sbs ep onx inputs --atol 1e-4 --own-error
    %sbs model.pt2 model.onnx inputs.pt --background -o w

Each of EP, ONNX and INPUTS is a variable of the user's namespace or a file path.  The
magic displays an :class:`~onnx_sbs_nb.widget.SbsWidget` (the run executes in the cell
unless ``--background``); ``-o NAME`` also stores the widget in the namespace as NAME, and
the last one is always available as ``_sbs``.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from .errors import SbsInputError
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
    raise SbsMagicError(
        f"%sbs: {what} {token!r} is neither a variable of the notebook nor an existing file"
    )


def parse_line(line: str, namespace: dict[str, Any]) -> tuple[dict[str, Any], argparse.Namespace]:
    """The SbsWidget keyword arguments for one ``%sbs`` line, and the parsed options."""
    try:
        argv = shlex.split(line)
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


def sbs_magic(line: str, ipython: Any) -> None:
    from IPython.display import display

    from .widget import SbsWidget

    kwargs, ns = parse_line(line, ipython.user_ns)
    widget = SbsWidget(**kwargs)
    ipython.user_ns[LAST_WIDGET_NAME] = widget
    if ns.out:
        ipython.user_ns[ns.out] = widget
    display(widget)  # runs in the cell unless --background


def load_ipython_extension(ipython: Any) -> None:
    """Registers ``%sbs`` (``%load_ext onnx_sbs_nb``)."""

    from IPython.core.error import UsageError

    def sbs(line: str) -> None:
        try:
            sbs_magic(line, ipython)
        except SbsMagicError as e:
            # IPython shows a UsageError as its message alone, without a traceback
            raise UsageError(str(e)) from None

    sbs.__doc__ = __doc__
    ipython.register_magic_function(sbs, magic_kind="line", magic_name="sbs")
