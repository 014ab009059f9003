"""Tiny models exercising ops whose exporter lowering had a real numerical bug.

torch only (no onnx_sbs_nb, no onnx): this module is imported by export_bug.py, which
runs in the old-exporter venvs of scripts/exporter_bug_venvs.sh.  Each builder returns
(model, args) with seeded random weights and inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GRUTagger(nn.Module):
    """nn.GRU between two linears: aten.gru lowered to ONNX GRU."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.out = nn.Linear(8, 3)

    def forward(self, x):
        y, _ = self.gru(torch.tanh(self.inp(x)))
        return self.out(y)


class PixelUnshuffleNet(nn.Module):
    """Conv, PixelUnshuffle (space to depth, CRD order), 1x1 conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)
        self.unshuffle = nn.PixelUnshuffle(2)
        self.mix = nn.Conv2d(12, 4, 1)

    def forward(self, x):
        return self.mix(self.unshuffle(torch.relu(self.conv(x))))


class GlobalBilinear(nn.Module):
    """interpolate(size=(1, 1), bilinear, align_corners=False) as a global pooling."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        y = torch.relu(self.conv(x))
        y = F.interpolate(y, size=(1, 1), mode="bilinear", align_corners=False)
        return self.fc(y.flatten(1))


class MaskedScatterFeatures(nn.Module):
    """Inject features at masked token positions (mask broadcast over the hidden dim)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Linear(4, 6)
        self.proj = nn.Linear(6, 6)

    def forward(self, x, mask, feats):
        h = self.emb(x)
        h = h.masked_scatter(mask.unsqueeze(-1), feats)
        return self.proj(torch.tanh(h))


class BicubicAntialias(nn.Module):
    """Downsampling with interpolate(bicubic, antialias=True) between convolutions."""

    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 4, 3, padding=1)
        self.c2 = nn.Conv2d(4, 2, 1)

    def forward(self, x):
        y = torch.tanh(self.c1(x))
        y = F.interpolate(y, size=(5, 5), mode="bicubic", align_corners=False, antialias=True)
        return self.c2(y)


class PaddedAttention(nn.Module):
    """SDPA with a boolean key-padding mask in which one query row attends to nothing
    (a fully padded sequence in the batch): torch returns 0 for that row."""

    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(8, 24)
        self.out = nn.Linear(8, 4)

    def forward(self, x, keep):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, 2, 4).permute(2, 0, 3, 1, 4)
        mask = keep[:, None, None, :] & keep[:, None, :, None]  # (b, 1, s, s)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, s, 8))


class AddmmBatchNorm(nn.Module):
    """``torch.addmm`` with beta != 1 (ONNX Gemm with beta) then BatchNorm1d: the
    optimizer fuses the BatchNorm into the Gemm."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(6, 5) * 0.5)
        self.b = nn.Parameter(torch.randn(5))
        self.bn = nn.BatchNorm1d(5)
        self.out = nn.Linear(5, 3)
        self.bn.running_mean.uniform_(-0.5, 0.5)
        self.bn.running_var.uniform_(0.5, 2.0)
        self.bn.weight.data.uniform_(0.5, 1.5)

    def forward(self, x):
        h = torch.addmm(self.b, torch.tanh(x), self.w, beta=0.5)
        return self.out(torch.relu(self.bn(h)))


class VectorLinear(nn.Module):
    """``F.linear`` with a 1-D weight (a learned projection onto a direction), no bias:
    the result drops the last dimension."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(4, 6)
        self.direction = nn.Parameter(torch.randn(6))

    def forward(self, x):
        score = F.linear(torch.tanh(self.inp(x)), self.direction)  # (b, s)
        return torch.softmax(score, dim=-1)


class SmoothedLoss(nn.Module):
    """A classifier returning its logits and its training loss with label smoothing
    (``F.cross_entropy(..., label_smoothing=)``); ``smoothing=0`` is the control."""

    def __init__(self, smoothing: float):
        super().__init__()
        self.head = nn.Linear(6, 5)
        self.smoothing = smoothing

    def forward(self, x, target):
        logits = self.head(torch.tanh(x))
        return logits, F.cross_entropy(logits, target, label_smoothing=self.smoothing)


class PooledFeatures(nn.Module):
    """A conv net whose average pooling divides each window's sum by a fixed number
    (``nn.AvgPool2d(divisor_override=)``); ``divisor=None`` is the control."""

    def __init__(self, divisor: int | None):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.pool = nn.AvgPool2d(2, divisor_override=divisor)
        self.head = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x):
        return self.head(self.pool(torch.relu(self.conv(x))).flatten(1))


class SegmentPooling(nn.Module):
    """Graph-style pooling: each node's features reduced into its segment's row with
    ``scatter_reduce`` (several nodes per segment); ``reduce="amax"`` is the control."""

    def __init__(self, reduce: str):
        super().__init__()
        self.embed = nn.Linear(3, 4)
        self.reduce = reduce

    def forward(self, x, segment):
        h = torch.tanh(self.embed(x))  # (nodes, 4)
        index = segment.unsqueeze(1).expand_as(h)
        out = torch.zeros(3, 4).scatter_reduce(0, index, h, self.reduce, include_self=False)
        return out


class ValidFraction(nn.Module):
    """The share of valid tokens per row of an int64 attention mask, as a float
    (``mask.mean(dim, dtype=torch.float32)``), scaling pooled features;
    ``cast_first`` (``mask.float().mean(dim)``) is the control."""

    def __init__(self, cast_first: bool):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.cast_first = cast_first

    def forward(self, x, mask):
        if self.cast_first:
            share = mask.float().mean(dim=1)
        else:
            share = mask.mean(dim=1, dtype=torch.float32)
        return self.proj(x).sum(1) * share.unsqueeze(1)


class PairwiseRanker(nn.Module):
    """A reward model's pairwise loss: ``-logsigmoid(beta * (chosen - rejected))`` per
    pair, as in DPO or RankNet; ``softplus=True`` writes the same loss as
    ``softplus(-margin)`` (the control)."""

    def __init__(self, softplus: bool):
        super().__init__()
        self.score = nn.Linear(6, 1)
        self.beta = 10.0
        self.softplus = softplus

    def forward(self, chosen, rejected):
        margin = self.beta * (self.score(chosen) - self.score(rejected)).squeeze(-1)
        if self.softplus:
            return F.softplus(-margin)
        return -F.logsigmoid(margin)


class ProbitLikelihood(nn.Module):
    """A probit model's log-likelihood ``log_ndtr(z)`` of a scaled score: torch computes
    the lower tail (z < -1) through ``erfcx``; the control feeds scores above -1 only,
    where the other branch is taken and ``erfcx``'s argument stays small."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(1.25))

    def forward(self, z):
        return torch.special.log_ndtr(self.scale * z)


