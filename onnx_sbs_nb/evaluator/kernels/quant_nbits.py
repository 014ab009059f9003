"""onnxruntime's weight-only block quantization: ``com.microsoft`` MatMulNBits and
GatherBlockQuantized (int4 embeddings), as onnxruntime's ``MatMulNBitsQuantizer``
(``matmul_nbits_quantizer``) writes them.

``Y = A @ dequant(B)^T (+ bias)`` where B, of shape [N, K], is cut along K into blocks of
``block_size`` values; each block has a scale and a zero point and
``dequant(b) = (code - zero_point) * scale``.  Storage:

- ``B``: uint8 [N, n_blocks, blob], codes of ``bits`` bits packed low bits first along K;
- ``scales``: [N * n_blocks] (or [N, n_blocks]) of A's type;
- ``zero_points``: uint8 codes packed the same way, ceil(n_blocks * bits / 8) bytes per
  row of B; or A's type, one per block, unpacked; absent: 2**(bits - 1);
- ``g_idx`` (deprecated, act-order GPTQ): the block of each k, instead of k // block_size.

onnxruntime's CPU kernel dequantizes B to float32 and runs its float32 GEMM at
``accuracy_level`` 0 to 3 (half precision A is computed in float32 and rounded once).
At ``accuracy_level`` 4 (the quantizer's choice for int8-capable CPUs) it mostly
quantizes A per block of K to int8 (symmetric, scale max|a| / 127, round half away from
zero) and sums integer products; that is reproduced here, so both follow the kernel they
stand in for, up to float32 summation order.

One difference is kept on purpose: with ``g_idx``, onnxruntime's CPU kernel (1.32)
ignores uint8 zero points and uses 2**(bits - 1); here they apply, as the contrib-op
spec says (float zero points apply in both).
"""

from __future__ import annotations

import torch

from ..lowbit import decode, is_lowbit
from ..registry import op

MS = "com.microsoft"


