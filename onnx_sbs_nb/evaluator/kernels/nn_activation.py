"""Activation functions (ai.onnx)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import op

# One tensor in, one out, no attribute: the torch function itself is the kernel (one call
# per node). Softplus: torch switches to the identity above x=20, where
# log1p(exp(-x)) < 3e-9 * x.
for _name, _since, _fn in (
    ("Relu", 1, torch.relu),
    ("Sigmoid", 1, torch.sigmoid),
    ("Tanh", 1, torch.tanh),
    ("Softplus", 1, F.softplus),
    ("Softsign", 1, F.softsign),
    ("HardSwish", 14, F.hardswish),
    ("Mish", 18, F.mish),
):
    op(_name, since=_since)(_fn)


@op("LeakyRelu", since=1)
def leaky_relu(x, alpha=0.01, consumed_inputs=None):
    return F.leaky_relu(x, alpha)


@op("PRelu", since=1)
def prelu(x, slope, consumed_inputs=None):
    # ONNX broadcasts slope unidirectionally (numpy style), unlike torch.prelu's channel rule
    return torch.where(x >= 0, x, x * slope)


@op("Elu", since=1)
def elu(x, alpha=1.0, consumed_inputs=None):
    return F.elu(x, alpha)


@op("Selu", since=1)
def selu(x, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875, consumed_inputs=None):
    return gamma * torch.where(x > 0, x, alpha * torch.expm1(x))


@op("Celu", since=12)
def celu(x, alpha=1.0):
    return F.celu(x, alpha)


@op("Gelu", since=20)
def gelu(x, approximate="none"):
    return F.gelu(x, approximate=approximate)


@op("HardSigmoid", since=1)
def hard_sigmoid(x, alpha=0.2, beta=0.5, consumed_inputs=None):
    return torch.clamp(x * alpha + beta, 0, 1)


@op("ThresholdedRelu", since=10)
def thresholded_relu(x, alpha=1.0):
    return F.threshold(x, alpha, 0.0)


@op("Swish", since=24)
def swish(x, alpha=1.0):
    return F.silu(x) if alpha == 1.0 else x * torch.sigmoid(x * alpha)


# Shrink is an activation-like element-wise op of opset 9
@op("Shrink", since=9)
def shrink(x, bias=0.0, lambd=0.5):
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.where(x < -lambd, x + bias, torch.where(x > lambd, x - bias, zero)).to(x.dtype)


@op("SwiGLU", since=28)
def swiglu(a, b, alpha=1.0):
    return a * torch.sigmoid(alpha * a) * b
