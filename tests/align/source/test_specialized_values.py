"""A decomposition that fixed a size on the example inputs, seen in the values
(align/source/specialized.py, align/engine/decomposed_values.py).

``AdaptiveAvgPool2d((3, 4))`` exported at 6x8 becomes an ``avg_pool2d`` of kernel 2x2;
at 7x9 that still makes a 3x4 grid, of other windows than the user's op pools.  The
prepared program and the ONNX model agree with each other, both wrong: the run must
fail on the pooling, with the user's program's value as the one expected.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnxruntime as ort
import pytest
import torch
from torch import nn

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.records import STATUS_FAIL

DYN = torch.export.Dim.DYNAMIC


class ConvPool2d(nn.Module):
    def __init__(self):
        super().__init__()
        self.c = nn.Conv2d(2, 4, 1)
        self.p = nn.AdaptiveAvgPool2d((3, 4))

    def forward(self, x):
        return self.p(self.c(x))


class LinearPool1d(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.pool = nn.AdaptiveAvgPool1d(2)

    def forward(self, x):
        return self.pool(torch.relu(self.fc(x)).transpose(1, 2))


def _export(model: nn.Module, x: torch.Tensor, dims: dict):
    torch.manual_seed(0)
    model = model.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (x,), dynamic_shapes=(dims,))
        onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False)
    return ep, onx


@pytest.fixture(scope="module")
def pool2d():
    torch.manual_seed(0)
    return _export(ConvPool2d(), torch.randn(1, 2, 6, 8), {2: DYN, 3: DYN})


@pytest.fixture(scope="module")
def pool1d():
    torch.manual_seed(0)
    return _export(LinearPool1d(), torch.randn(2, 6, 8), {0: DYN, 1: DYN})


def _onnx_vs_eager(ep, onx, x) -> float:
    sess = ort.InferenceSession(onx.model_proto.SerializeToString())
    got = sess.run(None, {"x": x.numpy()})[0]
    want = ep.module()(x).detach().numpy()
    assert got.shape == want.shape  # the shape agrees: only the values tell
    return float(np.abs(got - want).max())


def test_values_of_a_size_fixed_on_the_example_fail_on_the_user_node(pool2d):
    ep, onx = pool2d
    torch.manual_seed(1)
    x = torch.randn(1, 2, 7, 9)
    wrong = _onnx_vs_eager(ep, onx, x)
    assert wrong > 0.1  # the export is wrong at this size
    records = list(run_aligned(ep, onx, (x,)))
    s = summarize(records)
    assert s.verdict == "fail", s.to_text()
    assert s.culprit is not None and s.culprit.ep_user_name == "adaptive_avg_pool2d"
    assert "fixed a size on the example inputs" in s.culprit.why
    failing = [r for r in records if r.failed]
    assert [r.onnx_op_type for r in failing] == ["AveragePool"]
    (rec,) = failing
    assert rec.status == STATUS_FAIL and rec.decided_by == "fixed_on_example_inputs"
    # the expected value is the user's program's: the error is the export's error
    assert rec.err_abs == pytest.approx(wrong, rel=1e-4)
    assert rec.ep_shape_type == rec.onnx_shape_type == "float32[1x4x3x4]"


@pytest.mark.parametrize("length", [7, 8])
def test_a_fixed_kernel_in_one_dimension_fails_too(pool1d, length):
    ep, onx = pool1d
    torch.manual_seed(2)
    x = torch.randn(2, length, 8)
    assert _onnx_vs_eager(ep, onx, x) > 1e-3
    s = summarize(list(run_aligned(ep, onx, (x,), own_error=True)))
    assert s.verdict == "fail", s.to_text()
    assert s.culprit.ep_user_name == "adaptive_avg_pool1d"
    assert "fixed a size on the example inputs" in s.culprit.why


@pytest.mark.parametrize(
    ("which", "shape"),
    [
        ("pool2d", (1, 2, 6, 8)),  # the example's sizes
        ("pool1d", (2, 6, 8)),
        ("pool1d", (5, 6, 8)),  # another batch: the fixed kernel is exact
    ],
)
def test_sizes_where_the_decomposition_is_exact_pass(request, which, shape):
    ep, onx = request.getfixturevalue(which)
    torch.manual_seed(3)
    x = torch.randn(*shape)
    assert _onnx_vs_eager(ep, onx, x) < 1e-4
    run = AlignedRun(ep, onx, (x,), own_error=True)
    records = list(run)
    s = summarize(records)
    assert s.verdict == "pass", s.to_text()
    # the check runs only where the sizes differ from the example's
    differs = shape[0] != (1 if which == "pool2d" else 2)
    assert (run.decomposed is not None) == differs


def test_a_faithful_dynamic_program_checks_no_value():
    """Nothing decomposed: no user op is rerun, nothing flagged."""

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.fc = nn.Linear(8, 8)

        def forward(self, x):
            return torch.softmax(self.fc(self.norm(x)), -1)

    torch.manual_seed(0)
    ep, onx = _export(Block(), torch.randn(2, 5, 8), {0: DYN, 1: DYN})
    run = AlignedRun(ep, onx, (torch.randn(3, 9, 8),))
    s = summarize(list(run))
    assert s.verdict == "pass", s.to_text()
    assert run.decomposed is None and not run.specialized


def test_outputs_differing_from_the_users_program_never_pass(pool2d):
    """The last safety net: with no per-node check to catch it (as for a decomposition
    whose op cannot be rerun), the outputs are compared with the user's own program."""
    ep, onx = pool2d
    torch.manual_seed(1)
    x = torch.randn(1, 2, 7, 9)
    wrong = _onnx_vs_eager(ep, onx, x)
    run = AlignedRun(ep, onx, (x,))
    assert run.decomposed is not None and run.user_outputs is not None
    run.decomposed.checks = {}  # the per-node check finds nothing
    records = list(run)
    s = summarize(records)
    assert s.verdict == "fail", s.to_text()
    (rec,) = [r for r in records if r.failed]
    assert rec.decided_by == "user_program_outputs" and rec.kind == "output"
    assert rec.err_abs == pytest.approx(wrong, rel=1e-4)
    assert "differs from the user's own program" in s.culprit.why


def test_the_safety_net_costs_nothing_at_the_examples_sizes(pool2d):
    ep, onx = pool2d
    run = AlignedRun(ep, onx, (torch.randn(1, 2, 6, 8),))
    assert run.user_outputs is None and run.decomposed is None
    assert summarize(list(run)).verdict == "pass"
