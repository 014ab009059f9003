"""Forms for one input signature: the inline forms without their run-time checks.

The TorchScript code that writes in place (inplace.py) runs only for feeds of the
probe's shapes, strides and dtypes, so every check an inline form makes on a value's
dtype, rank or size has the answer it had in the probe. Each form here is the branch the
inline form took there, written out: ``torch.matmul(a, b)`` for ``(torch.matmul(a, b)
if a.is_floating_point() else _fallback())``, ``x.narrow(3, 0, 8)`` for ``_narrow(x, -1,
0, 8)`` on a rank-4 input, ``x.expand([2, 4, 8, 8])`` for ``_expand``'s loop. The aten
calls are the same, so are the results; the TorchScript interpreter runs fewer
instructions per node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_GUARD_END = " else _fallback())"


def _unguarded(expr: str) -> str | None:
    """``E`` of an inline form ``(E if C else _fallback())`` (C holds in the probe)."""
    if not (expr.startswith("(") and expr.endswith(_GUARD_END) and " if " in expr):
        return None
    head = expr[1 : -len(_GUARD_END)]
    e, _, _ = head.partition(" if ")
    return e if e.count("(") == e.count(")") else None


def is_square(consts: list, x: tuple | None) -> bool:
    """Whether a Pow is ``x ** 2`` on a float32/float64 ``x``: torch's pow kernel computes
    that exponent as ``x * x`` for those dtypes (``pow_tensor_scalar_optimized_kernel``),
    the very product ``torch.mul`` computes, without pow's dtype conversion around it."""
    e = consts[1] if len(consts) > 1 else None
    if x is None or x[2] not in (torch.float32, torch.float64):
        return False
    if not isinstance(e, torch.Tensor) or e.dim() or e.is_complex() or e.dtype == torch.bool:
        return False
    return e.item() == 2


def _narrow(shape: tuple, ints: list) -> tuple[int, int, int] | None:
    """The arguments of ``narrow`` that ``_narrow(x, axis, start, end)`` computes."""
    axis, start, end = ints
    rank = len(shape)
    if rank == 0:
        return None
    a = axis + rank if axis < 0 else axis
    n = shape[a]
    s = min(max(start + n if start < 0 else start, 0), n)
    e = min(max(end + n if end < 0 else end, 0), n)
    return a, s, max(e - s, 0)


def fixed_form(
    op: str, entry: tuple, args: list[str], ins_meta: list, out_meta: tuple
) -> Callable[[list[str]], str] | None:
    """The probe-signature form of a step (None: keep its inline form)."""
    form, consts, attrs = entry
    expr = form(args, consts, attrs)
    if expr is None:
        return None
    if op == "Pow" and ins_meta and is_square(consts, ins_meta[0]):
        return lambda a: f"torch.mul({a[0]}, {a[0]})"
    plain = _unguarded(expr)
    if plain is not None:
        return lambda a: form(a, consts, attrs)[1 : -len(_GUARD_END)].partition(" if ")[0]
    x = ins_meta[0] if ins_meta else None
    if x is None:
        return None
    if op == "Div" and x[2].is_floating_point:
        return lambda a: f"torch.div({a[0]}, {a[1]})"
    if expr.startswith("_narrow("):
        ints = [int(v) for v in expr[len("_narrow(") : -1].split(", ")[1:]]
        found = _narrow(x[0], ints)
        if found is None or found[2] != out_meta[0][found[0]]:
            return None
        return lambda a: f"{a[0]}.narrow({found[0]}, {found[1]}, {found[2]})"
    if expr.startswith("_expand("):
        return lambda a: f"{a[0]}.expand({list(out_meta[0])!r})"
    if expr.startswith("_cast(") and x[2] == out_meta[2]:
        return lambda a: a[0]  # the form returns its input when the dtype is already right
    return None


def plan_fixed(cg: Any, inline: list, meta: dict) -> dict[int, Callable[[list[str]], str]]:
    """step -> probe-signature form, for the steps that have one."""
    chosen = {}
    for k, (_, ins, outs, _, _) in enumerate(cg.steps):
        out = meta.get(outs[0])
        if inline[k] is None or out is None or cg.nodes[k].domain not in ("", "ai.onnx"):
            continue
        names = ["None" if s == 0 else f"a{j}" for j, s in enumerate(ins)]
        ins_meta = [meta.get(s) for s in ins]
        build = fixed_form(cg.nodes[k].op_type, inline[k], names, ins_meta, out)
        if build is not None:
            chosen[k] = build
    return chosen
