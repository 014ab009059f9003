"""Which ops the exporter decomposes before lowering, and with what.

``torch.onnx.export`` decomposes every op that has a decomposition and no ONNX function
in onnxscript's torchlib.  Knowing which ops those are means building torchlib's registry:
importing onnxscript and compiling its ~500 functions, about 3 seconds, for a set of op
names that only changes with the installed torch and onnxscript.  The names are kept in
a small JSON file per version pair (see :mod:`.disk_cache`), so later processes read
them instead; the decomposition functions themselves come from torch's own tables.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..disk_cache import read_json, versions, write_json

_CIA = torch._C.DispatchKey.CompositeImplicitAutograd
_FORMAT = 2
# torch's registries of decomposition functions, where a decomposed op's function is found
_TABLES = ("post_autograd", "pre_autograd", "meta")


@dataclass(frozen=True)
class ExporterOps:
    """The exporter's decisions, by op name (``str(op)``, e.g. ``aten.add.Tensor``).

    ``python``: ops its table decomposes with a Python decomposition;
    ``cia``: CompositeImplicitAutograd ops its table decomposes (with their own kernel);
    ``preserved``: CompositeImplicitAutograd ops it keeps (they have an ONNX function);
    ``cia_functions``: the ops of ``cia`` it decomposes with a Python function instead of
    their kernel (``_fused_rms_norm``, ``one_hot``...), with the registry of
    ``torch._decomp.global_decomposition_table`` that holds the function.
    A CompositeImplicitAutograd op in none of these is not functional: the re-trace
    always decomposes it with its kernel.
    """

    python: frozenset[str]
    cia: frozenset[str]
    preserved: frozenset[str]
    cia_functions: frozenset[tuple[str, str]] = frozenset()
    _memo: dict[Any, bool] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def decomposes(self, target: Any) -> bool:
        known = self._memo.get(target)
        if known is None:
            known = self._memo[target] = self._decomposes(target)
        return known

    def _decomposes(self, target: Any) -> bool:
        if not isinstance(target, torch._ops.OpOverload):
            return False
        name = str(target)
        if name in self.python or name in self.cia:
            return True
        if name in self.preserved:
            return False
        return torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), _CIA)

    def table_names(self) -> frozenset[str]:
        """The ops of the exporter's decomposition table."""
        return self.python | self.cia

    def python_table(self) -> dict[Any, Callable[..., Any]]:
        return _python_table(self.python)

    def preserved_ops(self) -> list[Any]:
        return [op for op in map(_resolve, sorted(self.preserved)) if op is not None]

    def cia_overrides(self) -> dict[Any, Callable[..., Any]]:
        """The Python functions the re-trace decomposes ``cia_functions``' ops with."""
        return _cia_overrides(self.cia_functions)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "python": sorted(self.python),
            "cia": sorted(self.cia),
            "preserved": sorted(self.preserved),
            "cia_functions": sorted(map(list, self.cia_functions)),
        }

    @classmethod
    def from_json(cls, data: Any) -> ExporterOps | None:
        """The decisions read from a cache file, or None when it is not one of ours."""
        if not isinstance(data, dict) or data.get("format") != _FORMAT:
            return None
        sets = []
        for key in ("python", "cia", "preserved"):
            names = data.get(key)
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                return None
            sets.append(frozenset(names))
        pairs = data.get("cia_functions")
        if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and p[1] in _TABLES and isinstance(p[0], str)
            for p in pairs
        ):
            return None
        return cls(*sets, frozenset((name, table) for name, table in pairs))


def _resolve(name: str) -> Any:
    """``aten.add.Tensor`` -> the OpOverload, or None (never anything but an op)."""
    parts = name.split(".")
    if len(parts) != 3 or not all(p.isidentifier() for p in parts):
        return None
    try:
        packet = getattr(getattr(torch.ops, parts[0]), parts[1])
        op = getattr(packet, parts[2])
    except (AttributeError, RuntimeError):
        return None
    return op if isinstance(op, torch._ops.OpOverload) else None


