"""Optimizer update rules (ai.onnx.preview.training): Adagrad, Adam, Momentum."""

from __future__ import annotations

import math

import torch

from ..registry import op

_DOMAIN = "ai.onnx.preview.training"


def _groups(data: tuple, per: int) -> tuple[torch.Tensor, torch.Tensor, list[list]]:
    """(R, T, [[X_i, G_i, ...] for each tensor]) from R, T, X..., G..., V..., H..."""
    r, t, rest = data[0], data[1], data[2:]
    n = len(rest) // per
    return r, t, [[rest[k * n + i] for k in range(per)] for i in range(n)]


@op("Adagrad", since=1, domain=_DOMAIN, host_inputs=(0, 1))
def adagrad(*data, decay_factor=0.0, epsilon=0.0, norm_coefficient=0.0):
    r, t, groups = _groups(data, 3)
    lr = r / (1 + t * decay_factor)
    xs, hs = [], []
    for x, g, h in groups:
        g = norm_coefficient * x + g
        h_new = h + g * g
        xs.append((x - lr * g / (torch.sqrt(h_new) + epsilon)).to(x.dtype))
        hs.append(h_new.to(h.dtype))
    return (*xs, *hs)


@op("Adam", since=1, domain=_DOMAIN, host_inputs=(0, 1))
def adam(
    *data, alpha=0.9, beta=0.999, epsilon=0.0, norm_coefficient=0.0, norm_coefficient_post=0.0
):
    r, t, groups = _groups(data, 4)
    step = int(t.item())
    lr = r * math.sqrt(1 - beta**step) / (1 - alpha**step) if step > 0 else r
    xs, vs, hs = [], [], []
    for x, g, v, h in groups:
        g = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g
        h_new = beta * h + (1 - beta) * (g * g)
        x_new = x - lr * (v_new / (torch.sqrt(h_new) + epsilon))
        xs.append(((1 - norm_coefficient_post) * x_new).to(x.dtype))
        vs.append(v_new.to(v.dtype))
        hs.append(h_new.to(h.dtype))
    return (*xs, *vs, *hs)


@op("Momentum", since=1, domain=_DOMAIN, host_inputs=(0, 1))
def momentum(*data, alpha=0.0, beta=0.0, mode="standard", norm_coefficient=0.0):
    r, t, groups = _groups(data, 3)
    beta_t = beta if int(t.item()) > 0 else 1.0
    xs, vs = [], []
    for x, g, v in groups:
        g = norm_coefficient * x + g
        v_new = alpha * v + beta_t * g
        if mode == "nesterov":
            x_new = x - r * (g + alpha * v_new)
        else:
            x_new = x - r * v_new
        xs.append(x_new.to(x.dtype))
        vs.append(v_new.to(v.dtype))
    return (*xs, *vs)
