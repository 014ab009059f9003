"""Contiguous results where a later step would copy them, for one input signature.

An elementwise step on a permuted view (RoPE's ``q * cos`` on ``q.transpose(1, 2)``)
gives a result laid out like that view; the steps after it keep that layout, until a
Reshape or a batched MatMul that cannot view it copies it to a contiguous tensor (a
``clone``: about 12,000 instructions on a few hundred floats). Written with ``out=`` a
contiguous tensor, the step's values are the same (an elementwise kernel computes each
element alone), and the later copy becomes a view of the same contiguous layout.

A rewrite is kept only when a second probe (inplace.py) shows that it removes at least as
many copies as it adds ``out=`` tensors, and that every step reading a value whose
layout changed computes values that do not depend on the layout: elementwise ops, views,
Concat, and batched MatMuls whose operand was copied to a contiguous one before and is
viewed contiguous now (the same ``bmm`` inputs). No output of the plan changes layout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .inplace import Meta, probe

_ELEMENTWISE = frozenset(
    "Add Sub Mul Div Neg Abs Sqrt Reciprocal Exp Log Sigmoid Tanh Relu Erf Sin Cos Pow "
    "Where IsNaN Equal Less Greater LessOrEqual GreaterOrEqual And Or Xor Not Cast".split()
)
_VIEWS = frozenset("Reshape Transpose Unsqueeze Squeeze Slice Expand Identity Concat".split())
_WRITABLE = {"Add": "torch.add", "Sub": "torch.sub", "Mul": "torch.mul"}


def _standard(shape: tuple) -> tuple:
    """The strides of a new contiguous tensor of ``shape``."""
    strides, n = [], 1
    for d in reversed(shape):
        strides.append(n)
        n *= max(d, 1)
    return tuple(reversed(strides))


def _contiguous(shape: tuple, strides: tuple) -> bool:
    expected = 1
    for n, s in zip(reversed(shape), reversed(strides)):
        if n != 1 and s != expected:
            return False
        expected *= n
    return True


def _viewable(m: Meta, shape: list[int]) -> bool:
    """Whether ``reshape`` gives a view (not a copy) of a tensor laid out as ``m``."""
    try:
        torch.empty_strided(m[0], m[1], dtype=m[2], device="meta").view(shape)
    except RuntimeError:
        return False
    return True


def _batched_copy(meta: dict, ins: tuple, pos: int) -> bool | None:
    """For a MatMul of two operands of rank >= 3 with the same batch: whether operand
    ``pos`` is copied by the batched path's reshape (None: not such a MatMul)."""
    a, b = (meta.get(s) for s in ins[:2])
    if a is None or b is None or len(a[0]) < 3 or len(b[0]) < 3 or a[0][:-2] != b[0][:-2]:
        return None
    m = (a, b)[pos]
    return not _viewable(m, [-1, *m[0][-2:]])


def _copies(cg: Any, meta: dict) -> int:
    """Reshapes that copied and batched MatMul operands that were copied, in a probe."""
    n = 0
    for k, (_, ins, outs, _, _) in enumerate(cg.steps):
        op = cg.nodes[k].op_type
        if op == "Reshape" and ins[0] in meta and outs[0] in meta:
            n += meta[ins[0]][3] != meta[outs[0]][3]
        elif op == "MatMul" and len(ins) == 2:
            n += sum(bool(_batched_copy(meta, ins, p)) for p in (0, 1))
    return n


