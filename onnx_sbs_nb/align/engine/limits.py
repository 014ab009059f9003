"""Outputs too large for the machine, refused before the node allocates them.

A corrupt (or hostile) shape constant makes ``Expand``, ``ConstantOfShape``, ``Tile``,
``Resize``... ask for terabytes; a buggy broadcast makes an ``Add`` of an ``[N, 1]`` and a
``[1, N]`` value ask for N² elements.  Allocating that gets the process killed by the
kernel and the run loses everything.  :func:`check_output_size` computes the output's
size from the node's inputs, for the ops whose output can be much larger than their
inputs, and raises :class:`OutputTooLargeError` when it exceeds the memory free on the
device; the run records the node as failed and goes on.  Ops not listed, and inputs the
rule cannot read, are let through (the runtime's own checks apply).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import onnx
import torch

# below this, no output is worth reading the free memory for
_SMALL = 64 << 20
_MEMORY_TTL = 1.0  # seconds a reading of the free memory is reused
_MAX_SHAPE_VALUES = 1024  # a shape input longer than this is not read (nor plausible)
_memory_cache: dict[str, tuple[float, int]] = {}
_memory_lock = threading.Lock()


class OutputTooLargeError(MemoryError):
    """A node's output would not fit in the memory the machine has free."""


# ---- free memory ---------------------------------------------------------------------


def _meminfo() -> int | None:
    """MemAvailable + SwapFree: what Linux can hand out before the OOM killer acts."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            fields = {k: v for k, _, v in (line.partition(":") for line in f)}
    except OSError:
        return None
    try:
        avail = int(fields["MemAvailable"].split()[0]) * 1024
        swap = int(fields.get("SwapFree", "0 kB").split()[0]) * 1024
    except (KeyError, ValueError, IndexError):
        return None
    return avail + swap


def _cgroup_room() -> int | None:
    """What the container's memory limit leaves (cgroup v2, then v1), or None."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        try:
            with open(limit_file, encoding="ascii") as f:
                limit = f.read().strip()
            with open(usage_file, encoding="ascii") as f:
                usage = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if limit == "max" or not limit.isdigit() or int(limit) >= 1 << 60:
            return None  # no limit
        return max(int(limit) - usage, 0)
    return None


def _host_free() -> int:
    found = [v for v in (_meminfo(), _cgroup_room()) if v is not None]
    if found:
        return min(found)
    try:  # not Linux: the physical memory, an upper bound
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def free_memory(device: str = "cpu") -> int:
    """Bytes that can be allocated on ``device`` now (read at most once a second)."""
    now = time.monotonic()
    with _memory_lock:
        cached = _memory_cache.get(device)
        if cached is not None and now - cached[0] < _MEMORY_TTL:
            return cached[1]
    if str(device).startswith("cuda") and torch.cuda.is_available():
        free = int(torch.cuda.mem_get_info(torch.device(device))[0])
    else:
        free = _host_free()
    with _memory_lock:
        _memory_cache[device] = (now, free)
    return free


# ---- reading inputs -------------------------------------------------------------------


def _shape(v: Any) -> tuple[int, ...]:
    return tuple(int(d) for d in v.shape)


def _itemsize(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return v.element_size()
    return int(v.dtype.itemsize)


def _values(v: Any) -> list[Any]:
    """The few numbers of a shape-like input (ValueError when it is not small)."""
    n = int(v.numel()) if isinstance(v, torch.Tensor) else int(v.size)
    if n > _MAX_SHAPE_VALUES:
        raise ValueError("not a shape")
    flat = v.reshape(-1)
    return flat.tolist()


def _attr(node: onnx.NodeProto, name: str, default: Any = None) -> Any:
    for a in node.attribute:
        if a.name == name:
            return onnx.helper.get_attribute_value(a)
    return default


def _given(inputs: Sequence[Any], k: int) -> Any:
    """Input ``k`` when the node was given it (an empty name is None), else None."""
    v = inputs[k] if len(inputs) > k else None
    if v is None or not hasattr(v, "shape"):
        return None
    return v


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...] | None:
    """Numpy broadcasting on Python ints (None when the shapes do not broadcast)."""
    rank = max(map(len, shapes), default=0)
    out = [1] * rank
    for s in shapes:
        offset = rank - len(s)
        for i, d in enumerate(s):
            o = out[offset + i]
            if d == o or d == 1:
                continue
            if o != 1:
                return None
            out[offset + i] = int(d)
    return tuple(out)


def _elem_size(elem_type: int, default: int = 4) -> int:
    try:
        return int(onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize)
    except Exception:
        return default


Estimate = tuple[tuple[int, ...], int] | None  # (output shape, bytes per element)


# ---- one rule per op: the output's shape from the inputs -------------------------------


