"""In-place forms for the TorchScript tier: a step whose input dies there writes its
result into that input's memory instead of a new tensor.

On small tensors a third of an elementwise op's cost is the allocation and release of its
output (``empty_cpu``, ``malloc``, the TensorImpl's destructor). ``x.mul_(y)`` runs the
same kernel as ``torch.mul(x, y)`` (torch's in-place and out-of-place variants share one
structured kernel) over the same layout, so the values are bit for bit the same.

Which steps may do so is decided on a probe: one run of the plan's expressions in Python
that keeps every value and notes its shape, strides, dtype and storage. A step may
overwrite input ``x`` when

- the output has exactly ``x``'s shape, strides and dtype (the same layout an
  out-of-place call would produce, so later views, copies and kernels see what they saw);
- ``x`` was computed by the plan (never a feed or a constant) and nothing else still
  needed shares its storage: no view of it or base of it is read by a later step, is
  an output, a feed or a constant, and no other input of the step is in it.

All of this is a function of the feeds' shapes, strides and dtypes (every op with a
TorchScript form has an output layout set by its inputs' layouts and its constant
arguments), so the in-place code runs only for feeds with the probe's signature; other
feeds run the plain TorchScript code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .codegen import script_source
from .inline import HELPERS

# Most bytes the probe keeps alive (all values of one run, so that no storage address is
# reused): a larger plan keeps the plain TorchScript code.
PROBE_MAX_BYTES = 256 * 2**20

# torch functions of the inline forms whose in-place method runs the same kernel
_UNARY = frozenset(
    "neg abs sqrt rsqrt reciprocal exp log sigmoid tanh relu sin cos erf floor ceil".split()
)
_BINARY = {"torch.add": ("add_", True), "torch.sub": ("sub_", False), "torch.mul": ("mul_", True)}


class _TooLarge(Exception):
    pass


Meta = tuple  # (shape, strides, dtype, storage address)


def _meta(v: Any) -> Meta | None:
    if type(v) is not torch.Tensor or v.layout != torch.strided or v.device.type != "cpu":
        return None
    return (tuple(v.shape), v.stride(), v.dtype, v.untyped_storage().data_ptr())


def signature(inputs: Sequence[Any]) -> tuple | None:
    """What decides every layout of a run: the feeds' shapes, strides and dtypes (None
    for a feed that is not a strided CPU tensor)."""
    sig = []
    for v in inputs:
        if type(v) is not torch.Tensor or v.layout != torch.strided or v.device.type != "cpu":
            return None
        sig.append((v.shape, v.stride(), v.dtype))
    return tuple(sig)


def _writers(op: str, entry: tuple, dtype: torch.dtype) -> list[tuple[int, Callable]]:
    """(input position, in-place expression builder) candidates of a step, best first."""
    form, consts, _ = entry
    fn = getattr(form, "torch_fn", None)
    if fn in _BINARY:
        method, commutative = _BINARY[fn]
        out = [(0, lambda a: f"{a[0]}.{method}({a[1]})")]
        if commutative:  # a + b and b + a are the same IEEE operation
            out.append((1, lambda a: f"{a[1]}.{method}({a[0]})"))
        return out
    if fn is not None and fn.startswith("torch.") and fn[6:] in _UNARY:
        return [(0, lambda a: f"{a[0]}.{fn[6:]}_()")]
    if not dtype.is_floating_point:
        return []
    if op == "Div":  # the form's float branch
        return [(0, lambda a: f"{a[0]}.div_({a[1]})")]
    if op == "Pow" and isinstance(consts[1], torch.Tensor):
        if dtype in (torch.float32, torch.float64) and consts[1].item() == 2:
            return [(0, lambda a: f"{a[0]}.mul_({a[0]})")]  # as fixed.is_square
        value = consts[1].item()  # what the form writes
        return [(0, lambda a: f"{a[0]}.pow_({value!r})")]
    return []


def probe(
    cg: Any,
    inline: list[tuple | None],
    inputs: Sequence[Any],
    forms: dict[int, Callable[[list[str]], str]] | None = None,
) -> dict[int, Meta] | None:
    """slot -> (shape, strides, dtype, storage address) of every feed and computed value
    of a run of the plan's expressions on ``inputs`` (None when the run fails or holds
    too much memory); ``forms[k]``, when given, is step k's expression instead."""
    res = script_source(
        cg.steps, cg.template, cg.input_slots, cg.output_slots, inline, forms, record=True
    )
    if res is None:
        return None
    source, constants = res
    meta: dict[int, Meta] = {}
    for s, v in zip(cg.input_slots, inputs):
        m = _meta(v)
        if m is not None:
            meta[s] = m
    kept: list[Any] = []
    seen: set[int] = set()
    size = [0]

    def note(k: int, v: Any) -> None:
        kept.append(v)  # no address is reused while the probe runs
        m = _meta(v)
        if m is None:
            return
        meta[cg.steps[k][2][0]] = m
        if m[3] not in seen:
            seen.add(m[3])
            size[0] += v.untyped_storage().nbytes()
            if size[0] > PROBE_MAX_BYTES:
                raise _TooLarge

    ns = {**HELPERS, "_m": note}
    try:
        exec(compile(source, "<onnx_sbs_nb.evaluator probe>", "exec"), ns)
        with torch.inference_mode():
            ns["run"](*inputs, *constants)
    except Exception:  # too large, or a case left to the kernels
        return None
    return meta


