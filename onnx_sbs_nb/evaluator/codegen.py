"""Turns a compiled plan into straight-line Python: one call and a few assignments per node.

Values live in local variables instead of a list, constants and kernels are globals of
the generated function, and each value is set to None right after its last use. This
removes the interpreter loop's unpacking and indexing (about 0.4 us per node) while
keeping exactly the same steps, so results are identical to the plain loop.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .inline import HELPERS


def _outs(r: Any, n: int) -> tuple:
    """A kernel's result as exactly n outputs (missing optional ones are None)."""
    if type(r) is not tuple:
        r = (r,)
    if len(r) < n:
        return r + (None,) * (n - len(r))
    return r[:n] if len(r) > n else r


def _pad(values: Sequence[Any], n: int) -> list[Any]:
    values = list(values)[:n]
    return values + [None] * (n - len(values))


def generate(
    steps: list[tuple],
    template: list[Any],
    input_slots: list[int],
    outer_slots: list[int],
    output_slots: list[int],
    on_error: Callable[[int, Exception], Exception],
    inline: list[tuple | None] | None = None,
    on_fallback: Callable[[Any, Any], list[Any]] | None = None,
) -> Callable[..., list[Any]]:
    """``run(inputs, outer=()) -> outputs`` executing ``steps`` (fn, ins, outs, attrs, free).

    ``inline[k]``, when given, is ``(form, constants, attrs)``: step k is written as the
    torch call its form returns (inline.py) instead of a kernel call. Any exception in
    such a step hands the run to ``on_fallback(inputs, outer)``, which redoes it with the
    kernels (and names the failing node if it fails there too)."""
    ns: dict[str, Any] = {"_outs": _outs, "_pad": _pad, "_on_error": on_error}
    inlined: set[int] = set()
    if inline:
        ns.update(HELPERS)
        ns["_on_fallback"] = on_fallback
    local = set(input_slots) | set(outer_slots)
    for _, _, outs, _, _ in steps:
        local.update(outs)
    read: set[int] = set(output_slots)
    for _, ins, _, _, _ in steps:
        read.update(ins)

    def name(slot: int) -> str:
        if slot == 0:
            return "None"
        if slot in local:
            return f"s{slot}"
        ns[f"c{slot}"] = template[slot]
        return f"c{slot}"

    n_in, n_outer = len(input_slots), len(outer_slots)
    lines = ["def run(inputs, outer=()):"]
    if n_in:
        lines.append(f"    if len(inputs) != {n_in}: inputs = _pad(inputs, {n_in})")
        lines += [f"    s{s} = inputs[{i}]" for i, s in enumerate(input_slots)]
    if n_outer:
        lines.append(f"    if len(outer) != {n_outer}: outer = _pad(outer, {n_outer})")
        lines += [f"    s{s} = outer[{i}]" for i, s in enumerate(outer_slots)]
    lines += ["    k = 0", "    try:", "        pass"]
    for k, (fn, ins, outs, attrs, free) in enumerate(steps):
        args = [name(s) for s in ins]
        targets = [f"s{s}" if s in read else "_" for s in outs]
        lines.append(f"        k = {k}")
        expr = _inline_expr(inline, k, args, outs)
        if expr is not None:
            inlined.add(k)
            lines.append(f"        {targets[0]} = {expr}")
        else:
            ns[f"f{k}"] = fn
            if attrs:
                ns[f"a{k}"] = attrs
                args.append(f"**a{k}")
            call = f"f{k}({', '.join(args)})"
            if len(outs) == 1:
                lines.append(f"        r = {call}")
                lines.append(f"        {targets[0]} = r[0] if type(r) is tuple else r")
            else:
                lines.append(f"        {', '.join(targets)}, = _outs({call}, {len(outs)})")
        cleared = [f"s{s}" for s in free if s in local and s in read]
        if cleared:
            lines.append(f"        {' = '.join(cleared)} = None")
    lines.append("    except Exception as e:")
    if inlined:
        ns["_inlined"] = frozenset(inlined)
        lines += ["        if k in _inlined:", "            return _on_fallback(inputs, outer)"]
    lines.append("        raise _on_error(k, e) from e")
    lines += [
        f"    return [{', '.join(name(s) for s in output_slots)}]",
    ]
    code = compile("\n".join(lines) + "\n", "<onnx_sbs_nb.evaluator plan>", "exec")
    exec(code, ns)
    return ns["run"]


def _inline_expr(inline: list[tuple | None] | None, k: int, args: list[str], outs) -> str | None:
    """The Python expression of step k's inline form, None when it has none."""
    if not inline or inline[k] is None or len(outs) != 1:
        return None
    form, constants, attrs = inline[k]
    return form(args, constants, attrs)


def script_source(
    steps: list[tuple],
    template: list[Any],
    input_slots: list[int],
    output_slots: list[int],
    inline: list[tuple | None],
    inplace: dict[int, Callable[[list[str]], str]] | None = None,
    record: bool = False,
    extra: dict[str, torch.Tensor] | None = None,
) -> tuple[str, list[torch.Tensor]] | None:
    """TorchScript source of a plan every step of which has an inline form:
    ``run(inputs..., constants...) -> List[Tensor]``, and the constant tensors it takes
    after the inputs. None when a step has no inline form or a constant is not a tensor.

    The body is the expressions of the Python code, one per step; TorchScript's
    interpreter then calls the same aten ops without a Python frame per node.

    ``inplace[k]``, when given, writes step k as the in-place call it returns (inplace.py).
    ``record``: after each step, ``_m(k, value)`` (the Python probe of inplace.py).
    ``extra``: constants the ``inplace`` forms name (``e0``...), taken after the others."""
    local = set(input_slots) | {s for _, _, outs, _, _ in steps for s in outs}

    def name(slot: int) -> str:
        if slot == 0:
            return "None"
        return f"s{slot}" if slot in local else f"c{slot}"

    body = []
    for k, (_, ins, outs, _, _) in enumerate(steps):
        args = [name(s) for s in ins]
        expr = _inline_expr(inline, k, args, outs)
        if expr is None:
            return None
        if inplace and k in inplace:
            expr = inplace[k](args)
        body.append(f"    s{outs[0]} = {expr}")
        if record:
            body.append(f"    _m({k}, s{outs[0]})")
    used = sorted({int(c) for line in body for c in re.findall(r"\bc(\d+)\b", line)})
    used += [s for s in output_slots if s not in local and s not in used]
    if any(not isinstance(template[s], torch.Tensor) for s in used):
        return None
    extra = extra or {}
    params = [f"s{s}: Tensor" for s in input_slots] + [f"c{s}: Tensor" for s in used]
    params += [f"{n}: Tensor" for n in extra]
    source = "\n".join(
        [f"def run({', '.join(params)}) -> List[Tensor]:", *body]
        + [f"    return [{', '.join(name(s) for s in output_slots)}]"]
    )
    return source + "\n", [template[s] for s in used] + list(extra.values())
