"""Sub-byte ONNX element types (INT4, UINT4, INT2, UINT2, FLOAT4E2M1) in the evaluator.

torch has no element-wise dtype for them, but it has storage-only "shell" dtypes of one
byte per element (``torch.int4``, ``torch.uint4``, ``torch.int2``, ``torch.uint2``) and
``torch.float4_e2m1fn_x2``.  The evaluator holds such a value unpacked, one element per
byte, with the bits ml_dtypes gives it (the code in the low bits, no sign extension),
under the shell dtype as the tag of its ONNX type: ``convert`` turns it into the
ml_dtypes array the ONNX reference returns, with no copy.  ``float4_e2m1fn_x2`` is used
only as that tag here: each byte holds one float4e2m1 code, not two.

Kernels compute on them by decoding to float32 (every value is exact there) and
encoding back with ONNX's rounding: half to even, saturating.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import onnx
import torch

TP = onnx.TensorProto

# ONNX element type -> (torch shell dtype name, integer range or None for float4)
_SPEC: dict[int, tuple[str, tuple[int, int] | None]] = {
    TP.INT4: ("int4", (-8, 7)),
    TP.UINT4: ("uint4", (0, 15)),
    TP.FLOAT4E2M1: ("float4_e2m1fn_x2", None),
}
if hasattr(TP, "INT2"):
    _SPEC[TP.INT2] = ("int2", (-2, 1))
    _SPEC[TP.UINT2] = ("uint2", (0, 3))

ONNX_TO_LOWBIT: dict[int, torch.dtype] = {
    elem: getattr(torch, name) for elem, (name, _) in _SPEC.items() if hasattr(torch, name)
}
INT_RANGES: dict[torch.dtype, tuple[int, int]] = {
    ONNX_TO_LOWBIT[elem]: rng
    for elem, (_, rng) in _SPEC.items()
    if rng is not None and elem in ONNX_TO_LOWBIT
}
FLOAT4 = ONNX_TO_LOWBIT.get(TP.FLOAT4E2M1)
LOWBIT_DTYPES = frozenset(ONNX_TO_LOWBIT.values())

# the 16 float4e2m1 codes: sign bit 3, exponent bits 2-1, mantissa bit 0
_F4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
_F4_TABLE = torch.tensor(_F4_VALUES + [-v for v in _F4_VALUES], dtype=torch.float32)
_F4_MAX = 6.0


def is_lowbit(x: torch.Tensor) -> bool:
    return isinstance(x, torch.Tensor) and x.dtype in LOWBIT_DTYPES


def decode(x: torch.Tensor) -> torch.Tensor:
    """The float32 values of a sub-byte tensor (exact)."""
    codes = x.view(torch.uint8).to(torch.int64)
    if x.dtype == FLOAT4:
        return _F4_TABLE.to(x.device)[codes & 0xF]
    lo, hi = INT_RANGES[x.dtype]
    bits = (hi - lo + 1).bit_length() - 1
    codes = codes & ((1 << bits) - 1)
    if lo < 0:
        codes = torch.where(codes > hi, codes - (1 << bits), codes)
    return codes.to(torch.float32)


def _encode_float4(v: torch.Tensor, saturate: bool) -> torch.Tensor:
    """Round half to even onto the float4e2m1 grid; out of range saturates (the type has
    no infinity), NaN becomes the code of -0 as in the ONNX reference."""
    a = v.abs().to(torch.float32)
    grid = _F4_TABLE[:8].to(v.device)
    # index of the nearest grid point; ties go to the even code (mantissa bit 0)
    idx = torch.bucketize(a.clamp(max=_F4_MAX), grid)
    idx = idx.clamp(1, 7)
    lo_v, hi_v = grid[idx - 1], grid[idx]
    d_lo, d_hi = a - lo_v, hi_v - a
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (idx % 2 == 0))
    code = torch.where(pick_hi, idx, idx - 1)
    code = torch.where(a > _F4_MAX, 7, code)
    sign = torch.signbit(v).to(torch.int64) << 3
    code = code | sign
    code = torch.where(torch.isnan(v), 0x8, code)
    return code.to(torch.uint8)


def encode(v: torch.Tensor, dtype: torch.dtype, saturate: bool = True) -> torch.Tensor:
    """Values to a sub-byte dtype as QuantizeLinear does: rounded half to even and
    saturated to the integer range (float4e2m1: to the nearest, saturated)."""
    if dtype == FLOAT4:
        return _encode_float4(v, saturate).view(dtype)
    lo, hi = INT_RANGES[dtype]
    vf = v.to(torch.float64) if v.is_floating_point() else v.to(torch.int64)
    return _pack_int(torch.round(vf).clamp(lo, hi), dtype)


def cast(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values to a sub-byte dtype as Cast does in the ONNX reference (ml_dtypes): floats
    truncated toward zero like every float-to-integer Cast, a value out of the range
    (undefined by the spec) or NaN gives 0.  onnxruntime rounds and wraps instead: the
    two agree on the values the type holds."""
    if dtype == FLOAT4:
        return _encode_float4(v, True).view(dtype)
    lo, hi = INT_RANGES[dtype]
    t = torch.trunc(v.to(torch.float64)) if v.is_floating_point() else v.to(torch.int64)
    inside = (t >= lo) & (t <= hi)
    return _pack_int(torch.where(inside, t, torch.zeros_like(t)), dtype)


