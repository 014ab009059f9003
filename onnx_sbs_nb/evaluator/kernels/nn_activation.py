"""Activation functions (ai.onnx)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..registry import op


@op("Relu", since=1)
def relu(x, consumed_inputs=None):
    return torch.relu(x)


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


@op("HardSwish", since=14)
def hard_swish(x):
    return F.hardswish(x)


@op("Sigmoid", since=1)
def sigmoid(x, consumed_inputs=None):
    return torch.sigmoid(x)


@op("Softplus", since=1)
def softplus(x):
    # torch switches to the identity above x=20, where log1p(exp(-x)) < 3e-9 * x
    return F.softplus(x)


@op("Softsign", since=1)
def softsign(x):
    return F.softsign(x)


@op("Tanh", since=1)
def tanh(x, consumed_inputs=None):
    return torch.tanh(x)


@op("ThresholdedRelu", since=10)
def thresholded_relu(x, alpha=1.0):
    return F.threshold(x, alpha, 0.0)


@op("Mish", since=18)
def mish(x):
    return F.mish(x)


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
