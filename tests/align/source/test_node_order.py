"""A model whose nodes a graph tool left out of order (acyclic, every value computed) is
run in an order that computes each value first, as onnxruntime runs it; a cycle is still
refused (tests/test_hostile_runs.py)."""

from __future__ import annotations

import onnx
import pytest
import torch

from onnx_sbs_nb import run_aligned, summarize
from onnx_sbs_nb.align.source.model_check import in_run_order
from tests.models import export


class _Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x))) * 2


def _reversed(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    nodes = list(out.graph.node)[::-1]
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    return out


def test_nodes_out_of_order_are_run_in_an_order_that_computes_each_value_first():
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ep, onx = export(_Net().eval(), (x,))
    model = _reversed(onx.model_proto if hasattr(onx, "model_proto") else onx)
    records = list(run_aligned(ep, model, (x,)))
    s = summarize(records)
    assert s.verdict == "pass", s.to_text()
    assert s.coverage.onnx_compared >= s.coverage.onnx_nodes // 2, s.coverage.to_text()


def test_sorting_keeps_an_ordered_model_and_the_users_object():
    x = torch.randn(3, 8)
    _, onx = export(_Net().eval(), (x,))
    model = onx.model_proto if hasattr(onx, "model_proto") else onx
    assert in_run_order(model) is model
    shuffled = _reversed(model)
    before = [n.name for n in shuffled.graph.node]
    fixed = in_run_order(shuffled)
    assert fixed is not shuffled and [n.name for n in shuffled.graph.node] == before
    seen = {i.name for i in fixed.graph.input} | {t.name for t in fixed.graph.initializer} | {""}
    for node in fixed.graph.node:
        assert all(i in seen for i in node.input), node.name
        seen.update(node.output)


def test_onnxruntimes_float16_converter_output_is_compared():
    # onnxruntime's own converter appends the graph inputs' Casts after their readers
    fp16 = pytest.importorskip("onnxruntime.transformers.float16")
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ep, onx = export(_Net().eval(), (x,))
    model = onx.model_proto if hasattr(onx, "model_proto") else onx
    half = fp16.convert_float_to_float16(model, keep_io_types=True)
    assert in_run_order(half) is not half  # out of order as the converter writes it
    records = list(run_aligned(ep, half, (x,)))
    s = summarize(records)
    assert s.verdict in ("pass", "fail"), s.to_text()
    assert s.coverage.onnx_compared > 0, s.coverage.to_text()
    assert not [r for r in records if r.status == "error"], s.to_text()


class _Select(torch.nn.Module):
    def forward(self, x, i):
        return torch.tanh(x).index_select(0, i) * 2


def test_a_node_onnxruntime_fails_is_a_record_not_a_line_in_the_terminal(capfd):
    # onnxruntime printed its own "[E:onnxruntime:...] Non-zero status code" line beside
    # the record that holds the same message, in the middle of the progress bar
    x, i = torch.randn(4, 3), torch.tensor([1, 3])
    ep, onx = export(_Select(), (x, i))
    model = onnx.ModelProto()
    model.CopyFrom(onx.model_proto if hasattr(onx, "model_proto") else onx)
    gather = next(n for n in model.graph.node if n.op_type == "Gather")
    for att in gather.attribute:  # index 3 of 3 columns: fails when run, not when built
        if att.name == "axis":
            att.i = 1
    capfd.readouterr()
    records = list(run_aligned(ep, model, (x, i)))
    err = capfd.readouterr().err
    failed = [r for r in records if r.status == "error"]
    assert failed and "out of data bounds" in failed[0].error, failed
    assert "[E:onnxruntime" not in err, err