def plan_inplace(
    cg: Any, inline: list[tuple | None], meta: dict[int, Meta], inputs: Sequence[Any]
) -> dict[int, Callable[[list[str]], str]]:
    """Steps of ``cg`` that may write into a dying input, on the probe's ``meta`` of a run
    with ``inputs``: step -> in-place expression builder."""
    # storages that must survive the whole run: feeds, constants, outputs
    pinned = {_meta(v) for v in [*inputs, *cg.template] if _meta(v) is not None}
    pinned_ptrs = {m[3] for m in pinned} | {
        meta[s][3] for s in cg.output_slots if meta.get(s) is not None
    }
    last_read: dict[int, int] = {}
    for k, (_, ins, _, _, _) in enumerate(cg.steps):
        for s in ins:
            m = meta.get(s)
            if m is not None:
                last_read[m[3]] = k

    def writable(k: int, ins: tuple, pos: int, mo: Meta) -> bool:
        """Whether step k may write its output ``mo`` into its input at ``pos``."""
        mx = meta.get(ins[pos]) if pos < len(ins) else None
        if mx is None or mx[:3] != mo[:3] or not mx[3] or mx[3] in pinned_ptrs:
            return False
        if last_read.get(mx[3]) != k:
            return False  # a view of it (or its base) is read later
        others = [meta.get(s) for j, s in enumerate(ins) if j != pos]
        return not any(m is not None and m[3] == mx[3] for m in others)

    chosen: dict[int, Callable] = {}
    producer = {outs[0]: k for k, (_, _, outs, _, _) in enumerate(cg.steps)}
    for k, (_, ins, outs, _, _) in enumerate(cg.steps):
        mo = meta.get(outs[0])
        if mo is None or inline[k] is None:
            continue
        node = cg.nodes[k]
        if node.domain not in ("", "ai.onnx"):
            continue
        if node.op_type == "Where":
            chosen.update(_nan_to_num(cg, k, ins, mo, meta, producer, last_read, writable))
            continue
        for pos, build in _writers(node.op_type, inline[k], mo[2]):
            if writable(k, ins, pos, mo):
                chosen[k] = build
                break
    return chosen


def _nan_to_num(cg, k, ins, mo, meta, producer, last_read, writable) -> dict[int, Callable]:
    """``Where(IsNaN(x), c, x)`` (the exporter's guard after a softmax) as one
    ``nan_to_num`` that replaces NaN with the constant ``c`` and keeps every other value
    (infinities included): one op instead of two, in place when ``x`` dies there."""
    if len(ins) != 3 or ins[0] not in producer:
        return {}
    k0 = producer[ins[0]]
    node0, c, mx = cg.nodes[k0], cg.template[ins[1]], meta.get(ins[2])
    mask = meta.get(ins[0])
    if (
        node0.op_type != "IsNaN"
        or node0.domain not in ("", "ai.onnx")
        or cg.steps[k0][1] != (ins[2],)
        or mask is None
        or last_read.get(mask[3]) != k
        or ins[0] in cg.output_slots
        or type(c) is not torch.Tensor
        or c.dim() != 0
        or mx is None
        or c.dtype != mx[2]
        or not mx[2].is_floating_point
        or mx[:3] != mo[:3]
    ):
        return {}
    value = c.item()
    if not math.isfinite(value):
        return {}
    args = f'{value!r}, float("inf"), -float("inf")'
    if writable(k, ins, 2, mo):
        build = lambda a: f"{a[2]}.nan_to_num_({args})"  # noqa: E731
    else:
        build = lambda a: f"torch.nan_to_num({a[2]}, {args})"  # noqa: E731
    # the mask is no longer computed: its slot holds the input (read by nothing)
    return {k0: lambda a: a[0], k: build}
