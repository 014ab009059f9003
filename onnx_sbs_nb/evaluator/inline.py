"""Inline forms of the hottest kernels, for the generated code of a whole graph.

On models made of small tensors, a kernel's Python frame (argument checks, ``as_ints``,
dtype branches) costs as much as the torch call itself. For the ops that dominate exported
transformers, the code generator writes the torch call straight into the plan's
function instead of calling the kernel, using what is known when the graph is compiled:
attributes and constant inputs (shapes, axes, exponents).

Each form performs exactly the torch calls its kernel performs for the same inputs, so
results are bit for bit those of the kernel (tests compare the two over the ONNX node
suite and the end-to-end models). Where the kernel would take another branch that the
form does not write out (an integer base for Pow, a wide unsigned dtype...), the form
raises and the run is redone with the kernels, which then serve every later run of that
plan.

A form is ``build(args, consts, attrs) -> str | None``: ``args`` are the Python
expressions of the node's inputs ("None" when missing), ``consts[i]`` the value of input
``i`` when it is a constant (a tensor, or a tuple of ints for ``int_inputs``) else
``NOT_CONSTANT``, ``attrs`` the converted attributes; None means no inline form.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Optional

import onnx
import torch

NOT_CONSTANT = object()

# Helpers of the generated code, in the subset of Python that TorchScript also compiles
# (the plan's TorchScript form uses the same source). A form that meets a case only its
# kernel handles raises: the run is then redone with the kernels.
HELPER_SOURCE = """
def _fallback() -> Tensor:
    raise RuntimeError("inline form: this case is left to the kernel")


def _narrow(x: Tensor, axis: int, start: int, end: int) -> Tensor:
    # the Slice kernel's one-axis, step-1 branch; clamps like slice(start, end).indices(n)
    rank = x.dim()
    if rank == 0:
        raise RuntimeError("inline form: this case is left to the kernel")
    a = axis + rank if axis < 0 else axis
    n = x.size(a)
    s = start + n if start < 0 else start
    s = min(max(s, 0), n)
    e = end + n if end < 0 else end
    e = min(max(e, 0), n)
    return x.narrow(a, s, max(e - s, 0))


def _expand(x: Tensor, shape: List[int]) -> Tensor:
    # Expand: numpy's bidirectional broadcast (torch.broadcast_shapes costs ~20 us)
    a = x.shape
    n = max(len(a), len(shape))
    out: List[int] = []
    for i in range(n):
        ia = i - n + len(a)
        ib = i - n + len(shape)
        da = a[ia] if ia >= 0 else 1
        db = shape[ib] if ib >= 0 else 1
        if da != db and da != 1 and db != 1:
            raise ValueError("Expand: the input shape and the shape argument do not broadcast")
        out.append(db if da == 1 else da)
    return x.expand(out)


def _gather_nd0(x: Tensor, indices: Tensor) -> Tensor:
    # GatherND with batch_dims=0: negative indices wrapped, then one advanced indexing
    idx = indices.to(torch.int64)
    k = idx.shape[-1]
    dims = torch.tensor(x.shape[:k], dtype=torch.int64).to(idx.device)
    idx = torch.where(idx < 0, idx + dims, idx)
    parts: List[Optional[Tensor]] = []
    for t in idx.unbind(-1):
        parts.append(t)
    return torch.ops.aten.index(x, parts)


def _cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    # the Cast kernel (cast_tensor) for a target that is not a float8 type
    if x.dtype == dtype:
        return x
    if x.is_floating_point() and x.element_size() == 1:
        raise RuntimeError("inline form: this case is left to the kernel")
    if dtype == torch.bool and x.is_floating_point():
        return x != 0
    return x.to(dtype)
