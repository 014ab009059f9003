"""Recurrent layers: RNN, LSTM, GRU (every direction, layout, sequence_lens, clip,
activation list with alpha/beta; peepholes and input_forget for LSTM,
linear_before_reset for GRU)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._nn_common import register_versions

Act = Callable[[torch.Tensor], torch.Tensor]

# name -> (uses alpha, uses beta, default alpha, default beta)
_ACT_PARAMS = {
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
}


def _activation(name: str, alpha: float, beta: float) -> Act:
    n = name.lower()
    if n == "sigmoid":
        return torch.sigmoid
    if n == "tanh":
        return torch.tanh
    if n == "relu":
        return torch.relu
    if n == "affine":
        return lambda x: alpha * x + beta
    if n == "leakyrelu":
        return lambda x: F.leaky_relu(x, alpha)
    if n == "thresholdedrelu":
        return lambda x: torch.where(x > alpha, x, torch.zeros_like(x))
    if n == "scaledtanh":
        return lambda x: alpha * torch.tanh(beta * x)
    if n == "hardsigmoid":
        return lambda x: torch.clamp(alpha * x + beta, 0, 1)
    if n == "elu":
        return lambda x: torch.where(x > 0, x, alpha * torch.expm1(x))
    if n == "softsign":
        return lambda x: x / (1 + x.abs())
    if n == "softplus":
        return lambda x: torch.logaddexp(x, torch.zeros_like(x))
    raise ValueError(f"unknown recurrent activation {name!r}")


def _activations(names, alphas, betas, defaults: list[str], num_dir: int) -> list[list[Act]]:
    """One list of activation functions per direction."""
    names = list(names) if names else defaults * num_dir
    if len(names) == len(defaults) and num_dir == 2:
        names = names * 2
    alphas = list(alphas or [])
    betas = list(betas or [])
    fns: list[Act] = []
    for name in names:
        ua, ub, da, db = _ACT_PARAMS.get(name.lower(), (False, False, 0.0, 0.0))
        a = alphas.pop(0) if ua and alphas else da
        b = betas.pop(0) if ub and betas else db
        fns.append(_activation(name, a, b))
    k = len(defaults)
    return [fns[d * k : (d + 1) * k] for d in range(num_dir)]


def _directions(direction: str) -> list[bool]:
    """Reverse flag of each direction."""
    if direction == "forward":
        return [False]
    if direction == "reverse":
        return [True]
    if direction == "bidirectional":
        return [False, True]
    raise ValueError(f"unknown direction {direction!r}")


def _to_layout0(x, states0, layout):
    """Layout 1 (batch first) moved to layout 0 (sequence first)."""
    if layout == 1:
        x = x.transpose(0, 1)
        states0 = [s.transpose(0, 1) if s is not None else None for s in states0]
    return x, states0


def _from_layout0(y, final, layout):
    """Y (seq, num_dir, batch, hidden) and the final states back in the node's layout."""
    if layout == 1:
        y = y.permute(2, 0, 1, 3)
        final = [f.transpose(0, 1) for f in final]
    return (y, *final)


def _run(x, seq_lens, layout, direction, states0, step, hidden_size):
    """Shared driver: ``step(d, t, states) -> (h, *other states)`` for direction d.

    Returns Y (seq, num_dir, batch, hidden) and the final states, in the node's layout;
    positions past a sequence's length output zeros and keep the state.
    """
    x, states0 = _to_layout0(x, states0, layout)
    T, B = x.shape[0], x.shape[1]
    H = hidden_size
    masks = None
    if seq_lens is not None:
        lens = seq_lens.to(x.device, torch.int64)
        masks = (torch.arange(T, device=x.device).unsqueeze(1) < lens.unsqueeze(0)).unsqueeze(-1)
    ys, finals = [], []
    for d, rev in enumerate(_directions(direction)):
        states = [
            (s[d] if s is not None else torch.zeros((B, H), dtype=x.dtype, device=x.device))
            for s in states0
        ]
        out: list[torch.Tensor | None] = [None] * T
        for t in reversed(range(T)) if rev else range(T):
            new = step(d, t, states)
            if masks is not None:
                m = masks[t]
                out[t] = torch.where(m, new[0], torch.zeros_like(new[0]))
                states = [torch.where(m, n, s) for n, s in zip(new, states)]
            else:
                out[t] = new[0]
                states = list(new)
        ys.append(torch.stack(out, 0) if T else x.new_zeros((0, B, H)))
        finals.append(states)
    final = [torch.stack([f[k] for f in finals], 0) for k in range(len(states0))]
    return _from_layout0(torch.stack(ys, 1), final, layout)


