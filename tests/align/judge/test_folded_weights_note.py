"""A consumer computing fx nodes whose weights the exporter folded into its own (a Conv
and its BatchNorm) names every weight it reads when it disagrees: the folded bias the
exporter made too, paired with no torch parameter (trial 4, finding 09: a fault planted in
``c2.weight_bias`` was found at its Conv, whose note named only ``c2.weight``)."""

from __future__ import annotations

import copy

import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from onnx_sbs_nb import run_aligned, summarize


class _ConvBn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.c2, self.b2 = nn.Conv2d(8, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        x = torch.relu(self.b1(self.c1(x)))
        x = torch.relu(self.b2(self.c2(x)))
        return self.fc(x.mean((2, 3)))


@pytest.fixture(scope="module")
def conv_bn():
    torch.manual_seed(0)
    m = _ConvBn()
    for b in (m.b1, m.b2):
        b.running_mean.uniform_(-1, 1)
        b.running_var.uniform_(0.5, 2)
        b.weight.data.uniform_(0.5, 2)
        b.bias.data.uniform_(-1, 1)
    m = m.eval()
    x = torch.randn(2, 3, 16, 16)
    ep = torch.export.export(m, (x,))
    return ep, torch.onnx.export(ep, (x,), dynamo=True).model_proto, x


def _planted(model: onnx.ModelProto, name: str) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    init = next(i for i in model.graph.initializer if i.name == name)
    a = numpy_helper.to_array(init).copy()
    a.reshape(-1)[4] += 0.2
    init.CopyFrom(numpy_helper.from_array(a, name))
    return model


def _bias_of(model: onnx.ModelProto, weight: str) -> str:
    """The bias input of the Conv reading ``weight`` (the exporter names it)."""
    conv = next(n for n in model.graph.node if n.op_type == "Conv" and weight in n.input)
    return conv.input[2]


@pytest.mark.parametrize("conv", ["c1", "c2"])
def test_the_note_names_the_folded_bias_that_holds_the_fault(conv_bn, conv):
    ep, model, x = conv_bn
    bias = _bias_of(model, f"{conv}.weight")
    s = summarize(list(run_aligned(ep, _planted(model, bias), (x,), own_error=True)))
    assert s.verdict == "fail", s.to_text()
    assert "computes at once the fx nodes" in s.culprit.why
    assert f"({conv}.weight, {bias})" in s.culprit.why, s.culprit.why
