"""What a value is on each side, and how an fx value may be an ONNX value.

The declared element types and shapes of the ONNX model's values and of the program's fx
values, and the transforms a pair is compared through when the two differ in a way that
still makes them one value (a transposed weight, size-1 axes squeezed away, a complex value
as its real pairs, a coarser float type).  Every pairing rule asks these before it pairs.
"""

from __future__ import annotations

from typing import Any

import onnx
import torch

from ...dtypes import ONNX_TO_TORCH
from .rules import MetadataRule, NameRule

TRANSFORM_TRANSPOSE = "transpose"


# the ONNX value is the fx value with size-1 axes removed or added (onnxsim and other graph
# tools squeeze a batch of one away): Pair.squeeze holds (fx axes, ONNX axes) of size 1
TRANSFORM_RESHAPE = "reshape"


TRANSFORM_PERMUTE = "permute"  # the ONNX value is the fx value with its axes permuted (perm)


# the ONNX value is the complex fx value as real pairs: ONNX has no complex arithmetic, so
# the exporter computes torch.fft and complex products on [..., 2] tensors
TRANSFORM_AS_REAL = "as_real"


# the ONNX value is the fx value in another float type (a model converted to float16 or
# bfloat16 computes in it): compared in the coarser type, fed to the model cast to it
TRANSFORM_CAST = "cast"


_FLOAT_DTYPES = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})


_REAL_OF_COMPLEX = {torch.complex64: torch.float32, torch.complex128: torch.float64}


def onnx_value_types(model: onnx.ModelProto) -> dict[str, tuple[int, int | None]]:
    """Declared (elem_type, rank or None) of every typed value in the main graph."""
    return onnx_value_types_and_shapes(model)[0]


def onnx_value_shapes(model: onnx.ModelProto) -> dict[str, tuple[int | None, ...]]:
    """Declared shapes of the main graph's values (None for a dimension not known)."""
    return onnx_value_types_and_shapes(model)[1]


def onnx_value_types_and_shapes(
    model: onnx.ModelProto,
) -> tuple[dict[str, tuple[int, int | None]], dict[str, tuple[int | None, ...]]]:
    """:func:`onnx_value_types` and :func:`onnx_value_shapes` in one reading of the
    graph (each protobuf field read from Python makes an object)."""
    types: dict[str, tuple[int, int | None]] = {}
    shapes: dict[str, tuple[int | None, ...]] = {}
    g = model.graph
    for vi in (*g.input, *g.output, *g.value_info):
        vt = vi.type
        if not vt.HasField("tensor_type"):
            continue
        tt = vt.tensor_type
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim)
            shapes[vi.name] = shape
            if tt.elem_type:
                types[vi.name] = (tt.elem_type, len(shape))
        elif tt.elem_type:
            types[vi.name] = (tt.elem_type, None)
    for init in g.initializer:
        dims = tuple(int(d) for d in init.dims)
        types[init.name] = (init.data_type, len(dims))
        shapes[init.name] = dims
    return types, shapes


def fx_value_shape(node: torch.fx.Node) -> tuple[int | None, ...] | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return tuple(d if isinstance(d, int) else None for d in val.shape)
    return None


def shapes_compatible(a: tuple | None, b: tuple | None) -> bool:
    """False only when both shapes are known and a known dimension differs."""
    if a is None or b is None:
        return True
    if len(a) != len(b):
        return False
    return all(x is None or y is None or x == y for x, y in zip(a, b))


def fx_value_type(node: torch.fx.Node) -> tuple[torch.dtype, int] | None:
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype, val.dim()
    return None


def types_compatible(fx_type: tuple[torch.dtype, int] | None, onnx_type: Any) -> bool:
    """False only when both types are known and disagree."""
    if fx_type is None or onnx_type is None:
        return True
    elem, rank = onnx_type
    dtype = ONNX_TO_TORCH.get(elem)
    if dtype is not None and dtype != fx_type[0]:
        return False
    return rank is None or rank == fx_type[1]


def as_real_compatible(node: torch.fx.Node, onnx_type: Any, onnx_shape: tuple | None) -> bool:
    """Whether a complex fx value may be the ONNX value holding its real pairs."""
    fx_type = fx_value_type(node)
    if fx_type is None or fx_type[0] not in _REAL_OF_COMPLEX or onnx_type is None:
        return False
    elem, rank = onnx_type
    if ONNX_TO_TORCH.get(elem) != _REAL_OF_COMPLEX[fx_type[0]]:
        return False
    if rank is not None and rank != fx_type[1] + 1:
        return False
    if onnx_shape is not None and onnx_shape and onnx_shape[-1] not in (None, 2):
        return False
    shape = fx_value_shape(node)
    return shapes_compatible(None if shape is None else (*shape, 2), onnx_shape)