def _gates_input(x, w, b_w, layout):
    """X @ W^T + Wb for every time step at once: (T, B, G*H)."""
    if layout == 1:
        x = x.transpose(0, 1)
    g = torch.matmul(x, w.t())
    return g + b_w if b_w is not None else g


def _clip(v, clip):
    return v if clip is None else v.clamp(-clip, clip)


# gate order of torch's fused kernels, as indices into the ONNX order
_TORCH_GATES = {"RNN": [0], "LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2]}
_DEFAULT_ACTS = {"RNN": ["Tanh"], "LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"]}


def _is_default(activations, kind: str, num_dir: int) -> bool:
    if not activations:
        return True
    names = [a.lower() for a in activations]
    d = [a.lower() for a in _DEFAULT_ACTS[kind]]
    return names in (d, d * num_dir)


def _fused(kind, x, w, r, b, states0, direction, layout, H, relu=False):
    """torch's fused RNN kernels (cuDNN on GPU) for the configurations they implement
    exactly: default activations, no clip, no sequence_lens, no peepholes."""
    nd = w.shape[0]
    x, states0 = _to_layout0(x, states0, layout)
    T, B = x.shape[0], x.shape[1]
    order = _TORCH_GATES[kind]
    G = len(order)

    def reorder(t):
        parts = t.split(H, 0)
        return torch.cat([parts[i] for i in order], 0) if G > 1 else t

    params = []
    for d in range(nd):
        bw = b[d, : G * H] if b is not None else torch.zeros(G * H, dtype=x.dtype, device=x.device)
        br = b[d, G * H :] if b is not None else torch.zeros(G * H, dtype=x.dtype, device=x.device)
        params += [reorder(w[d]), reorder(r[d]), reorder(bw), reorder(br)]
    states = [
        s if s is not None else torch.zeros((nd, B, H), dtype=x.dtype, device=x.device)
        for s in states0
    ]
    xin = x.flip(0) if direction == "reverse" else x
    args = (params, True, 1, 0.0, False, nd == 2, False)
    if kind == "LSTM":
        y, *final = torch.lstm(xin, tuple(states), *args)
    elif kind == "GRU":
        y, *final = torch.gru(xin, states[0], *args)
    else:
        fn = torch.rnn_relu if relu else torch.rnn_tanh
        y, *final = fn(xin, states[0], *args)
    if direction == "reverse":
        y = y.flip(0)
    return _from_layout0(y.reshape(T, B, nd, H).transpose(1, 2), final, layout)


def _input_gates(kind, x, w, b, H, layout, sum_bias=True):
    """X @ W^T + bias per direction; ``sum_bias``: Wb + Rb folded in (RNN, LSTM),
    otherwise Wb only (GRU applies Rb inside the reset gate)."""
    nd = w.shape[0]
    GH = len(_TORCH_GATES[kind]) * H
    if b is None:
        bw = [None] * nd
    else:
        bw = b[:, :GH] + b[:, GH:] if sum_bias else b[:, :GH]
    return [_gates_input(x, w[d], bw[d], layout) for d in range(nd)]


@dataclass(frozen=True)
class _Attrs:
    """The attributes of RNN, LSTM and GRU (defaults of the spec)."""

    activation_alpha: list[float] | None = None
    activation_beta: list[float] | None = None
    activations: list[str] | None = None
    clip: float | None = None
    direction: str = "forward"
    hidden_size: int | None = None
    layout: int = 0
    input_forget: int = 0  # LSTM
    linear_before_reset: int = 0  # GRU

    def acts(self, kind: str, num_dir: int) -> list[list[Act]]:
        return _activations(
            self.activations,
            self.activation_alpha,
            self.activation_beta,
            _DEFAULT_ACTS[kind],
            num_dir,
        )


