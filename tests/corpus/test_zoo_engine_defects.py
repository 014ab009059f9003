"""Small cases for the engine defects the second zoo found
(tests/corpus/zoo_vision_and_program_features.py), each one built here so that it fails for
one reason only.

- A. The exporter's preparation reproduced in the wrong grad mode (swin).
- B. Complex values (torch.fft) have no partner, so blame leaks into the next lowering.
- C. bfloat16 values onnxruntime cannot hand back to numpy are reported as the model's
  error.

Each case failed before its fix; they now guard the fixes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.records import STATUS_ERROR
from tests.corpus.faults import swap_op
from tests.corpus.naming import named_correctly, what_summary_names

pytestmark = pytest.mark.corpus


def _export(model, args):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model.eval(), args)
        onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return ep, onx, args


def _run(ep, onx, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = list(run_aligned(ep, onx, args, rerun_with_torch_inputs=True))
    return records, summarize(records, node_inputs=onx)


def _failing(records):
    return [
        f"{r.ep_name}|{r.onnx_name} {r.status} err={r.err_abs} own={r.err_abs2} {r.error or ''}"
        for r in records
        if r.failed or r.passed2 is False
    ]


# ------------------------------------------------- A: preparation in the user's grad mode


class BiasedWindowAttention(nn.Module):
    """Swin's attention in miniature: a relative-position bias gathered from a parameter
    table as SDPA's float mask, then ``transpose(1, 2).reshape``.  Exported under
    no_grad, the reshape is a ``view`` (SDPA's output is laid out (b, s, h, d)); with
    grad enabled the mask requires grad, SDPA takes another path whose output cannot be
    viewed that way, and the exporter's preparation fails."""

    def __init__(self, s=5):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(16, 16), nn.Linear(16, 16), nn.Linear(16, 16)
        self.o = nn.Linear(16, 16)
        self.table = nn.Parameter(torch.randn(9, 2))
        self.register_buffer("index", torch.randint(0, 9, (s * s,)))

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (lin(x).view(b, s, -1, 8).transpose(1, 2) for lin in (self.q, self.k, self.v))
        bias = self.table[self.index].view(s, s, -1).permute(2, 0, 1).unsqueeze(0)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


@pytest.fixture(scope="module")
def window_attention():
    torch.manual_seed(0)
    return _export(BiasedWindowAttention(), (torch.randn(4, 5, 16),))


def test_preparation_fails_with_grad_enabled(window_attention):
    """The premise of A, on torch itself: the exporter's preparation of this program
    fails with grad enabled and works under no_grad (as the export did)."""
    from torch.onnx._internal.exporter import _core, _registration

    ep = window_attention[0]
    registry = _registration.ONNXRegistry.from_torchlib()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            _core._prepare_exported_program_for_export(ep, registry=registry)
        with torch.enable_grad(), pytest.raises(Exception, match="view"):
            _core._prepare_exported_program_for_export(ep, registry=registry)


def test_faithful_export_needing_no_grad_preparation_passes(window_attention):
    ep, onx, args = window_attention
    records, s = _run(ep, onx, args)
    assert not _failing(records), "\n".join(_failing(records))
    assert s.verdict == "pass", s.to_text()


# --------------------------------------------- B: complex values pair through view_as_real


class SpectralGain(nn.Module):
    """rfft, a learned real gain on the complex spectrum, irfft."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.gain = nn.Parameter(torch.rand(9) + 0.5)
        self.out = nn.Linear(16, 3)

    def forward(self, x):
        spec = torch.fft.rfft(self.inp(x), dim=-1)
        return self.out(torch.fft.irfft(spec * self.gain, n=16, dim=-1))


@pytest.fixture(scope="module")
def spectral():
    torch.manual_seed(0)
    return _export(SpectralGain(), (torch.randn(2, 16),))


def test_spectral_faithful_passes(spectral):
    records, s = _run(*spectral)
    assert not _failing(records) and s.verdict == "pass", s.to_text()


def _complex_mul_node(onx):
    """An Add of the complex product's lowering (real pairs: re*re - im*im, re*im + im*re)."""
    from onnx_sbs_nb.align.source.fx_metadata import fx_name_from_metadata

    return next(
        n for n in onx.graph.node if n.op_type == "Add" and fx_name_from_metadata(n) == "mul"
    )


def test_fault_in_complex_product_names_it(spectral):
    ep, onx, args = spectral
    bad = swap_op(_complex_mul_node(onx).name, "Sub")(onx)
    _, s = _run(ep, bad, args)
    assert s.verdict == "fail"
    assert named_correctly(s, bad, _complex_mul_node(onx).name), what_summary_names(s, bad)


def test_complex_values_are_compared(spectral):
    records, _ = _run(*spectral)
    complex_compared = [
        r
        for r in records
        if r.ep_shape_type and "complex" in r.ep_shape_type and r.err_abs is not None
    ]
    assert complex_compared, [
        (r.ep_name, r.ep_shape_type, r.status)
        for r in records
        if r.ep_shape_type and "complex" in r.ep_shape_type
    ]


# ------------------------------------------------- C: bfloat16 through onnxruntime


class HalfRMS(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(16)
        self.lin = nn.Linear(16, 4)

    def forward(self, x):
        return torch.softmax(self.lin(self.norm(x)), dim=-1)


@pytest.fixture(scope="module")
def bf16_model():
    torch.manual_seed(0)
    return _export(HalfRMS().to(torch.bfloat16), (torch.randn(3, 16, dtype=torch.bfloat16),))


def test_bfloat16_faithful_export_passes(bf16_model):
    records, s = _run(*bf16_model)
    errors = [
        f"{r.onnx_name} ({r.onnx_op_type}): {r.error}" for r in records if r.status == STATUS_ERROR
    ]
    assert not errors, "\n".join(errors)
    assert s.verdict == "pass", s.to_text()


def test_bfloat16_with_torch_runner_passes(bf16_model):
    """The same model through our torch evaluator: no tool error (a guard)."""
    ep, onx, args = bf16_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records = list(run_aligned(ep, onx, args, runner="torch"))
    errors = [f"{r.onnx_name}: {r.error}" for r in records if r.status == STATUS_ERROR]
    assert not errors, "\n".join(errors)
    assert summarize(records, node_inputs=onx).verdict == "pass"
