"""The torch side in the user's words: their fx node names, module paths, source lines.

The engine runs the program the exporter prepared (decomposed, renamed: ``add_6``,
``view``), but the user reads ``print(ep.graph)`` (``add``, ``reshape``) and their own
code.  Each prepared node keeps its provenance in ``meta["from_node"]`` (a tree of the
nodes it was made from, through every pass), ``meta["nn_module_stack"]`` and
``meta["stack_trace"]``; this module turns those into three strings per node.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from typing import Any

import torch

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
# frames inside these packages are machinery, not the user's model code
_MACHINERY = (os.sep + "torch" + os.sep, os.sep + "onnxscript" + os.sep)
# a line that only hands its arguments on (`return func(*args, **kwargs)`, `return
# self._fn(self, *args, **kw)`): a decorator's or a kernel hub's wrapper, whichever
# package it lives in; the line that called it says what the model does
_FORWARDING = re.compile(
    r"^(return\s+)?(\w+\s*=\s*)?[\w.\[\]'\"]+\((\s*\w+\s*,)*\s*\*\w+\s*,\s*\*\*\w+\s*\)$"
)


@dataclass(frozen=True, slots=True)
class Provenance:
    user_name: str | None = None
    module: str | None = None
    source: str | None = None


def _sources(node: torch.fx.Node) -> list[Any]:
    return list(node.meta.get("from_node") or ())


def user_node_name(node: torch.fx.Node, user_names: set[str]) -> str | None:
    """The name of the node of the user's graph this prepared node descends from.

    Breadth-first over the provenance tree, so the nearest ancestor that the user's graph
    holds wins (a decomposition's pieces all name the op they decompose).
    """
    if node.name in user_names and (node.op == "placeholder" or not _sources(node)):
        return node.name
    queue = _sources(node)
    seen = 0
    while queue and seen < 256:
        src = queue.pop(0)
        seen += 1
        name = getattr(src, "name", None)
        if name in user_names:
            return name
        queue.extend(getattr(src, "from_node", None) or ())
    return node.name if node.name in user_names else None


def module_path(meta: dict[str, Any]) -> str | None:
    """The innermost module of ``nn_module_stack``, e.g. ``model.layers.0.mlp.down_proj``."""
    stack = meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1]
    path = path[0] if isinstance(path, tuple | list) else path
    return str(path) or None


# stack trace -> its source line: the nodes of one line of code (a layer's code, run for
# every layer) share their trace, which is parsed once
_SOURCE_LINES: dict[str, str | None] = {}


def source_line(meta: dict[str, Any]) -> str | None:
    """The innermost frame of the stack trace outside torch: ``file.py:12 in f: code``."""
    trace = meta.get("stack_trace")
    if not trace:
        return None
    try:
        return _SOURCE_LINES[trace]
    except KeyError:
        pass
    text = _parse_source_line(trace)
    if len(_SOURCE_LINES) >= 512:  # traces are kilobytes each
        _SOURCE_LINES.clear()
    _SOURCE_LINES[trace] = text
    return text


def _parse_source_line(trace: str) -> str | None:
    lines = trace.rstrip().splitlines()
    frames: list[tuple[str, str, str, str]] = []
    for i, text in enumerate(lines):
        m = _FRAME.match(text)
        if m:
            code = (
                lines[i + 1].strip()
                if i + 1 < len(lines) and not _FRAME.match(lines[i + 1])
                else ""
            )
            frames.append((m["file"], m["line"], m["func"], code))
    if not frames:
        return None
    # the innermost frame of the user's or the model library's code: not torch's, not a
    # wrapper that only forwards its arguments (the whole stack is in the node's detail)
    chosen = next(
        (f for f in reversed(frames) if not _is_machinery(f[0]) and not _FORWARDING.match(f[3])),
        None,
    ) or next((f for f in reversed(frames) if not _is_machinery(f[0])), frames[-1])
    file, line, func, code = chosen
    text = f"{_short_path(file)}:{line} in {func}"
    return f"{text}: {code}" if code else text


def module_of_node_name(name: str) -> str | None:
    """The module path in a TorchScript node name: ``/blocks/blocks.0/conv/Conv`` ->
    ``blocks.0.conv`` (each scope is the attribute, or the qualified child name of a
    container's item), None for a name without scopes."""
    if not name.startswith("/"):
        return None
    scopes = [s for s in name.split("/")[1:-1] if s]
    path = ""
    for s in scopes:
        path = s if not path or s.startswith(path + ".") else f"{path}.{s}"
    return path or None


def onnx_node_provenance(node: Any) -> Provenance:
    """Module path and source line an exported ONNX node carries in its metadata
    (``pkg.torch.onnx.name_scopes``, ``pkg.torch.onnx.stack_trace``): the reference of
    ``onnx-sbs diff`` is a model, and its culprit is named in the same words."""
    props = {p.key: p.value for p in node.metadata_props}
    module = None
    scopes = props.get("pkg.torch.onnx.name_scopes")
    if scopes and len(scopes) < 4096:  # a list's repr: ['', 'model', 'layers.0', 'add']
        try:
            parts = ast.literal_eval(scopes)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            parts = None
        if isinstance(parts, list) and all(isinstance(x, str) for x in parts):
            # the last scope is the fx node itself, the first the root module
            module = _scope_path([x for x in parts[:-1] if x])
    if module is None:  # a TorchScript export's scopes are in the node's name
        module = module_of_node_name(node.name)
    trace = props.get("pkg.torch.onnx.stack_trace")
    return Provenance(module=module, source=source_line({"stack_trace": trace}) if trace else None)


def _scope_path(scopes: list[str]) -> str | None:
    """The module path of nested name scopes: the exporter writes each scope as its
    full path (``['m', 'm.blocks.0', 'm.blocks.0.lin']``), so the innermost one is the
    path; a scope that is a relative name is joined to the one around it."""
    path = ""
    for s in scopes:
        path = s if not path or s == path or s.startswith(path + ".") else f"{path}.{s}"
    return path or None


def _is_machinery(path: str) -> bool:
    return any(m in path for m in _MACHINERY)


def _short_path(path: str) -> str:
    marker = "site-packages" + os.sep
    k = path.rfind(marker)
    return path[k + len(marker) :] if k >= 0 else path


def program_provenance(
    prepared: torch.fx.Graph,
    user_graph: torch.fx.Graph | None,
    weights: dict[str, str] | None = None,
) -> dict[str, Provenance]:
    """Provenance of every node of the prepared graph, by node name.

    ``weights`` maps weight placeholders to their state-dict names: a weight's module is
    the module that owns it (``model.layers.0.mlp.up_proj`` for ``...up_proj.weight``).
    """
    weights = weights or {}
    user_nodes = {n.name: n for n in user_graph.nodes} if user_graph is not None else {}
    names = set(user_nodes)
    result: dict[str, Provenance] = {}
    for node in prepared.nodes:
        if node.op == "output":
            continue
        user = user_node_name(node, names) if names else node.name
        target = weights.get(node.name)
        if node.op == "placeholder":
            owner = target.rpartition(".")[0] if target else None
            result[node.name] = Provenance(user or node.name, owner or None, None)
            continue
        origin = user_nodes.get(user) if user else None
        meta = node.meta
        module = module_path(meta) or (module_path(origin.meta) if origin is not None else None)
        source = source_line(meta) or (source_line(origin.meta) if origin is not None else None)
        result[node.name] = Provenance(user, module, source)
    return result


__all__ = [
    "Provenance",
    "module_of_node_name",
    "module_path",
    "program_provenance",
    "source_line",
    "user_node_name",
]
