"""A decomposition that fixed a size on the example inputs (align/source/specialized.py).

The exporter's preparation turns ``adaptive_avg_pool2d`` to ``(3, 4)`` into an
``avg_pool2d`` whose kernel is the example's height and width divided by 3 and 4, while
the program keeps the height and width dynamic.  For inputs of another size the prepared
program and the ONNX model agree with each other on a shape the user's program does not
make: the run must name the pooling, not pass, and not blame the linear layer after it.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.records import STATUS_SHAPE_MISMATCH


class PooledHead(nn.Module):
    """A VGG-style head: convolution, adaptive pooling to a fixed grid, linear layer."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d((3, 4))
        self.fc = nn.Linear(4 * 3 * 4, 5)

    def forward(self, x):
        return self.fc(self.pool(torch.relu(self.conv(x))).flatten(1))


class PooledFeatures(PooledHead):
    """The same pooling returned as it is: nothing after it fails to run."""

    def forward(self, x):
        return self.pool(torch.relu(self.conv(x))) * 2.0


def _export(model: nn.Module):
    torch.manual_seed(0)
    model = model.eval()
    x = torch.randn(1, 3, 12, 12)
    dim = torch.export.Dim
    shapes = ({2: dim("h", min=4, max=64), 3: dim("w", min=4, max=64)},)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (x,), dynamic_shapes=shapes)
        onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False)
    return ep, onx


@pytest.fixture(scope="module")
def head():
    return _export(PooledHead())


@pytest.fixture(scope="module")
def features():
    return _export(PooledFeatures())


def test_a_size_fixed_by_a_decomposition_is_named_at_other_sizes(head):
    ep, onx = head
    x = torch.randn(1, 3, 9, 11)
    assert ep.module()(x).shape == (1, 5)  # the user's program runs at this size
    records = list(run_aligned(ep, onx.model_proto, (x,), own_error=True))
    s = summarize(records, node_inputs=onx.model_proto)
    assert s.verdict == "fail"
    assert s.culprit is not None and s.culprit.ep_user_name == "adaptive_avg_pool2d"
    assert s.culprit.onnx_op_type == "AveragePool"
    assert "took from the example inputs" in s.culprit.why
    flagged = [r for r in records if r.status == STATUS_SHAPE_MISMATCH]
    assert len(flagged) == 1, [r.ep_name for r in flagged]
    (rec,) = flagged
    assert rec.ep_shape_type == "float32[1x4x3x4]"  # what the user's program makes
    assert rec.onnx_shape_type == "float32[1x4x2x3]"
    assert rec.decided_by == "fixed_on_example_inputs"
    # the flatten after it inherits the shape: not a finding of its own
    view = next(r for r in records if r.onnx_op_type == "Reshape")
    assert view.status == "ok"


def test_the_onnx_program_itself_gives_the_same_finding(features):
    """The ONNXProgram carries the prepared program: no preparation is redone, the
    finding is the same; nothing fails to run after the pooling."""
    ep, onx = features
    records = list(run_aligned(ep, onx, (torch.randn(1, 3, 15, 16),)))
    s = summarize(records)
    flagged = [r for r in records if r.status == STATUS_SHAPE_MISMATCH]
    assert [r.onnx_op_type for r in flagged] == ["AveragePool"]
    assert flagged[0].ep_shape_type == "float32[1x4x3x4]"
    assert flagged[0].onnx_shape_type == "float32[1x4x3x5]"
    assert s.verdict == "fail" and s.culprit.ep_user_name == "adaptive_avg_pool2d"
    assert not [r for r in records if r.status == "error"]


@pytest.mark.parametrize("size", [(12, 12), (24, 16)])
def test_sizes_where_the_fixed_kernel_is_right_pass(features, size):
    """At the example's size (and where the fixed kernel happens to give the same grid)
    the export is faithful: nothing flagged."""
    ep, onx = features
    x = torch.randn(1, 3, *size)
    records = list(run_aligned(ep, onx, (x,), own_error=True))
    s = summarize(records)
    if size == (24, 16):
        # kernel 4x3 on 24x16: a 6x5 grid where the program makes 3x4
        assert [r.onnx_op_type for r in records if r.status == STATUS_SHAPE_MISMATCH] == [
            "AveragePool"
        ]
        return
    assert s.verdict == "pass", s.to_text()
    assert not [r for r in records if r.status == STATUS_SHAPE_MISMATCH]


def test_a_faithful_dynamic_program_at_other_sizes_flags_nothing():
    """Decomposed ops whose sizes stay symbolic (linear, layer norm, softmax, gelu over a
    dynamic batch and sequence) agree with the user's shapes at any size."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.fc(self.norm(x)))
            return torch.softmax(h @ h.transpose(1, 2), -1) @ h

    torch.manual_seed(0)
    x = torch.randn(2, 5, 8)
    dim = torch.export.Dim
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(
            Block().eval(), (x,), dynamic_shapes=({0: dim("b", max=8), 1: dim("s", max=32)},)
        )
        onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False)
    records = list(run_aligned(ep, onx.model_proto, (torch.randn(3, 9, 8),), own_error=True))
    s = summarize(records)
    assert s.verdict == "pass", s.to_text()
    assert not [r for r in records if r.status == STATUS_SHAPE_MISMATCH]