def plan_layout(
    cg: Any, inline: list, meta: dict, inputs: Sequence[Any]
) -> tuple[dict[int, Callable[[list[str]], str]], dict]:
    """step -> expression writing a contiguous result, and the probe of the plan with
    them (``({}, meta)`` when no rewrite is worth it or safe)."""
    chosen: dict[int, Callable[[list[str]], str]] = {}
    following: set[int] = set()
    for k, (_, ins, outs, _, _) in enumerate(cg.steps):
        node, mo = cg.nodes[k], meta.get(outs[0])
        fn = _WRITABLE.get(node.op_type)
        if fn is None or node.domain not in ("", "ai.onnx") or mo is None or len(ins) != 2:
            continue
        if inline[k] is None or _contiguous(mo[0], mo[1]) or outs[0] in cg.output_slots:
            continue
        if getattr(inline[k][0], "torch_fn", None) != fn:
            continue
        if any(s in following for s in ins):
            # its layout came from a rewritten step: contiguous inputs give it one anyway
            following.add(outs[0])
            continue
        following.add(outs[0])
        dtype = str(mo[2]).removeprefix("torch.")
        shape = list(mo[0])
        chosen[k] = lambda a, fn=fn, shape=shape, dtype=dtype: (
            f"{fn}({a[0]}, {a[1]}, out=torch.empty({shape!r}, dtype=torch.{dtype}))"
        )
    # each probe costs a run of the plan in Python: leave out at once the candidates whose
    # layout visibly reaches a step that reads it as it is
    readers: dict[int, list[int]] = {}
    for j, (_, ins, _, _, _) in enumerate(cg.steps):
        for s in ins:
            readers.setdefault(s, []).append(j)
    chosen = {k: v for k, v in chosen.items() if _only_copied(cg, k, readers, meta)}
    # a candidate whose new layout reaches a step that could compute other values
    # (a reduction, a MatMul reading it as it is) is dropped, and the rest probed again
    for _ in range(4):
        if not chosen:
            return {}, meta
        after = probe(cg, inline, inputs, chosen)
        if after is None:
            return {}, meta
        culprits = _culprits(cg, chosen, meta, after)
        if not culprits:
            break
        chosen = {k: v for k, v in chosen.items() if k not in culprits}
    else:
        return {}, meta
    if _copies(cg, meta) - _copies(cg, after) < len(chosen):
        return {}, meta
    return chosen, after


def _only_copied(cg: Any, k: int, readers: dict, meta: dict) -> bool:
    """Whether step k's result, through the elementwise steps and views after it, is only
    read by steps indifferent to its layout, and copied by a Reshape or batched MatMul."""
    todo, seen = [cg.steps[k][2][0]], set()
    while todo:
        s = todo.pop()
        if s in seen or s in cg.output_slots or len(seen) > 64:
            return False
        seen.add(s)
        for j in readers.get(s, ()):
            node, (_, ins, outs, _, _) = cg.nodes[j], cg.steps[j]
            op = node.op_type if node.domain in ("", "ai.onnx") else None
            if op == "MatMul":
                if not all(_batched_copy(meta, ins, p) for p, x in enumerate(ins) if x == s):
                    return False
            elif op == "Reshape" and meta.get(outs[0], (0,) * 4)[3] != meta.get(s, (1,) * 4)[3]:
                continue  # copied: contiguous before and after
            elif op in _ELEMENTWISE or op in _VIEWS:
                todo.append(outs[0])
            else:
                return False
    return True


def _culprits(cg: Any, chosen: dict, before: dict, after: dict) -> set[int]:
    """The rewritten steps whose layout reaches a step whose values could change with
    it, or an output of the plan."""
    changed = {s for s, m in after.items() if before.get(s) is None or before[s][:3] != m[:3]}
    producer = {outs[0]: k for k, (_, _, outs, _, _) in enumerate(cg.steps)}
    bad = [s for s in cg.output_slots if s in changed]
    for k, (_, ins, _, _, _) in enumerate(cg.steps):
        moved = [p for p, s in enumerate(ins) if s in changed]
        bad += [ins[p] for p in moved if not _same_values(cg, k, ins, p, before, after)]
    found: set[int] = set()
    seen: set[int] = set()
    while bad:
        s = bad.pop()
        if s in seen or s not in producer:
            continue
        seen.add(s)
        k = producer[s]
        if k in chosen:
            found.add(k)
        bad += [x for x in cg.steps[k][1] if x in changed]
    return found or (set(chosen) if any(s in changed for s in seen) else set())


def _same_values(cg: Any, k: int, ins: tuple, p: int, before: dict, after: dict) -> bool:
    """Whether step k, whose input ``p`` changed layout, computes the same values."""
    node = cg.nodes[k]
    if node.domain not in ("", "ai.onnx"):
        return False
    if node.op_type in _ELEMENTWISE or node.op_type in _VIEWS:
        return True
    if node.op_type != "MatMul":
        return False
    # copied to a contiguous operand before, viewed as one now
    if not _batched_copy(before, ins, p) or _batched_copy(after, ins, p) is not False:
        return False
    m = after[ins[p]]
    return tuple(m[1]) == _standard(m[0])  # the strides of the copy it replaces