def value_transform(node: torch.fx.Node, onnx_type: Any, onnx_shape: tuple | None) -> str | bool:
    """How the fx value of ``node`` may be the ONNX value of that type and shape: ``True``
    as it is, :data:`TRANSFORM_AS_REAL` as its real pairs, ``False`` not at all."""
    if types_compatible(fx_value_type(node), onnx_type) and shapes_compatible(
        fx_value_shape(node), onnx_shape
    ):
        return True
    return TRANSFORM_AS_REAL if as_real_compatible(node, onnx_type, onnx_shape) else False


def size_one_axes(
    fx_shape: tuple | None, onnx_shape: tuple | None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(fx axes, ONNX axes) of size 1 when the two shapes differ only by such axes (the
    same elements in the same order), else None."""
    if fx_shape is None or onnx_shape is None or len(fx_shape) == len(onnx_shape):
        return None
    fx_rest = [d for d in fx_shape if d != 1]
    onnx_rest = [d for d in onnx_shape if d != 1]
    if len(fx_rest) != len(onnx_rest) or not shapes_compatible(tuple(fx_rest), tuple(onnx_rest)):
        return None
    return (
        tuple(i for i, d in enumerate(fx_shape) if d == 1),
        tuple(i for i, d in enumerate(onnx_shape) if d == 1),
    )


def other_float(node: torch.fx.Node, onnx_type: Any) -> bool:
    """Whether the ONNX value holds the fx value in a coarser float type, same rank."""
    fx_type = fx_value_type(node)
    if fx_type is None or onnx_type is None or fx_type[0] not in _FLOAT_DTYPES:
        return False
    dtype = ONNX_TO_TORCH.get(onnx_type[0])
    rank = onnx_type[1]
    # only to a coarser type: a converter lowers the precision, and a model computing in
    # more precision than the program is another computation (never hidden by a cast)
    return (
        dtype in _FLOAT_DTYPES
        and torch.finfo(dtype).eps > torch.finfo(fx_type[0]).eps
        and rank in (None, fx_type[1])
    )


def _squeezed(
    node: torch.fx.Node, onnx_type: Any, onnx_shape: tuple | None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    fx_type = fx_value_type(node)
    if fx_type is None or onnx_type is None:
        return None
    dtype = ONNX_TO_TORCH.get(onnx_type[0])
    if dtype is not None and dtype != fx_type[0]:
        return None
    return size_one_axes(fx_value_shape(node), onnx_shape)


def transform_of(
    node: torch.fx.Node,
    onnx_type: Any,
    onnx_shape: tuple | None,
    rule: str,
    transform: str | None,
    coarser: bool,
) -> tuple[str | None, Any] | None:
    """How fx value ``node`` becomes the ONNX value (its transform, and the size-1 axes of
    a squeeze), None when they cannot be the same value.  ``transform``: the one the
    rule asks for (None: found from the declared types and shapes)."""
    squeeze = None
    if transform == TRANSFORM_RESHAPE:
        fx_type = fx_value_type(node)
        if fx_type is None or onnx_type is None:
            return None
        same = ONNX_TO_TORCH.get(onnx_type[0]) == fx_type[0]
        if not same and not other_float(node, (onnx_type[0], None)):
            return None
    elif transform is None:
        how = value_transform(node, onnx_type, onnx_shape)
        if how is False and rule in (NameRule.name, MetadataRule.name):
            squeeze = _squeezed(node, onnx_type, onnx_shape)
            how = TRANSFORM_RESHAPE if squeeze is not None else False
        if how is False and coarser and shapes_compatible(fx_value_shape(node), onnx_shape):
            how = TRANSFORM_CAST
        if how is False:
            return None
        transform = None if how is True else how
    return transform, squeeze


def reshape_target(shape: tuple | None) -> tuple[int, ...] | None:
    if shape is None or sum(d is None for d in shape) > 1:
        return None
    return tuple(-1 if d is None else d for d in shape)


def numel(shape: tuple | None) -> int | None:
    if shape is None or any(d is None for d in shape):
        return None
    n = 1
    for d in shape:
        n *= d
    return n


__all__ = [
    "TRANSFORM_AS_REAL",
    "TRANSFORM_CAST",
    "TRANSFORM_PERMUTE",
    "TRANSFORM_RESHAPE",
    "TRANSFORM_TRANSPOSE",
    "as_real_compatible",
    "fx_value_shape",
    "fx_value_type",
    "numel",
    "onnx_value_shapes",
    "onnx_value_types",
    "onnx_value_types_and_shapes",
    "other_float",
    "reshape_target",
    "shapes_compatible",
    "size_one_axes",
    "transform_of",
    "types_compatible",
    "value_transform",
]
