"""An initializer the exporter stored once for equal parameters (trial 5, finding 08): two
fresh LayerNorms (weights all ones) both read ``ln1.weight``.  A fault planted there is the
weight's: its why names both readers and the parameter each stands for, and ln2's reader,
whose own error is that weight's, is no suspect of its own."""

from __future__ import annotations

import contextlib
import copy
import io

import pytest
import torch
from onnx import helper, numpy_helper
from torch import nn

from onnx_sbs_nb import run_aligned, summarize
from onnx_sbs_nb.records import WEIGHT_READER_NOTE


class _Block(nn.Module):
    def __init__(self, d: int = 32) -> None:
        super().__init__()
        self.ln1, self.fc = nn.LayerNorm(d), nn.Linear(d, d)
        self.ln2, self.ff = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        h = self.ln1(x + self.fc(x))
        return self.ln2(h + self.ff(h))


@pytest.fixture(scope="module")
def exported():
    torch.manual_seed(0)
    m = _Block().eval()
    x = torch.randn(2, 6, 32)
    ep = torch.export.export(m, (x,))
    with contextlib.redirect_stdout(io.StringIO()):
        model = torch.onnx.export(ep, (x,), dynamo=True).model_proto
    readers = [n for n in model.graph.node if n.op_type == "LayerNormalization"]
    # the case under test: the exporter stored the equal weights once
    assert [n.input[1] for n in readers] == ["ln1.weight", "ln1.weight"], readers
    return ep, model, x


def _planted(model, eps: float | None = None):
    model = copy.deepcopy(model)
    for init in model.graph.initializer:
        if init.name == "ln1.weight":
            a = numpy_helper.to_array(init).copy()
            a[5] += 0.3
            init.CopyFrom(numpy_helper.from_array(a, init.name))
    if eps is not None:  # a fault of ln2's reader's own, besides the weight's
        node = [n for n in model.graph.node if n.op_type == "LayerNormalization"][1]
        for att in node.attribute:
            if att.name == "epsilon":
                node.attribute.remove(att)
                break
        node.attribute.append(helper.make_attribute("epsilon", eps))
    return model


def _records(ep, model, x):
    return list(run_aligned(ep, model, (x,), own_error=True))


def test_a_fault_in_a_weight_stored_once_is_the_weights_with_every_reader_named(exported):
    ep, model, x = exported
    records = _records(ep, _planted(model), x)
    s = summarize(records)
    assert s.verdict == "fail", s.to_text()
    c = s.culprit
    assert c.record.kind == "weight" and c.record.onnx_name == "ln1.weight", s.to_text()
    assert c.record.ep_name == "p_ln1_weight", s.to_text()
    # every reader, and the parameter each stands for
    assert "node_layer_norm (for p_ln1_weight)" in c.why, c.why
    assert (
        "node_layer_norm_1 (for p_ln2_weight: the exporter stored the equal parameters once)"
        in c.why
    ), c.why
    # ln2's reader: its own error is the weight's, said on its record, and it is no suspect
    ln2 = next(r for r in records if r.onnx_node_name == "node_layer_norm_1")
    assert ln2.passed2 is False  # its rerun on torch inputs reads the faulty weight
    assert WEIGHT_READER_NOTE in (ln2.comment or ""), ln2.comment
    assert "p_ln2_weight" in ln2.comment and "agrees with torch" in ln2.comment
    # ... as ln1's, the first reader, which the weight's own probe explains
    ln1 = next(r for r in records if r.onnx_node_name == "node_layer_norm")
    assert WEIGHT_READER_NOTE in (ln1.comment or ""), ln1.comment
    readers = {"layer_norm", "layer_norm_1"}
    assert not readers & {r.onnx_name for r in s.top_suspects}, s.to_text()
    table = s.to_text()[s.to_text().index("own err") :]
    assert "layer_norm_1 in ln2" not in table and "ln1.weight" in table, table


def test_a_reader_with_a_fault_of_its_own_stays_a_suspect(exported):
    """The probe with the parameter the reader's torch twin reads is what explains it: a
    reader that still disagrees given that parameter makes an error of its own."""
    ep, model, x = exported
    records = _records(ep, _planted(model, eps=0.5), x)
    s = summarize(records)
    ln2 = next(r for r in records if r.onnx_node_name == "node_layer_norm_1")
    assert ln2.passed2 is False
    assert WEIGHT_READER_NOTE not in (ln2.comment or ""), ln2.comment
    assert "layer_norm_1" in {r.onnx_name for r in s.top_suspects}, s.to_text()
    assert s.culprit.record.onnx_name == "ln1.weight", s.to_text()


def test_the_faithful_export_passes(exported):
    ep, model, x = exported
    records = _records(ep, model, x)
    s = summarize(records)
    assert s.verdict == "pass", s.to_text()
    assert not any(WEIGHT_READER_NOTE in (r.comment or "") for r in records)