def _rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, **attrs):
    a = _Attrs(**attrs)
    nd, clip = w.shape[0], a.clip
    H = a.hidden_size or r.shape[-1]
    if clip is None and sequence_lens is None:
        names = [n.lower() for n in a.activations or []]
        if _is_default(a.activations, "RNN", nd) or names in (["relu"], ["relu"] * nd):
            relu = bool(names) and names[0] == "relu"
            return _fused("RNN", x, w, r, b, [initial_h], a.direction, a.layout, H, relu)
    acts = a.acts("RNN", nd)
    xw = _input_gates("RNN", x, w, b, H, a.layout)
    rt = [r[d].t() for d in range(nd)]

    def step(d, t, states):
        return (acts[d][0](_clip(xw[d][t] + states[0] @ rt[d], clip)),)

    return _run(x, sequence_lens, a.layout, a.direction, [initial_h], step, H)


def _lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, **attrs):
    a = _Attrs(**attrs)
    nd, clip, input_forget = w.shape[0], a.clip, a.input_forget
    H = a.hidden_size or r.shape[-1]
    states0 = [initial_h, initial_c]
    if (
        clip is None
        and sequence_lens is None
        and p is None
        and not input_forget
        and _is_default(a.activations, "LSTM", nd)
    ):
        return _fused("LSTM", x, w, r, b, states0, a.direction, a.layout, H)
    acts = a.acts("LSTM", nd)
    xw = _input_gates("LSTM", x, w, b, H, a.layout)
    rt = [r[d].t() for d in range(nd)]

    def step(d, t, states):
        h, c = states
        f_, g_, h_ = acts[d]
        gi, go, gf, gc = (xw[d][t] + h @ rt[d]).split(H, -1)
        if p is not None:
            pi, po, pf = p[d].split(H)
            gi = gi + pi * c
            gf = gf + pf * c
        i = f_(_clip(gi, clip))
        f = 1 - i if input_forget else f_(_clip(gf, clip))
        c_new = f * c + i * g_(_clip(gc, clip))
        if p is not None:
            go = go + po * c_new
        o = f_(_clip(go, clip))
        return o * h_(c_new), c_new

    return _run(x, sequence_lens, a.layout, a.direction, states0, step, H)


def _gru(x, w, r, b=None, sequence_lens=None, initial_h=None, **attrs):
    a = _Attrs(**attrs)
    nd, clip, linear_before_reset = w.shape[0], a.clip, a.linear_before_reset
    H = a.hidden_size or r.shape[-1]
    if (
        linear_before_reset
        and clip is None
        and sequence_lens is None
        and _is_default(a.activations, "GRU", nd)
    ):
        return _fused("GRU", x, w, r, b, [initial_h], a.direction, a.layout, H)
    acts = a.acts("GRU", nd)
    xw = _input_gates("GRU", x, w, b, H, a.layout, sum_bias=False)
    rb = b[:, 3 * H :] if b is not None else None
    rzr = [r[d][: 2 * H].t() for d in range(nd)]
    rh = [r[d][2 * H :].t() for d in range(nd)]

    def step(d, t, states):
        (h,) = states
        f_, g_ = acts[d]
        xz, xr, xh = xw[d][t].split(H, -1)
        hzr = h @ rzr[d]
        if rb is not None:
            hzr = hzr + rb[d][: 2 * H]
        hz, hr = hzr.split(H, -1)
        z = f_(_clip(xz + hz, clip))
        rr = f_(_clip(xr + hr, clip))
        rbh = rb[d][2 * H :] if rb is not None else 0
        if linear_before_reset:
            ht = g_(_clip(xh + rr * (h @ rh[d] + rbh), clip))
        else:
            ht = g_(_clip(xh + (rr * h) @ rh[d] + rbh, clip))
        return ((1 - z) * ht + z * h,)

    return _run(x, sequence_lens, a.layout, a.direction, [initial_h], step, H)


# Every version computes the same; they differ in the attributes they accept:
# output_sequence (opset 1 only) has no effect on the outputs, layout came with opset 14.
_COMMON_ATTRS = (
    "activation_alpha",
    "activation_beta",
    "activations",
    "clip",
    "direction",
    "hidden_size",
)
for _kind, _impl, _extra in (
    ("RNN", _rnn, ()),
    ("LSTM", _lstm, ("input_forget",)),
    ("GRU", _gru, ("linear_before_reset",)),
):
    _attrs = _COMMON_ATTRS + _extra
    register_versions(
        _kind,
        _impl,
        {1: (*_attrs, "output_sequence"), 7: _attrs, 14: (*_attrs, "layout")},
        ignored=("output_sequence",),
    )
