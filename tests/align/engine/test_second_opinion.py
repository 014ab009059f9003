"""A node that raises in a runner other than onnxruntime is asked of onnxruntime: where
onnxruntime runs it on the same inputs, the failure is the runner's (not computed, the run
incomplete, no culprit); where onnxruntime fails too, it stays the model's error (trial 5,
finding 07).  Real export, the real ONNX reference evaluator, real onnxruntime."""

from __future__ import annotations

import contextlib
import io
import warnings

import onnx
import torch

from onnx_sbs_nb import run_aligned, summarize
from onnx_sbs_nb.records import STATUS_ERROR, STATUS_NOT_COMPUTED


def _export(m, args):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        ep = torch.export.export(m, args)
        return ep, torch.onnx.export(ep, args, dynamo=True).model_proto


class GroupedUp(torch.nn.Module):
    """A grouped ConvTranspose: the reference evaluator's own kernel raises a numpy
    ValueError on group > 1, onnxruntime runs it."""

    def __init__(self):
        super().__init__()
        self.ct = torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2)

    def forward(self, b):
        return torch.relu(self.ct(b))


def grouped_up():
    torch.manual_seed(0)
    b = torch.randn(1, 4, 9, 9)
    ep, onx = _export(GroupedUp().eval(), (b,))
    return ep, onx, (b,)


def test_a_node_the_reference_evaluator_cannot_run_is_not_the_models_error():
    ep, onx, args = grouped_up()
    assert summarize(list(run_aligned(ep, onx, args))).verdict == "pass"  # onnxruntime
    for own_error in (False, True):
        records = list(run_aligned(ep, onx, args, runner="reference", own_error=own_error))
        (ct,) = [r for r in records if r.onnx_op_type == "ConvTranspose"]
        assert ct.status == STATUS_NOT_COMPUTED, ct
        assert "ValueError" in ct.comment and "onnxruntime runs it" in ct.comment, ct.comment
        s = summarize(records)
        assert s.verdict == "incomplete", s.to_text()
        assert s.culprit is None and not s.errors
        text = s.to_text()
        assert "runner failed: " in text and "not the model's" in text, text
        assert "ValueError" in text.split("runner failed: ")[1].splitlines()[0]


class BadReshape(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x.reshape(3, -1))


def test_a_node_onnxruntime_cannot_run_either_stays_the_models_error():
    """A Reshape to a shape its input cannot take (the export broken by hand) raises in
    the reference evaluator and in onnxruntime alike: the model's error, a culprit."""
    x = torch.randn(2, 6)
    ep, onx = _export(BadReshape().eval(), (x,))
    shape = next(n for n in onx.graph.node if n.op_type == "Reshape").input[1]
    for init in onx.graph.initializer:
        if init.name == shape:
            init.CopyFrom(
                onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) * 0 + [5, -1], shape)
            )
    records = list(run_aligned(ep, onx, (x,), runner="reference"))
    (reshape,) = [r for r in records if r.onnx_op_type == "Reshape"]
    assert reshape.status == STATUS_ERROR, reshape
    assert "onnxruntime runs" not in (reshape.error or "") + (reshape.comment or "")
    s = summarize(records)
    assert s.verdict == "fail", s.to_text()
    assert s.culprit is not None and "runner failed" not in s.to_text()