"""

# Globals the generated Python code may reference.
HELPERS: dict[str, Any] = {
    "torch": torch,
    "Tensor": torch.Tensor,
    "List": list,
    "Optional": Optional,
}
exec(compile(HELPER_SOURCE, "<onnx_sbs_nb.evaluator inline helpers>", "exec"), HELPERS)

Builder = Callable[[list[str], list[Any], dict[str, Any]], "str | None"]


def _ints(v: Any) -> list[int] | None:
    return list(v) if type(v) is tuple else None


def _call(fn: str, n: int | None = None) -> Builder:
    """``fn(args...)`` for kernels that are that torch function (with ``n`` inputs)."""

    def build(args, consts, attrs):
        if attrs or (n is not None and len(args) != n) or "None" in args:
            return None
        return f"{fn}({', '.join(args)})"

    build.torch_fn = fn  # type: ignore[attr-defined]  # read by inplace.py
    return build


def _div(args, consts, attrs):
    if attrs or len(args) != 2:
        return None
    a, b = args
    return (
        f"(torch.div({a}, {b}) if {a}.is_floating_point() or {a}.is_complex() "
        f'else torch.div({a}, {b}, rounding_mode="trunc"))'
    )


def _pow(args, consts, attrs):
    if attrs or len(args) != 2:
        return None
    e = consts[1]
    if not isinstance(e, torch.Tensor) or e.dim() or e.device.type != "cpu" or e.is_complex():
        return None
    value = e.item()  # what the kernel passes to torch.pow for a host scalar exponent
    if type(value) not in (int, float) or not math.isfinite(value):
        return None
    x = args[0]
    return f"(torch.pow({x}, {value!r}) if {x}.is_floating_point() else _fallback())"


def _matmul(args, consts, attrs):
    if attrs or len(args) != 2:
        return None
    a, b = args
    return f"(torch.matmul({a}, {b}) if {a}.is_floating_point() else _fallback())"


def _reshape(args, consts, attrs):
    dims = _ints(consts[1]) if len(args) == 2 else None
    if dims is None or set(attrs) - {"allowzero"}:
        return None
    x = args[0]
    if not attrs.get("allowzero", 0):
        dims = [f"{x}.shape[{i}]" if d == 0 else str(d) for i, d in enumerate(dims)]
    return f"{x}.reshape([{', '.join(map(str, dims))}])"


def _transpose(args, consts, attrs):
    perm = attrs.get("perm")
    if len(args) != 1 or perm is None or set(attrs) != {"perm"}:
        return None
    return f"{args[0]}.permute({list(perm)!r})"


def _slice(args, consts, attrs):
    if attrs or len(args) < 3:
        return None
    starts, ends = _ints(consts[1]), _ints(consts[2])
    axes = _ints(consts[3]) if len(args) > 3 and args[3] != "None" else [0]
    steps = _ints(consts[4]) if len(args) > 4 and args[4] != "None" else [1]
    if not starts or not ends or axes is None or steps is None:
        return None
    if len(starts) != 1 or len(ends) != 1 or len(axes) != 1 or steps != [1]:
        return None
    return f"_narrow({args[0]}, {axes[0]}, {starts[0]}, {ends[0]})"


def _reduce(fn: str) -> Builder:
    """The kernels' single-axis float branch (``reduce`` in kernels/reduce.py)."""

    def build(args, consts, attrs):
        axes = _ints(consts[1]) if len(args) == 2 else None
        if not axes or len(axes) != 1 or set(attrs) - {"keepdims", "noop_with_empty_axes"}:
            return None
        x, keep = args[0], bool(attrs.get("keepdims", 1))
        return (
            f"({fn}({x}, dim={axes[0]}, keepdim={keep}) "
            f"if {x}.is_floating_point() and {x}.numel() else _fallback())"
        )

    return build


def _concat(args, consts, attrs):
    if set(attrs) != {"axis"} or not args or "None" in args:
        return None
    return f"torch.cat([{', '.join(args)}], dim={attrs['axis']})"


def _softmax(fn: str) -> Builder:
    def build(args, consts, attrs):
        if len(args) != 1 or set(attrs) - {"axis"}:
            return None
        x = args[0]
        return f"({fn}({x}, {attrs.get('axis', -1)}) if {x}.dim() else _fallback())"

    return build


def _gather(args, consts, attrs):
    axis = attrs.get("axis", 0)
    if len(args) != 2 or set(attrs) - {"axis"} or axis < 0:
        return None
    return f"{args[0]}[{':, ' * axis}{args[1]}]"