def _pack_int(q: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    lo, hi = INT_RANGES[dtype]
    bits = (hi - lo + 1).bit_length() - 1
    return (q.to(torch.int64) & ((1 << bits) - 1)).to(torch.uint8).view(dtype)


# Ops that only select, move or copy elements (and fill with a given element): their
# result on a sub-byte value is the result on its codes.  Most torch kernels have no
# implementation for the storage-only dtypes (index_cpu, copy_kernel, fill_cpu...), so
# the kernels of these ops run on a uint8 view of the codes (no copy) and their uint8
# outputs are viewed back.  ONNX allows the sub-byte types in a few of them (Reshape,
# Transpose, Pad, Squeeze...); converters and quantizers also emit Gather, Slice,
# Concat or Expand on them, which onnxruntime runs.
CODE_OPS = frozenset(
    {
        "Compress",
        "Concat",
        "ConstantOfShape",
        "DepthToSpace",
        "Expand",
        "Flatten",
        "Gather",
        "GatherElements",
        "GatherND",
        "Identity",
        "Pad",
        "Reshape",
        "ReverseSequence",
        "ScatterElements",
        "ScatterND",
        "Shape",
        "Size",
        "Slice",
        "SpaceToDepth",
        "Split",
        "Squeeze",
        "TensorScatter",
        "Tile",
        "Transpose",
        "Trilu",
        "Unsqueeze",
        "Where",
    }
)


def on_codes(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A kernel of a ``CODE_OPS`` op that also runs on sub-byte values.

    The kernel runs as it is first: a value-preserving op often works on the shell
    dtypes (views), and the common path then costs one try block.  When torch refuses a
    sub-byte input, the call is redone on the codes."""

    @functools.wraps(fn)
    def call(*args: Any, **kw: Any) -> Any:
        try:
            return fn(*args, **kw)
        except (NotImplementedError, RuntimeError):
            dtype = _first_lowbit(args, kw.values())
            if dtype is None or kw.get("reduction", "none") != "none":
                # a scatter that adds or multiplies computes on values, not codes
                raise
        out = fn(*[_codes(a) for a in args], **{k: _codes(v) for k, v in kw.items()})
        return _back(out, dtype)

    return call


def _first_lowbit(*groups: Any) -> torch.dtype | None:
    for group in groups:
        for v in group:
            if isinstance(v, torch.Tensor) and v.dtype in LOWBIT_DTYPES:
                return v.dtype
    return None


def _codes(v: Any) -> Any:
    if isinstance(v, torch.Tensor) and v.dtype in LOWBIT_DTYPES:
        return v.view(torch.uint8)
    return v


def _back(out: Any, dtype: torch.dtype) -> Any:
    """uint8 outputs viewed as the sub-byte dtype again: in these ops an output of the
    data's type can only come from its codes."""
    if isinstance(out, torch.Tensor):
        return out.view(dtype) if out.dtype == torch.uint8 else out
    if isinstance(out, (tuple, list)):
        return type(out)(_back(o, dtype) for o in out)
    return out
