"""Ill-conditioned float32 rounding is no fault (trial 3, finding 05): LayerNorm of values
with a large offset, exported faithfully, was "it makes the error" though the ONNX side was
closer to the float64 truth than torch; faults are still named on the same inputs."""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
from torch import nn

from onnx_sbs_nb import run_aligned, summarize
from onnx_sbs_nb.align.judge.conditioning import ILL_CONDITIONED_NOTE
from onnx_sbs_nb.records import STATUS_PRECISION_LOSS


class _NormHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(256)
        self.fc = nn.Linear(256, 8)

    def forward(self, x):
        return self.fc(self.ln(x))


@pytest.fixture(scope="module")
def offset_norm():
    torch.manual_seed(0)
    m = _NormHead().eval()
    x = torch.randn(2, 512, 256) * 0.01 + 3000.0  # raw readings: a large offset
    ep = torch.export.export(m, (x,))
    return ep, torch.onnx.export(ep, (x,), dynamo=True).model_proto, x


def _with_epsilon(model: onnx.ModelProto, eps: float) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    for node in model.graph.node:
        if node.op_type == "LayerNormalization":
            for a in node.attribute:
                if a.name == "epsilon":
                    a.f = eps
    return model


def test_faithful_export_on_ill_conditioned_inputs_passes(offset_norm):
    ep, model, x = offset_norm
    records = list(run_aligned(ep, model, (x,), own_error=True))
    s = summarize(records)
    assert s.verdict == "pass", s.to_text()
    assert s.culprit is None
    norm = next(r for r in records if r.onnx_op_type == "LayerNormalization")
    assert norm.status == STATUS_PRECISION_LOSS and ILL_CONDITIONED_NOTE in norm.comment
    assert "ill-conditioned on these inputs" in s.to_text()


def test_a_fault_beyond_the_rounding_is_still_named(offset_norm):
    ep, model, x = offset_norm
    s = summarize(list(run_aligned(ep, _with_epsilon(model, 1e-2), (x,), own_error=True)))
    assert s.verdict == "fail", s.to_text()
    assert s.culprit is not None and "layer_norm" in s.culprit.label()


def test_well_conditioned_inputs_keep_a_small_fault(offset_norm):
    ep, model, _ = offset_norm
    x = torch.randn(2, 512, 256)
    s = summarize(list(run_aligned(ep, _with_epsilon(model, 1e-3), (x,), own_error=True)))
    assert s.verdict == "fail" and "layer_norm" in s.culprit.label(), s.to_text()
    assert "ill-conditioned" not in s.to_text()


def test_a_fault_within_the_rounding_band_is_told_apart_by_torch_in_float64():
    """LayerNorm epsilon 1e-5 -> 0.05 on readings around 3e4: the change (5.7e-4) is within
    a few float32 rounding bands, but torch's own op in float64 disagrees with the node's
    float64 result: a fault, named (trial 4, finding 02)."""
    torch.manual_seed(0)

    class Norm64(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln, self.fc = nn.LayerNorm(64), nn.Linear(64, 64)

        def forward(self, x):
            return self.fc(self.ln(x))

    x = torch.randn(2, 8, 64) * 3 + 3e4
    x[..., ::7] *= 1.001
    ep = torch.export.export(Norm64().eval(), (x,))
    model = torch.onnx.export(ep, (x,), dynamo=True).model_proto
    assert summarize(list(run_aligned(ep, model, (x,), own_error=True))).verdict == "pass"
    s = summarize(list(run_aligned(ep, _with_epsilon(model, 0.05), (x,), own_error=True)))
    assert s.verdict == "fail" and "layer_norm" in s.culprit.label(), s.to_text()