def unpack_codes(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The first ``count`` codes along the last axis of uint8 bytes holding ``8 // bits``
    codes each, low bits first, as int64."""
    per_byte = 8 // bits
    shifts = torch.arange(0, 8, bits, device=packed.device, dtype=torch.int64)
    codes = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    codes = codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)
    return codes[..., :count]


def _block_params(
    scales: torch.Tensor, zero_points: torch.Tensor | None, n: int, n_blocks: int, bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero point) per (row of B, block) as float32 [N, n_blocks]."""
    s = scales.to(torch.float32).reshape(n, n_blocks)
    if zero_points is None:
        zp = torch.full_like(s, float(1 << (bits - 1)))
    elif zero_points.dtype == torch.uint8:
        zp = unpack_codes(zero_points.reshape(n, -1), bits, n_blocks).to(torch.float32)
    else:
        zp = zero_points.to(torch.float32).reshape(n, n_blocks)
    return s, zp


def dequantize_nbits(
    b: torch.Tensor,
    scales: torch.Tensor,
    zero_points: torch.Tensor | None,
    g_idx: torch.Tensor | None,
    *,
    K: int,  # noqa: N803
    N: int,  # noqa: N803
    bits: int,
    block_size: int,
) -> torch.Tensor:
    """B as float32 [N, K]."""
    n_blocks = (K + block_size - 1) // block_size
    codes = unpack_codes(b.reshape(N, -1), bits, n_blocks * block_size)[:, :K]
    s, zp = _block_params(scales, zero_points, N, n_blocks, bits)
    if g_idx is not None:
        block = g_idx.to(torch.int64).reshape(K)
        return (codes.to(torch.float32) - zp[:, block]) * s[:, block]
    s = s.repeat_interleave(block_size, dim=1)[:, :K]
    zp = zp.repeat_interleave(block_size, dim=1)[:, :K]
    return (codes.to(torch.float32) - zp) * s


def _int8_blocks(a: torch.Tensor, block_size: int) -> torch.Tensor:
    """A (float32 [..., K]) as onnxruntime's int8 path sees it: quantized per block of K
    to int8 with scale max|a| / 127, rounded half away from zero, then dequantized."""
    k = a.shape[-1]
    pad = (-k) % block_size
    ap = torch.nn.functional.pad(a, (0, pad)) if pad else a
    blocks = ap.reshape(*a.shape[:-1], -1, block_size)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = amax / 127.0
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    v = blocks * inv
    q = torch.trunc(v + torch.copysign(torch.full_like(v, 0.5), v)).clamp(-127, 127)
    return (q * scale).reshape(*a.shape[:-1], -1)[..., :k]


def _int8_path(accuracy_level: int, bits: int, block_size: int, zero_points, g_idx) -> bool:
    """Whether onnxruntime's CPU kernel quantizes A to int8 (measured on onnxruntime
    1.32: it keeps the float path for float zero points, g_idx, and 2-bit codes in
    blocks under 32)."""
    if accuracy_level != 4 or g_idx is not None:
        return False
    if zero_points is not None and zero_points.dtype != torch.uint8:
        return False
    return bits != 2 or block_size >= 32


@op("MatMulNBits", domain=MS)
def matmul_nbits(
    a,
    b,
    scales,
    zero_points=None,
    g_idx=None,
    bias=None,
    *,
    K,  # noqa: N803
    N,  # noqa: N803
    bits=4,
    block_size,
    accuracy_level=0,
):
    if bits not in (2, 4, 8):
        raise NotImplementedError(f"MatMulNBits with bits={bits}")
    if (
        b.dim() != 3
        and b.numel() != N * ((K + block_size - 1) // block_size) * block_size * bits // 8
    ):
        raise NotImplementedError("MatMulNBits with a prepacked B")
    w = dequantize_nbits(b, scales, zero_points, g_idx, K=K, N=N, bits=bits, block_size=block_size)
    af = a.to(torch.float32)
    if _int8_path(accuracy_level, bits, block_size, zero_points, g_idx):
        af = _int8_blocks(af, block_size)
    y = torch.matmul(af, w.t())
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y.to(a.dtype)


def _gather_codes(data: torch.Tensor, bits: int) -> torch.Tensor:
    """The values of GatherBlockQuantized's data as float32, in its logical shape: uint8
    bytes hold ``8 // bits`` codes along the last axis; int4/uint4 and float8/float4 are
    one element each."""
    if is_lowbit(data):
        return decode(data)
    if data.dtype == torch.uint8 and bits < 8:
        return unpack_codes(data, bits, data.shape[-1] * (8 // bits)).to(torch.float32)
    return data.to(torch.float32)


def _gather_zero_points(zero_points, data, scales, bits: int) -> torch.Tensor | None:
    """Zero points as float32 in the scales' shape (None: none to subtract)."""
    if zero_points is None:
        if data.dtype == torch.uint8:  # codes stored unsigned, centred at 2**(bits - 1)
            return torch.full((), float(1 << (bits - 1)))
        return None
    if zero_points.dtype == torch.uint8 and bits < 8:
        return unpack_codes(zero_points, bits, scales.shape[-1]).to(torch.float32)
    return decode(zero_points) if is_lowbit(zero_points) else zero_points.to(torch.float32)


def _pick(t: torch.Tensor | None, axis: int, index: torch.Tensor, n: int):
    """t's slices at ``index`` along ``axis`` when t runs along it (else it broadcasts)."""
    if t is None or t.dim() == 0 or t.shape[axis] != n:
        return t
    return t.index_select(axis, index)


def _along_blocks(t: torch.Tensor | None, axis: int, block: int, size: int):
    """One parameter per block along ``axis`` -> one per element."""
    if t is None or t.dim() == 0 or t.shape[axis] == 1:
        return t
    return t.repeat_interleave(block, dim=axis).narrow(axis, 0, size)


@op("GatherBlockQuantized", domain=MS)
def gather_block_quantized(
    data,
    indices,
    scales,
    zero_points=None,
    *,
    gather_axis=0,
    quantize_axis=1,
    block_size=128,
    bits=4,
):
    """Rows of a block-quantized table (int4/uint8 embeddings), dequantized:
    ``(code - zero_point) * scale`` in float32, then the scales' type.  An index out of
    range gives zeros, as in onnxruntime."""
    rank = data.dim()
    ga, qa = gather_axis % rank, quantize_axis % rank
    if ga == qa:
        raise NotImplementedError("GatherBlockQuantized with gather_axis == quantize_axis")
    q = _gather_codes(data, bits)
    zp = _gather_zero_points(zero_points, data, scales, bits)
    n = q.shape[ga]
    flat = indices.to(torch.int64).reshape(-1)
    valid = (flat >= -n) & (flat < n)
    index = torch.where(flat < 0, flat + n, flat).clamp(0, max(n - 1, 0))
    q = q.index_select(ga, index)
    s = _pick(scales.to(torch.float32), ga, index, n)
    zp = _pick(zp, ga, index, n)
    size = q.shape[qa]
    block = block_size or size
    s, zp = _along_blocks(s, qa, block, size), _along_blocks(zp, qa, block, size)
    y = (q - zp) * s if zp is not None else q * s
    view = [1] * rank
    view[ga] = flat.numel()
    y = torch.where(valid.reshape(view), y, torch.zeros((), dtype=y.dtype))
    shape = [*q.shape[:ga], *indices.shape, *q.shape[ga + 1 :]]
    return y.reshape(shape).to(scales.dtype)
