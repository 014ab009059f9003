"""Kernel registry of the torch evaluator.

A kernel implements one ONNX operator (from one since-version on) with torch:

    from onnx_sbs_nb.evaluator.registry import op

    @op("Add", since=7)
    def add(a, b):
        return a + b

Calling convention (the same for built-in kernels and for ``custom_kernels``):

- inputs come positionally, as ``torch.Tensor`` (or ``list`` of tensors for sequence
  values); a missing optional input is ``None`` (trailing missing ones may be omitted,
  so give optional inputs a default of ``None``);
- attributes come as keyword arguments, under their ONNX names, already converted:
  INT -> int, FLOAT -> float, STRING -> str, INTS -> list[int], FLOATS -> list[float],
  STRINGS -> list[str], TENSOR -> torch.Tensor, GRAPH -> onnx.GraphProto,
  TYPE_PROTO -> onnx.TypeProto; an attribute absent from the node is not passed, so
  defaults are the Python defaults of the kernel's signature (write the spec's default);
- a kernel registered with ``context=True`` also receives ``ctx=`` (a KernelContext:
  device, opsets, subgraph execution);
- it returns a tensor for a single-output op, a ``tuple`` for a multi-output op
  (``None`` for an optional output it does not produce), and a ``list`` of tensors for a
  sequence value.

The implementation chosen for a node is the one with the highest ``since`` that is not
above the opset the model imports for that domain, so a model keeps the semantics of
its own opset.

Everything the compiler needs to know about an op is declared here, with its kernel, so
that adding an op is one kernel module: which inputs are shapes read on the host
(``host_inputs``, ``int_inputs``) and, on an accelerator, where its outputs live
(``placement``).
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Kernel = Callable[..., Any]

# Where the outputs of an op live when the evaluator manages host/device placement (on an
# accelerator): "device", the default; "host", always (Shape, Size); "follow", on the
# host when every input is there (shape arithmetic: Add, Gather, Concat...), else on the
# device; "any", wherever the values it returns are (subgraphs, sequences, optionals):
# the consumers check at run time.
Placement = Literal["device", "host", "follow", "any"]
PLACEMENTS: frozenset[str] = frozenset(("device", "host", "follow", "any"))


@dataclass(frozen=True)
class KernelEntry:
    domain: str
    op_type: str
    since: int
    fn: Kernel
    context: bool = False
    # Input positions the kernel only reads as Python ints (shape, axes, pads...) through
    # ``as_ints``: when such an input is a constant, it is converted once, at compile time.
    int_inputs: frozenset[int] = frozenset()
    # Input positions read on the host (``tolist()``, ``item()``): on an accelerator they
    # are never moved to the device, so reading them does not synchronise it. Includes
    # ``int_inputs``.
    host_inputs: frozenset[int] = frozenset()
    placement: Placement = "device"
    # the module that registered it (a kernel may be a torch function, or made in a loop)
    registered_in: str = ""


_REGISTRY: dict[tuple[str, str], list[KernelEntry]] = {}


def normalize_domain(domain: str | None) -> str:
    return "" if domain in (None, "", "ai.onnx") else domain


def op(
    op_type: str,
    since: int = 1,
    domain: str = "",
    context: bool = False,
    int_inputs: tuple[int, ...] = (),
    host_inputs: tuple[int, ...] = (),
    placement: Placement = "device",
) -> Callable[[Kernel], Kernel]:
    """Registers ``fn`` as the kernel of ``(domain, op_type)`` from opset ``since`` on.

    ``int_inputs``: positions of inputs the kernel reads only through ``as_ints``; a
    constant there reaches the kernel as a tuple of ints instead of a tensor.
    ``host_inputs``: other positions the kernel reads on the host (a scalar exponent, a
    condition, a ratio); with ``int_inputs``, they stay on the host on an accelerator.
    ``placement``: where the outputs live on an accelerator (see ``Placement``)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {sorted(PLACEMENTS)}, not {placement!r}")
    registered_in = sys._getframe(1).f_globals.get("__name__", "")

    def deco(fn: Kernel) -> Kernel:
        key = (normalize_domain(domain), op_type)
        entries = _REGISTRY.setdefault(key, [])
        entries[:] = [e for e in entries if e.since != since]
        entry = KernelEntry(
            key[0],
            op_type,
            since,
            fn,
            context,
            frozenset(int_inputs),
            frozenset(int_inputs) | frozenset(host_inputs),
            placement,
            registered_in,
        )
        entries.append(entry)
        entries.sort(key=lambda e: e.since)
        return fn

    return deco


def get_kernel(domain: str, op_type: str, version: int | None) -> KernelEntry | None:
    """The kernel for an op at a given opset version (None: the newest)."""
    entries = _REGISTRY.get((normalize_domain(domain), op_type))
    if not entries:
        return None
    if version is None:
        return entries[-1]
    best = None
    for e in entries:
        if e.since <= version:
            best = e
    return best


def supported_ops() -> list[tuple[str, str, int]]:
    """Every (domain, op_type, since_version) with a kernel, sorted."""
    _load_kernels()
    return sorted((e.domain, e.op_type, e.since) for es in _REGISTRY.values() for e in es)


def op_index() -> list[tuple[str, str, int, str]]:
    """Every registered kernel as (domain, op_type, since_version, "module:function"),
    sorted: the module that registered it and the kernel's name, including ops registered
    in a loop (which a search for ``@op("Erf"`` does not find).  ``scripts/op_index.py``
    prints it."""
    _load_kernels()
    rows = []
    for es in _REGISTRY.values():
        for e in es:
            fn = e.fn
            while isinstance(fn, functools.partial):
                fn = fn.func
            fn = inspect.unwrap(fn)
            where = f"{e.registered_in}:{getattr(fn, '__qualname__', repr(fn))}"
            rows.append((e.domain, e.op_type, e.since, where))
    return sorted(rows)


_LOADED = False


def _load_kernels() -> None:
    global _LOADED
    if not _LOADED:
        from . import kernels  # noqa: F401  (importing registers every kernel module)

        _LOADED = True
