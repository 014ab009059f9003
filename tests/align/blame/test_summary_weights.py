"""The summary's ``weights:`` line names every weight that differs from its torch parameter
while its consumer agrees, unless the graph's structure shows the fold (a BatchNorm into
its Conv): trial 4, finding 05a: a weight scaled by 4 under a Gemm's alpha of 0.25 was
named in its record only, and the summary's last line said "max err_abs: 0"."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from onnx_sbs_nb import run_aligned, summarize
from onnx_sbs_nb.records import STATUS_WEIGHT_DIFFERS


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    m = _Mlp().eval()
    x = torch.randn(4, 16)
    ep = torch.export.export(m, (x,))
    return ep, torch.onnx.export(ep, (x,), dynamo=True).model_proto, x


def _alpha_fold(model: onnx.ModelProto) -> onnx.ModelProto:
    """fc1's weight times 4 and its Gemm's alpha 0.25: the same function."""
    model = copy.deepcopy(model)
    init = next(i for i in model.graph.initializer if i.name == "fc1.weight")
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * np.float32(4), init.name))
    gemm = next(n for n in model.graph.node if "fc1.weight" in n.input)
    assert gemm.op_type == "Gemm"
    alpha = [a for a in gemm.attribute if a.name == "alpha"]
    if alpha:
        alpha[0].f = 0.25
    else:
        gemm.attribute.append(onnx.helper.make_attribute("alpha", 0.25))
    return model


def test_a_weight_its_consumer_makes_up_for_is_named(mlp):
    ep, model, x = mlp
    records = list(run_aligned(ep, _alpha_fold(model), (x,), own_error=True))
    w = next(r for r in records if r.onnx_name == "fc1.weight")
    assert w.status == STATUS_WEIGHT_DIFFERS
    s = summarize(records)
    text = s.to_text()
    assert s.verdict == "pass", text
    line = next(t for t in text.splitlines() if t.startswith("weights:"))
    assert "fc1.weight (0.75)" in line and "makes up for it" in line
    assert "own_error=True tells which" not in line


def test_without_own_errors_it_is_named_as_unexplained(mlp):
    ep, model, x = mlp
    text = summarize(list(run_aligned(ep, _alpha_fold(model), (x,)))).to_text()
    assert "weights: fc1.weight (0.75)" in text and "own_error=True tells which" in text