def _constant_of_shape(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    value = _attr(node, "value")
    size = _elem_size(value.data_type) if value is not None else 4
    return tuple(int(d) for d in _values(inputs[0])), size


def _expand(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    shape = broadcast_shape(_shape(inputs[0]), [int(d) for d in _values(inputs[1])])
    return (shape, _itemsize(inputs[0])) if shape is not None else None


def _tile(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    x = inputs[0]
    repeats = [int(r) for r in _values(inputs[1])]
    return tuple(d * r for d, r in zip(_shape(x), repeats)), _itemsize(x)


def _range(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    start, limit, delta = (_values(v)[0] for v in inputs[:3])
    if delta == 0:
        return None
    n = max(math.ceil((limit - start) / delta), 0)
    return (n,), _itemsize(inputs[0])


def _scaled(x: Any, node: onnx.NodeProto, scales: Any, sizes: Any) -> Estimate:
    shape = list(_shape(x))
    axes = _attr(node, "axes")
    axes = [a % len(shape) for a in axes] if axes else list(range(len(shape)))
    if sizes is not None:
        for a, s in zip(axes, _values(sizes)):
            shape[a] = int(s)
    elif scales is not None:
        for a, s in zip(axes, _values(scales)):
            shape[a] = int(math.floor(shape[a] * float(s)))
    else:
        return None
    return tuple(shape), _itemsize(x)


def _resize(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    x = inputs[0]
    if len(inputs) == 2:  # Resize-10: (X, scales)
        return _scaled(x, node, _given(inputs, 1), None)
    return _scaled(x, node, _given(inputs, 2), _given(inputs, 3))


def _upsample(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    scales = _given(inputs, 1)
    if scales is None:
        attr = _attr(node, "scales")
        scales = torch.tensor(attr) if attr else None
    return _scaled(inputs[0], node, scales, None)


def _pad(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    x = inputs[0]
    shape = list(_shape(x))
    given = _given(inputs, 1)
    pads = [int(p) for p in _values(given)] if given is not None else _attr(node, "pads")
    if not pads:
        return None
    axes_given = _given(inputs, 3)
    axes = [int(a) % len(shape) for a in _values(axes_given)] if axes_given is not None else None
    axes = axes or list(range(len(shape)))
    half = len(pads) // 2
    for i, a in enumerate(axes[:half]):
        shape[a] += pads[i] + pads[i + half]
    return tuple(shape), _itemsize(x)


def _one_hot(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    indices, depth, values = inputs[:3]
    shape = list(_shape(indices))
    axis = int(_attr(node, "axis", -1))
    axis = axis + len(shape) + 1 if axis < 0 else axis
    shape.insert(axis, int(_values(depth)[0]))
    return tuple(shape), _itemsize(values)


def _random(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    shape = _attr(node, "shape")
    if not shape:
        return None
    return tuple(int(d) for d in shape), _elem_size(int(_attr(node, "dtype", 1)))


def _max_unpool(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    given = _given(inputs, 2)
    if given is None:
        return None
    return tuple(int(d) for d in _values(given)), _itemsize(inputs[0])


def _conv_transpose(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    x, w = inputs[0], inputs[1]
    xs, ws = _shape(x), _shape(w)
    spatial = len(xs) - 2
    out_channels = ws[1] * int(_attr(node, "group", 1))
    output_shape = _attr(node, "output_shape")
    if output_shape:
        dims = [int(d) for d in output_shape[-spatial:]]
    else:
        strides = _attr(node, "strides") or [1] * spatial
        dilations = _attr(node, "dilations") or [1] * spatial
        out_pad = _attr(node, "output_padding") or [0] * spatial
        pads = _attr(node, "pads") or [0] * (2 * spatial)
        kernel = _attr(node, "kernel_shape") or ws[2:]
        dims = [
            strides[i] * (xs[2 + i] - 1)
            + out_pad[i]
            + (kernel[i] - 1) * dilations[i]
            + 1
            - pads[i]
            - pads[i + spatial]
            for i in range(spatial)
        ]
    return (xs[0], out_channels, *dims), _itemsize(x)


def matmul_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The output shape of a numpy-style matmul of shapes ``a`` and ``b`` (None: none)."""
    if not a or not b:
        return None
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    batch = broadcast_shape(a2[:-2], b2[:-2])
    if batch is None:
        return None
    out = [*batch, a2[-2], b2[-1]]
    if len(a) == 1:
        out.pop(-2)
    if len(b) == 1:
        out.pop(-1)
    return tuple(out)


def _matmul(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    shape = matmul_shape(_shape(inputs[0]), _shape(inputs[1]))
    return (shape, _itemsize(inputs[0])) if shape is not None else None


def _gemm(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    a, b = _shape(inputs[0]), _shape(inputs[1])
    m = a[1] if _attr(node, "transA", 0) else a[0]
    n = b[0] if _attr(node, "transB", 0) else b[1]
    return (m, n), _itemsize(inputs[0])


def _gather(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
    data, indices = _shape(inputs[0]), _shape(inputs[1])
    axis = int(_attr(node, "axis", 0)) % max(len(data), 1)
    return (*data[:axis], *indices, *data[axis + 1 :]), _itemsize(inputs[0])


def _rank(v: Any) -> int:
    return len(v.shape)


def _broadcasting(itemsize: Callable[[Sequence[Any]], int]) -> Callable[..., Estimate]:
    def rule(node: onnx.NodeProto, inputs: Sequence[Any]) -> Estimate:
        first = inputs[0].shape
        if all(v is None or v.shape == first for v in inputs):
            return None  # no broadcasting (most nodes): no larger than an input that exists
        values = [v for v in inputs if v is not None]
        widest = max(values, key=_rank)
        rank = len(widest.shape)
        if all(v is widest or (math.prod(v.shape) == 1 and len(v.shape) <= rank) for v in values):
            return None  # a tensor with scalars (x * 0.5): the tensor's own shape
        shape = broadcast_shape(*(tuple(v.shape) for v in values))
        return (shape, itemsize(values)) if shape is not None else None

    return rule


_widest = _broadcasting(lambda vs: max(_itemsize(v) for v in vs))
_boolean = _broadcasting(lambda vs: 1)
_where = _broadcasting(lambda vs: _itemsize(vs[1]) if len(vs) > 1 else 1)

_RULES: dict[str, Callable[[onnx.NodeProto, Sequence[Any]], Estimate]] = {
    "ConstantOfShape": _constant_of_shape,
    "Expand": _expand,
    "Tile": _tile,
    "Range": _range,
    "Resize": _resize,
    "Upsample": _upsample,
    "Pad": _pad,
    "OneHot": _one_hot,
    "RandomNormal": _random,
    "RandomUniform": _random,
    "MaxUnpool": _max_unpool,
    "ConvTranspose": _conv_transpose,
    "MatMul": _matmul,
    "MatMulInteger": _matmul,
    "Gemm": _gemm,
    "Gather": _gather,
    "Where": _where,
    **dict.fromkeys(
        ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Sum", "Mean", "PRelu"),
        _widest,
    ),
    **dict.fromkeys(("BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"), _widest),
    **dict.fromkeys(
        ("Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual", "And", "Or", "Xor"),
        _boolean,
    ),
}


def _size(nbytes: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB", "PB", "EB"):
        if nbytes < 1024 or unit == "EB":
            return f"{nbytes:.3g} {unit}" if unit != "B" else f"{nbytes} B"
        nbytes /= 1024  # type: ignore[assignment]
    return f"{nbytes} B"  # pragma: no cover


def check_output_size(
    node: onnx.NodeProto,
    inputs: Sequence[Any],
    device: str = "cpu",
    op: tuple[str, str] | None = None,
) -> None:
    """Raises :class:`OutputTooLargeError` if the node's output would not fit in memory.

    Only the output's size is checked (from the input shapes and, for ``Expand``,
    ``ConstantOfShape``, ``Tile``, ``Resize``..., the few values of the shape input), so
    the check costs next to nothing; an op it does not know, or an input it cannot read,
    passes.  ``op``: the node's (op type, domain), when the caller has read them already.
    """
    op_type, domain = op if op is not None else (node.op_type, node.domain)
    rule = _RULES.get(op_type) if domain in ("", "ai.onnx") else None
    if rule is None:
        return
    try:
        estimate = rule(node, inputs)
    except Exception:  # inputs the rule cannot read: the runtime decides
        return
    if estimate is not None:
        refuse_if_too_large(*estimate, device=device)


def refuse_if_too_large(shape: Sequence[int], itemsize: int, device: Any = "cpu") -> None:
    """Raises :class:`OutputTooLargeError` when ``shape`` x ``itemsize`` bytes do not fit."""
    nbytes = math.prod(shape) * itemsize
    if nbytes < _SMALL or min(shape, default=0) < 0:
        return  # small, or invalid (the runtime says so)
    free = free_memory(str(device))
    if nbytes > free:
        dims = "x".join(str(d) for d in shape)
        raise OutputTooLargeError(
            f"its output would be [{dims}] ({_size(nbytes)}), more than the {_size(free)} of "
            f"memory free on {device}: not run (a corrupt shape in the model?)"
        )


__all__ = [
    "OutputTooLargeError",
    "broadcast_shape",
    "check_output_size",
    "free_memory",
    "matmul_shape",
    "refuse_if_too_large",
]