def _padded_attention():
    keep = torch.tensor([[True, True, True, True, False], [False] * 5])
    return PaddedAttention(), (torch.randn(2, 5, 8), keep)


def _addmm_bn():
    return AddmmBatchNorm(), (torch.randn(4, 6),)


def _vector_linear():
    return VectorLinear(), (torch.randn(2, 5, 4),)


def _gru():
    return GRUTagger(), (torch.randn(2, 5, 6),)


def _pixel_unshuffle():
    return PixelUnshuffleNet(), (torch.randn(1, 2, 6, 6),)


def _global_bilinear():
    return GlobalBilinear(), (torch.randn(2, 3, 6, 6),)


def _masked_scatter():
    mask = torch.tensor([[True, False, True, True, False]])
    return MaskedScatterFeatures(), (torch.randn(1, 5, 4), mask, torch.randn(1, 3, 6) * 3)


def _bicubic_aa():
    return BicubicAntialias(), (torch.randn(1, 3, 16, 16),)


def _smoothed_loss(smoothing: float):
    return SmoothedLoss(smoothing), (torch.randn(4, 6), torch.tensor([1, 0, 4, 2]))


def _pooled(divisor: int | None):
    return PooledFeatures(divisor), (torch.randn(2, 2, 6, 6),)


def _segments(reduce: str):
    return SegmentPooling(reduce), (torch.randn(7, 3), torch.tensor([0, 1, 0, 2, 1, 0, 2]))


def _ranker(softplus: bool):
    # margins from -40 to +40: a pair ranked wrong by a clear margin is where it matters
    return PairwiseRanker(softplus), (torch.randn(8, 6) * 3, torch.randn(8, 6) * 3)


def _probit(tail: bool):
    low = -7.0 if tail else -0.75
    return ProbitLikelihood(), (torch.linspace(low, 2.0, 12),)


def _valid_fraction(cast_first: bool):
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    return ValidFraction(cast_first), (torch.randn(3, 5, 4), mask)


BUILDERS = {
    "gru": _gru,
    "pixel_unshuffle": _pixel_unshuffle,
    "upsample_bilinear_size1": _global_bilinear,
    "masked_scatter": _masked_scatter,
    "bicubic_antialias": _bicubic_aa,
    "sdpa_fully_masked_row": _padded_attention,
    "gemm_beta_bn": _addmm_bn,
    "linear_1d_weight": _vector_linear,
    "cross_entropy_label_smoothing": lambda: _smoothed_loss(0.1),
    "cross_entropy_no_smoothing": lambda: _smoothed_loss(0.0),
    "avg_pool_divisor_override": lambda: _pooled(3),
    "avg_pool_default_divisor": lambda: _pooled(None),
    "scatter_reduce_mean": lambda: _segments("mean"),
    "scatter_reduce_amax": lambda: _segments("amax"),
    "mean_dim_int_dtype": lambda: _valid_fraction(False),
    "mean_dim_cast_first": lambda: _valid_fraction(True),
    "log_sigmoid_large_negative": lambda: _ranker(False),
    "softplus_same_loss": lambda: _ranker(True),
    "erfcx_lower_tail": lambda: _probit(True),
    "erfcx_small_arguments": lambda: _probit(False),
}


def build(name: str) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model, args = BUILDERS[name]()
    return model.eval(), args