def _expand_form(args, consts, attrs):
    dims = _ints(consts[1]) if len(args) == 2 else None
    if attrs or dims is None:
        return None
    return f"_expand({args[0]}, {dims!r})"


def _gather_nd(args, consts, attrs):
    if len(args) != 2 or set(attrs) - {"batch_dims"} or attrs.get("batch_dims", 0):
        return None
    return f"_gather_nd0({args[0]}, {args[1]})"


_PLAIN_CASTS = {
    onnx.TensorProto.FLOAT: "torch.float32",
    onnx.TensorProto.DOUBLE: "torch.float64",
    onnx.TensorProto.FLOAT16: "torch.float16",
    onnx.TensorProto.BFLOAT16: "torch.bfloat16",
    onnx.TensorProto.INT64: "torch.int64",
    onnx.TensorProto.INT32: "torch.int32",
    onnx.TensorProto.INT16: "torch.int16",
    onnx.TensorProto.INT8: "torch.int8",
    onnx.TensorProto.UINT8: "torch.uint8",
    onnx.TensorProto.BOOL: "torch.bool",
}


def _cast_form(args, consts, attrs):
    # saturate and round_mode only apply to float8 targets, which are not written inline
    target = _PLAIN_CASTS.get(attrs.get("to"))
    if len(args) != 1 or target is None or set(attrs) - {"to", "saturate", "round_mode"}:
        return None
    return f"_cast({args[0]}, {target})"


def _unsqueeze(args, consts, attrs):
    axes = _ints(consts[1]) if len(args) == 2 else None
    if attrs or not axes or len(axes) != 1:
        return None
    return f"{args[0]}.unsqueeze({axes[0]})"


# (domain, op_type, since) of the kernel -> its inline form
FORMS: dict[tuple[str, str, int], Builder] = {
    ("", "Add", 7): _call("torch.add", 2),
    ("", "Sub", 7): _call("torch.sub", 2),
    ("", "Mul", 7): _call("torch.mul", 2),
    ("", "Div", 7): _div,
    ("", "Pow", 7): _pow,
    ("", "MatMul", 1): _matmul,
    ("", "Reshape", 5): _reshape,
    ("", "Transpose", 1): _transpose,
    ("", "Slice", 10): _slice,
    ("", "ReduceSum", 13): _reduce("torch.sum"),
    ("", "ReduceMean", 18): _reduce("torch.mean"),
    ("", "ReduceMax", 18): _reduce("torch.amax"),
    ("", "ReduceMin", 18): _reduce("torch.amin"),
    ("", "Concat", 1): _concat,
    ("", "Softmax", 13): _softmax("torch.softmax"),
    ("", "LogSoftmax", 13): _softmax("torch.log_softmax"),
    ("", "Gather", 1): _gather,
    ("", "Unsqueeze", 13): _unsqueeze,
    ("", "Expand", 8): _expand_form,
    ("", "GatherND", 11): _gather_nd,
    ("", "Cast", 6): _cast_form,
    ("", "Where", 9): _call("torch.where", 3),
    ("", "IsNaN", 9): _call("torch.isnan", 1),
    ("", "Equal", 7): _call("torch.eq", 2),
    ("", "Less", 7): _call("torch.lt", 2),
    ("", "Greater", 7): _call("torch.gt", 2),
    ("", "LessOrEqual", 7): _call("torch.le", 2),
    ("", "GreaterOrEqual", 7): _call("torch.ge", 2),
    ("", "And", 7): _call("torch.logical_and", 2),
    ("", "Or", 7): _call("torch.logical_or", 2),
    ("", "Xor", 7): _call("torch.logical_xor", 2),
    ("", "Not", 1): _call("torch.logical_not", 1),
}


def form_for(domain: str, op_type: str, since: int, kernel: Any) -> Builder | None:
    """The inline form of a registered kernel, if it has one."""
    form = FORMS.get((domain, op_type, since))
    if form is not None:
        return form
    name = getattr(kernel, "__name__", None)
    if name and getattr(torch, name, None) is kernel:
        # the kernel is a torch function itself (Neg, Sqrt, Relu, Sigmoid...)
        return _call(f"torch.{name}")
    return None
