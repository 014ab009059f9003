"""A weight is stored data: an initializer copying a torch parameter holds it exactly, or
rounded once to its lower precision (align/judge/exact_weight.py).  Trial 4, finding 08: a
1% change of one float16 LayerNorm weight (10 ulps) passed within float16's tolerance.

Models built here with random weights, exported with the real exporter, converted with
onnxconverter-common's ``convert_float_to_float16(keep_io_types=True)`` where float16,
run in onnxruntime; faults planted in the ONNX initializers.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper
from torch import nn

pytest.importorskip("onnxconverter_common")

from onnxconverter_common import float16  # noqa: E402

from onnx_sbs_nb import run_aligned, summarize  # noqa: E402

# the converter warns of the tiny values it lifts to 1e-7: planted here on purpose
pytestmark = pytest.mark.filterwarnings("ignore:the float32 number:UserWarning")
from onnx_sbs_nb.align.judge.exact_weight import ExactWeight, ulps_off  # noqa: E402
from onnx_sbs_nb.align.judge.rules import RULES, Tolerance  # noqa: E402
from onnx_sbs_nb.records import (  # noqa: E402
    EXACT_WEIGHT_NOTE,
    KIND_WEIGHT,
    STATUS_FAIL,
    STATUS_WEIGHT_DIFFERS,
)


class _Net(nn.Module):
    """A Conv and its BatchNorm (folded by the exporter), a LayerNorm, a Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.c, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.ln, self.fc = nn.LayerNorm(8), nn.Linear(8, 4)

    def forward(self, x):
        h = torch.relu(self.b(self.c(x))).mean((2, 3))
        return torch.softmax(self.fc(self.ln(h)), -1)


@pytest.fixture(scope="module")
def net():
    torch.manual_seed(0)
    m = _Net()
    m.b.running_mean.uniform_(-1, 1)
    m.b.running_var.uniform_(0.5, 2)
    with torch.no_grad():
        m.ln.weight.uniform_(0.5, 1.5)
        m.fc.weight[0, :3] = torch.tensor([3e-8, -2e-8, 1e-9])  # below float16's normals
    m = m.eval()
    x = torch.randn(2, 3, 16, 16)
    ep = torch.export.export(m, (x,))
    return ep, torch.onnx.export(ep, (x,), dynamo=True).model_proto, x


def _planted(model: onnx.ModelProto, name: str, index: int, factor: float) -> onnx.ModelProto:
    model = copy.deepcopy(model)
    init = next(i for i in model.graph.initializer if i.name == name)
    a = numpy_helper.to_array(init).copy()
    a.reshape(-1)[index] *= factor
    init.CopyFrom(numpy_helper.from_array(a, name))
    return model


def _half(model: onnx.ModelProto) -> onnx.ModelProto:
    return float16.convert_float_to_float16(copy.deepcopy(model), keep_io_types=True)


def _weights(records):
    return {r.onnx_name: r for r in records if r.kind == KIND_WEIGHT and r.onnx_name}


@pytest.mark.parametrize("own_error", [True, False])
def test_a_faithful_float16_conversion_passes_every_weight(net, own_error):
    ep, model, x = net
    records = list(run_aligned(ep, _half(model), (x,), own_error=own_error))
    s = summarize(records)
    assert s.verdict == "pass", s.to_text()
    weights = _weights(records)
    # fc.weight's tiny values, lifted to 1e-7 by the converter, are no fault
    assert weights["fc.weight"].status != STATUS_FAIL
    assert not any(EXACT_WEIGHT_NOTE in (r.comment or "") for r in records)
    # the BatchNorm folded into the Conv stays the exporter's fold
    assert weights["c.weight"].status == STATUS_WEIGHT_DIFFERS


