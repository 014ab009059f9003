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


BUILDERS = {
    "gru": _gru,
    "pixel_unshuffle": _pixel_unshuffle,
    "upsample_bilinear_size1": _global_bilinear,
    "masked_scatter": _masked_scatter,
    "bicubic_antialias": _bicubic_aa,
}


def build(name: str) -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model, args = BUILDERS[name]()
    return model.eval(), args
