"""A weight that differs from its torch parameter while its consumer agrees: a fold the
consumer makes up for, or rows these inputs do not read (trial 3, finding 01: noise planted
in a position table's rows 12-63, read by a 6-token input at rows 0-5, was a plain PASS
with "the exporter changed it")."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from onnx import numpy_helper
from torch import nn

from onnx_sbs_nb import run_aligned, summarize
from onnx_sbs_nb.align.engine.weight_blame import describe_rows


class _Positions(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(50, 16), nn.Embedding(64, 16)
        self.head = nn.Linear(16, 50)

    def forward(self, ids):
        pos = torch.arange(ids.shape[1]).unsqueeze(0)
        return self.head(torch.relu(self.wte(ids) + self.wpe(pos)))


@pytest.fixture(scope="module")
def unread_rows():
    torch.manual_seed(0)
    m = _Positions().eval()
    ids = torch.randint(0, 50, (1, 6))
    dyn = ({1: torch.export.Dim("seq", min=2, max=64)},)
    ep = torch.export.export(m, (ids,), dynamic_shapes=dyn)
    model = copy.deepcopy(
        torch.onnx.export(ep, (ids,), dynamic_shapes=dyn, dynamo=True).model_proto
    )
    for init in model.graph.initializer:
        if "wpe" in init.name:
            a = numpy_helper.to_array(init).copy()
            a[12:] += np.random.RandomState(0).randn(*a[12:].shape).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(a, init.name))
    return ep, model, ids


def test_rows_not_read_fail_with_own_errors(unread_rows):
    ep, model, ids = unread_rows
    s = summarize(list(run_aligned(ep, model, (ids,), own_error=True)))
    assert s.verdict == "fail", s.to_text()
    assert "wpe" in s.culprit.label()
    assert "rows 12-63 of 64" in s.culprit.why
    assert "does not read what differs" in s.culprit.why
    assert "exporter changed it" not in s.to_text()


def test_without_own_errors_the_pass_names_the_weight(unread_rows):
    ep, model, ids = unread_rows
    s = summarize(list(run_aligned(ep, model, (ids,))))
    text = s.to_text()
    assert "weights: wpe.weight" in text, text
    assert "own_error=True tells which" in text
    assert "exporter changed it" not in text


def test_a_faithful_export_says_nothing_of_weights(unread_rows):
    ep, _, ids = unread_rows
    model = torch.onnx.export(
        ep, (ids,), dynamic_shapes=({1: torch.export.Dim("seq", min=2, max=64)},), dynamo=True
    ).model_proto
    s = summarize(list(run_aligned(ep, model, (ids,), own_error=True)))
    assert s.verdict == "pass" and "weights:" not in s.to_text()


def test_rows_in_words():
    assert describe_rows(np.array([12, 13, 14]), 64) == " in rows 12-14 of 64"
    assert describe_rows(np.array([3]), 64) == " in row 3 of 64"
    assert describe_rows(np.array([1, 5, 6, 9]), 10) == " in rows 1, 5-6, 9 of 10"
    assert describe_rows(np.array([1, 3, 5, 7]), 10) == " in 4 of 10 rows"
    assert describe_rows(np.arange(4), 4) is None


def test_over_many_inputs_the_culprit_shows_an_input_that_reads_the_rows(unread_rows):
    """Inputs 0 and 1 read rows 0-5, input 2 rows 0-19: the culprit's why is input 2's,
    where the consumer meets the difference (trial 4, finding 07)."""
    ep, model, ids = unread_rows
    inputs = [(ids,), (torch.randint(0, 50, (1, 6)),), (torch.randint(0, 50, (1, 20)),)]
    s = summarize(list(run_aligned(ep, model, inputs=inputs, own_error=True)))
    assert s.verdict == "fail" and "wpe" in s.culprit.label()
    assert "on input 2" in s.culprit.why, s.culprit.why


def test_a_compensated_weight_not_rerun_is_named_without_a_stale_hint():
    """fc2's weight x8, a Mul by 0.125 after its Gemm: the consumer agrees and cannot be
    rerun alone with torch's parameter; with own errors on, the summary names the weight
    and does not tell the user to turn them on (trial 4, finding 05)."""
    from onnx import helper

    torch.manual_seed(0)

    class Mlp(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 8)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))

    x = torch.randn(4, 16)
    ep = torch.export.export(Mlp().eval(), (x,))
    model = copy.deepcopy(torch.onnx.export(ep, (x,), dynamo=True).model_proto)
    for init in model.graph.initializer:
        if init.name in ("fc2.weight", "fc2.bias"):
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 8, init.name))
    last = model.graph.node[-1]
    out = last.output[0]
    last.output[0] = "scaled"
    model.graph.initializer.append(numpy_helper.from_array(np.array(0.125, np.float32), "k"))
    model.graph.node.append(helper.make_node("Mul", ["scaled", "k"], [out]))
    text = summarize(list(run_aligned(ep, model, (x,), own_error=True))).to_text()
    assert "verdict: PASS" in text and "weights: fc2.weight" in text, text
    assert "own_error=True tells which" not in text