@pytest.mark.parametrize("own_error", [True, False])
def test_a_float16_weight_changed_by_one_percent_fails(net, own_error):
    ep, model, x = net
    half = _half(_planted(model, "ln.weight", 2, 1.01))
    records = list(run_aligned(ep, half, (x,), own_error=own_error))
    s = summarize(records)
    assert s.verdict == "fail", s.to_text()
    assert "ln.weight" in s.culprit.label()
    w = _weights(records)["ln.weight"]
    assert w.status == STATUS_FAIL and EXACT_WEIGHT_NOTE in w.comment
    assert "rounded to float16" in w.comment and "at 1 of 8 elements" in w.comment
    # read by its consumer, whose tolerance hides the change: not "rows not read"
    assert "does not read what differs" not in w.comment
    assert "below its tolerance" in w.comment


def test_a_float32_weight_changed_within_the_tolerance_fails(net):
    ep, model, x = net
    # 1e-5 relative: well within float32's 1e-4 tolerance, some 80 ulps off
    records = list(run_aligned(ep, _planted(model, "fc.weight", 5, 1 + 1e-5), (x,)))
    s = summarize(records)
    assert s.verdict == "fail" and "fc.weight" in s.culprit.label(), s.to_text()
    w = _weights(records)["fc.weight"]
    assert "within 0)" in w.comment and "rounded to" not in w.comment


def test_a_faithful_float32_export_and_its_fold_pass(net):
    ep, model, x = net
    records = list(run_aligned(ep, model, (x,), own_error=True))
    text = summarize(records).to_text()
    # the structure shows the fold: not named on the summary's weights line
    assert text.startswith("verdict: PASS") and "weights:" not in text, text
    assert _weights(records)["c.bias"].status == STATUS_WEIGHT_DIFFERS


class _Bf16(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(16, 32), nn.LayerNorm(32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(self.ln(torch.relu(self.fc1(x))))


def test_a_bfloat16_model_fails_a_weight_changed_by_a_few_ulps():
    torch.manual_seed(0)
    m = _Bf16().eval().to(torch.bfloat16)
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    ep = torch.export.export(m, (x,))
    model = torch.onnx.export(ep, (x,), dynamo=True).model_proto
    assert summarize(list(run_aligned(ep, model, (x,), own_error=True))).verdict == "pass"
    # 3%: four bfloat16 ulps, within bfloat16's tolerance of computed values
    records = list(run_aligned(ep, _planted(model, "ln.weight", 3, 1.03), (x,), own_error=True))
    s = summarize(records)
    assert s.verdict == "fail" and "ln.weight" in s.culprit.label(), s.to_text()
    assert "4 ulps" in _weights(records)["ln.weight"].comment


def test_ulps_counted_in_each_float_type():
    one = torch.ones(4)
    assert ulps_off(one, one.clone(), 0) is None
    assert ulps_off(torch.tensor([0.0]), torch.tensor([-0.0]), 0) is None  # the same zero
    assert ulps_off(torch.tensor([float("nan")]), torch.tensor([float("nan")]), 0) is None
    next_up = torch.nextafter(one, torch.full((4,), 2.0))
    assert ulps_off(one, next_up, 1) is None
    assert ulps_off(one, next_up, 0) == (4, 1, 4, "float32")
    # a float32 rounded to bfloat16 by nearest-even, and by truncation: one ulp apart
    w = torch.tensor([1.00390625 + 2**-9], dtype=torch.float32)  # just above halfway
    nearest = w.to(torch.bfloat16)
    truncated = (w.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
    assert ulps_off(nearest, truncated, 1) is None
    assert ulps_off(nearest, truncated, 0) is not None
    # either side of zero: the ulps between them count across it
    tiny = torch.finfo(torch.float16).smallest_normal
    a, b = torch.tensor([tiny], dtype=torch.float16), torch.tensor([-tiny], dtype=torch.float16)
    assert ulps_off(a, b, 0)[1] == 2 * 1024
    # values below the smallest normal: a converter's own rounding, left out
    sub = torch.tensor([6e-8, 1.2e-7], dtype=torch.float16)
    assert ulps_off(sub, sub.flip(0), 0) is None
    half = np.array([1.0, 2.0], np.float16)
    assert ulps_off(half, np.nextafter(half, np.float16(3)), 0)[0] == 2


def test_the_rule_comes_before_the_tolerance():
    names = [type(r) for r in RULES]
    assert names.index(ExactWeight) == names.index(Tolerance) - 1
