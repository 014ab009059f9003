"""Turns a compiled plan into straight-line Python: one call and a few assignments per node.

Values live in local variables instead of a list, constants and kernels are globals of
the generated function, and each value is set to None right after its last use. This
removes the interpreter loop's unpacking and indexing (about 0.4 us per node) while
keeping exactly the same steps, so results are identical to the plain loop.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

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
        expr = None
        if inline and inline[k] is not None and len(outs) == 1:
            form, constants, form_attrs = inline[k]
            expr = form(args, constants, form_attrs)
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
