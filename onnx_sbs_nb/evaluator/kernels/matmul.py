"""Matrix products (ai.onnx): MatMul, Gemm, MatMulInteger, Einsum, Det."""

from __future__ import annotations

import torch

from ..registry import op


def _int_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    # torch has no integer matmul on every device: exact in float64 below 2**53.
    return torch.matmul(a.to(torch.float64), b.to(torch.float64)).to(a.dtype)


@op("MatMul", since=1)
def matmul(a, b):
    if a.is_floating_point():
        return torch.matmul(a, b)
    return _int_matmul(a, b)


@op("Gemm", since=1)
def gemm(a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0, broadcast=0):  # noqa: N803
    if transA:
        a = a.transpose(0, 1)
    if transB:
        b = b.transpose(0, 1)
    y = torch.matmul(a, b) if a.is_floating_point() else _int_matmul(a, b)
    if alpha != 1.0:
        y = y * alpha
    if c is not None and beta != 0:
        y = y + (c * beta if beta != 1.0 else c)
    return y.to(a.dtype)


@op("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    aa = a.to(torch.int32)
    bb = b.to(torch.int32)
    if a_zero_point is not None:
        zp = a_zero_point.to(torch.int32)
        # a per-row zero point applies to the rows of A
        aa = aa - (zp.reshape(-1, 1) if zp.dim() == 1 and zp.numel() > 1 else zp)
    if b_zero_point is not None:
        bb = bb - b_zero_point.to(torch.int32)
    return torch.matmul(aa.to(torch.float64), bb.to(torch.float64)).to(torch.int32)


@op("Einsum", since=12)
def einsum(*xs, equation):
    eq = equation.replace(" ", "")
    if xs and not xs[0].is_floating_point():
        return torch.einsum(eq, *[x.to(torch.float64) for x in xs]).to(xs[0].dtype)
    return torch.einsum(eq, *xs)


@op("Det", since=11)
def det(x):
    return torch.linalg.det(x)
