"""Two steps as fewer aten calls, for one input signature, with the same bits.

``ReduceMean`` on float32/float64 is, in torch's CPU kernel (``mean_out``), a sum then
an in-place division by the reduced size; when an ``Add`` of a constant is the mean's
only reader (RMSNorm's ``mean(x * x) + eps``), the division and the addition are one
``torch.addcdiv(eps, sum, n)``: ``eps + 1 * sum / n``, the same two IEEE roundings in
the same order (the product by 1 is exact), written into the sum's own memory. Three
TensorIterator set-ups become two, and the scalar division's wrapping goes away.

Like inplace.py, this reads the probe's shapes, strides and dtypes, so its code runs only
for feeds of the probe's signature.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

_FLOATS = (torch.float32, torch.float64)


def _is(node: Any, op: str) -> bool:
    return node.op_type == op and node.domain in ("", "ai.onnx")


def plan_fused(
    cg: Any, inline: list, meta: dict
) -> tuple[dict[int, Callable[[list[str]], str]], dict[str, torch.Tensor]]:
    """step -> expression builder for the fused steps, and the constants they name."""
    readers: dict[int, list[int]] = {}
    for k, (_, ins, _, _, _) in enumerate(cg.steps):
        for s in ins:
            readers.setdefault(s, []).append(k)
    chosen: dict[int, Callable[[list[str]], str]] = {}
    extra: dict[str, torch.Tensor] = {}
    names: dict[tuple, str] = {}
    for k0, (_, ins0, outs0, _, _) in enumerate(cg.steps):
        if inline[k0] is None or not _is(cg.nodes[k0], "ReduceMean"):
            continue
        found = _mean_then_add(cg, inline, meta, readers, k0, ins0, outs0[0])
        if found is None:
            continue
        k, axis, keep, eps, n = found
        key = (n, eps.dtype)  # one constant per size and dtype
        if key not in names:
            names[key] = f"e{len(extra)}"
            extra[names[key]] = torch.tensor(float(n), dtype=eps.dtype)
        name = names[key]
        chosen[k0] = lambda a, axis=axis, keep=keep: (
            f"torch.sum({a[0]}, dim={axis}, keepdim={keep})"
        )
        pos = cg.steps[k][1].index(outs0[0])

        def add(a: list[str], pos=pos, name=name) -> str:
            mean, c = a[pos], a[1 - pos]
            return f"torch.addcdiv({c}, {mean}, {name}, out={mean})"

        chosen[k] = add
    return chosen, extra


def _mean_then_add(cg, inline, meta, readers, k0, ins0, out0):
    """(add step, axis, keepdim, eps, reduced size) when step k0's mean may be fused."""
    _, consts, attrs = inline[k0]
    axes = consts[1] if len(consts) > 1 else None
    x, mo = meta.get(ins0[0]), meta.get(out0)
    if type(axes) is not tuple or len(axes) != 1 or x is None or mo is None:
        return None
    if x[2] not in _FLOATS or mo[2] != x[2] or not x[0] or not all(x[0]):  # empty: no sum
        return None
    if out0 in cg.output_slots or len(readers.get(out0, ())) != 1:
        return None
    k = readers[out0][0]
    _, ins, outs, _, _ = cg.steps[k]
    if inline[k] is None or not _is(cg.nodes[k], "Add") or len(ins) != 2 or ins[0] == ins[1]:
        return None
    other = ins[1] if ins[0] == out0 else ins[0]
    eps = cg.template[other] if other < len(cg.template) else None
    if type(eps) is not torch.Tensor or eps.dim() or eps.dtype != x[2] or eps.device.type != "cpu":
        return None
    if other in cg.input_slots or any(other in o for _, _, o, _, _ in cg.steps):
        return None  # computed or fed, not a constant
    if meta.get(outs[0]) is None or meta[outs[0]][:3] != mo[:3]:
        return None
    n = x[0][axes[0]]
    return k, axes[0], bool(attrs.get("keepdims", 1)), eps, n
