"""The input and output types a ``.pt2`` needs registered before torch can load it.

A program whose forward returns a class of its own (a transformers ``ModelOutput``, a
dataclass) is saved with that class's name in its input and output specs.  Loading looks
the name up in torch's pytree registry, which only the module defining the class fills
(transformers registers its outputs when imported).  When it is missing, torch logs the
reason as a warning and raises "check the warnings above".  This module reads the names
from the archive's JSON (no code runs) so the message can say which type is missing
and how to register it.
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# a program's JSON larger than this is no program torch wrote (pt2_sizes.py bounds it too)
_MAX_JSON = 256 << 20
_SPEC_KEYS = ("in_spec", "out_spec")


def unregistered_types(path: str | Path) -> list[str]:
    """The pytree type names in the program's specs that this process cannot load, in
    the order found; empty when none is missing or the archive cannot be read."""
    from torch.utils._pytree import SERIALIZED_TYPE_TO_PYTHON_TYPE

    found: list[str] = []
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                parts = info.filename.split("/")
                if len(parts) < 2 or parts[-2] != "models" or not parts[-1].endswith(".json"):
                    continue
                if info.file_size > _MAX_JSON:
                    continue
                for name in _spec_types(json.loads(z.read(info))):
                    if name not in SERIALIZED_TYPE_TO_PYTHON_TYPE and name not in found:
                        found.append(name)
    except (OSError, ValueError, zipfile.BadZipFile, RecursionError):
        return []
    return found


def _spec_types(doc: Any) -> Iterator[str]:
    """Every type name in the treespecs of a serialized program (JSON strings under
    ``in_spec`` / ``out_spec``, each ``[protocol, schema]``)."""
    stack = [doc]
    while stack:
        o = stack.pop()
        if isinstance(o, dict):
            for k, v in o.items():
                if k in _SPEC_KEYS and isinstance(v, str):
                    try:
                        spec = json.loads(v)
                    except ValueError:
                        continue
                    yield from _schema_types(spec[1] if isinstance(spec, list) and spec else spec)
                else:
                    stack.append(v)
        elif isinstance(o, list):
            stack.extend(o)


def _schema_types(schema: Any) -> Iterator[str]:
    stack = [schema]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict):
            continue
        if isinstance(node.get("type"), str):
            yield node["type"]
        children = node.get("children_spec")
        if isinstance(children, list):
            stack.extend(reversed(children))


def _safe(name: str) -> str:
    ok = name.isascii() and name.isprintable() and len(name) <= 200 and "`" not in name
    return name if ok else ascii(name[:200])


def unregistered_types_message(path: str | Path, names: list[str]) -> str:
    """What the user reads: the types, why they are missing, the two ways out."""
    names = [_safe(n) for n in names]  # names from the file reach a terminal
    shown = ", ".join(names[:3]) + (f" (and {len(names) - 3} more)" if len(names) > 3 else "")
    module = names[0].rpartition(".")[0] or names[0]
    return (
        f"{str(path)!r} cannot be loaded here: its program takes or returns {shown}, a "
        "type not registered for loading in this process (torch's pytree registry; "
        "onnx-sbs never imports a module a file names). Either import the module that "
        f"registers it before loading, in Python (`import {module}`, then "
        "run_aligned/SbsWidget on the file; or "
        "torch.utils._pytree.register_pytree_node(cls, flatten, unflatten, "
        f"serialized_type_name={names[0]!r})), or export a program returning tensors, "
        "tuples or dicts (transformers: return_dict=False) and save it again"
    )


__all__ = ["unregistered_types", "unregistered_types_message"]