@functools.lru_cache(maxsize=4)
def _python_table(names: frozenset[str]) -> dict[Any, Callable[..., Any]]:
    # every Python decomposition in the exporter's table is torch's registered one
    table = {}
    for op, fn in torch._decomp.decomposition_table.items():
        if str(op) in names:
            table[op] = fn
    return table


@functools.lru_cache(maxsize=4)
def _cia_overrides(pairs: frozenset[tuple[str, str]]) -> dict[Any, Callable[..., Any]]:
    tables = torch._decomp.global_decomposition_table
    overrides = {}
    for name, table in sorted(pairs):
        op = _resolve(name)
        fn = tables[table].get(op) if op is not None else None
        if fn is not None:
            overrides[op] = fn
    return overrides


def _registry_of(op: Any, fn: Any) -> str | None:
    """Which of torch's decomposition registries holds ``fn`` for ``op``."""
    tables = torch._decomp.global_decomposition_table
    return next((t for t in _TABLES if tables[t].get(op) is fn), None)


def compute_exporter_ops() -> ExporterOps:
    """The decisions, from torchlib's registry (slow: imports and compiles torchlib)."""
    from torch.export.exported_program import (
        _special_op_to_preserve_cia,
        _split_decomp_table_to_cia_and_python_decomp,
    )
    from torch.onnx._internal.exporter import _decomp, _registration

    from ..quiet import quiet_torch_internals

    with quiet_torch_internals():
        registry = _registration.ONNXRegistry.from_torchlib()
    onnx_ops = set(_decomp.get_onnx_implemented_overloads(registry))
    table = _decomp.create_onnx_friendly_decomposition_table(onnx_ops)
    cia, python = _split_decomp_table_to_cia_and_python_decomp(dict(table))
    global_table = torch._decomp.decomposition_table
    for op, fn in python.items():
        if global_table.get(op) is not fn:  # pragma: no cover - depends on torch
            raise RuntimeError(f"the exporter decomposes {op} with its own function")
    # every preservable CIA op is in ``cia``: with the table's function, or kept
    preserved = {str(op) for op, fn in cia.items() if fn is _special_op_to_preserve_cia}
    decomposed = {str(op) for op, fn in cia.items() if fn is not _special_op_to_preserve_cia}
    functions = set()
    for op, fn in cia.items():
        if fn is _special_op_to_preserve_cia or _runs_the_kernel(op, fn):
            continue
        registry = _registry_of(op, fn)
        if registry is None:  # pragma: no cover - depends on torch
            raise RuntimeError(f"the exporter decomposes {op} with its own function")
        functions.add((str(op), registry))
    return ExporterOps(
        frozenset(str(op) for op in python),
        frozenset(decomposed),
        frozenset(preserved),
        frozenset(functions),
    )


def _runs_the_kernel(op: Any, fn: Any) -> bool:
    """``fn`` decomposes ``op`` as its CompositeImplicitAutograd kernel does: torch's
    stand-in for "use the kernel", or the Python kernel registered for the op (which the
    Python dispatcher of a trace runs anyway)."""
    stand_in = getattr(getattr(fn, "func", None), "__name__", "") == "_special_op_to_decompose_cia"
    return stand_in or fn is op.py_kernels.get(_CIA)


_LOADED: ExporterOps | None = None


def exporter_ops() -> ExporterOps:
    """The decisions for the installed torch and onnxscript: cached in memory and on disk."""
    global _LOADED
    if _LOADED is not None:
        return _LOADED
    name = f"exporter-ops-{versions()}.json"
    ops = ExporterOps.from_json(read_json(name))
    if ops is None:
        ops = compute_exporter_ops()
        write_json(name, ops.to_json())
    _LOADED = ops
    return ops
