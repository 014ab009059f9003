"""run_aligned_onnx on the pairs a user ships: float32 against its onnxconverter-common
float16 conversion (float32 kept at the inputs and outputs), and a dynamic int8
quantization.  Real export, real converter, real onnxruntime (trial 5, finding 09)."""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import warnings

import onnx
import pytest
import torch

from onnx_sbs_nb import run_aligned_onnx, summarize
from onnx_sbs_nb.records import KIND_OUTPUT, STATUS_NOT_COMPARED, STATUS_OK, UNPAIRED

float16 = pytest.importorskip("onnxconverter_common.float16")


class _NormResidual(torch.nn.Module):
    """LayerNorm, Linear and a residual: the graph output is an Add of two float values,
    which the converter computes in float16 and casts back to float32."""

    def __init__(self, d: int = 32):
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + self.fc(self.ln(x))


@functools.cache
def _models():
    torch.manual_seed(0)
    m = _NormResidual().eval()
    x = torch.randn(2, 6, 32)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        a = torch.onnx.export(torch.export.export(m, (x,)), (x,), dynamo=True).model_proto
    b = float16.convert_float_to_float16(copy.deepcopy(a), keep_io_types=True)
    return a, b, {"x": x.numpy()}


def _outputs(records):
    return [r for r in records if r.kind == KIND_OUTPUT]


@pytest.mark.parametrize("order", ["float32_first", "float16_first"])
def test_float16_with_float32_outputs_pairs_its_output_by_name_and_passes(order):
    """keep_io_types=True: the converter's Cast back to float32 takes the output's name;
    the two graph outputs ``add`` pair, within float16's tolerance, and the run passes
    (it was a FAIL naming the output as culprit), either model the reference."""
    a, b, feeds = _models()
    assert [o.name for o in b.graph.output] == ["add"]
    assert b.graph.node[-1].op_type == "Cast" and b.graph.node[-1].output[0] == "add"
    ref, cand = (a, b) if order == "float32_first" else (b, a)
    records = list(run_aligned_onnx(ref, cand, feeds))
    (out,) = _outputs(records)
    assert (out.ep_name, out.onnx_name, out.status) == ("add", "add", STATUS_OK), out
    if order == "float32_first":
        # the float16 Add the Cast reads pairs with the output too: the node is compared
        (inner,) = [r for r in records if r.onnx_name == "node_add_cast_to_add"]
        assert (inner.ep_name, inner.status) == ("add", STATUS_OK), inner
    s = summarize(records)
    assert s.verdict == "pass", s.to_text()
    assert s.culprit is None


def test_a_renamed_output_pairs_through_the_converters_cast():
    """The float16 model's output renamed: the Add lowering fx node ``add`` pairs the
    reference's output with the candidate's graph output past the Cast, not with the
    float16 value inside, so no output is left without a twin."""
    a, b, feeds = _models()
    renamed = copy.deepcopy(b)
    renamed.graph.output[0].name = "out"
    renamed.graph.node[-1].output[0] = "out"
    records = list(run_aligned_onnx(a, renamed, feeds))
    (out,) = _outputs(records)
    assert (out.ep_name, out.onnx_name, out.status) == ("add", "out", STATUS_OK), out
    assert summarize(records).verdict == "pass"


def test_a_wrong_node_of_the_float16_model_is_still_the_culprit():
    """Pairing the outputs through the Cast hides no error: a float16 model whose bias
    Add became a Sub fails, with that node as culprit."""
    a, b, feeds = _models()
    bad = copy.deepcopy(b)
    node = next(n for n in bad.graph.node if n.name == "node_linear")
    node.op_type = "Sub"
    s = summarize(list(run_aligned_onnx(a, bad, feeds, own_error=True)))
    assert s.verdict == "fail", s.to_text()
    assert s.culprit is not None and s.culprit.onnx_node_name == "node_linear", s.to_text()


@pytest.mark.parametrize("order", ["extra_in_candidate", "extra_in_reference"])
def test_an_output_with_no_twin_is_not_compared_never_a_culprit(order):
    """An output the other model has no twin of says nothing of either model: not
    compared, the run incomplete (exit 3), no culprit, in words of the reference model
    (there is no program in a run of two ONNX models)."""
    a, b, feeds = _models()
    extra = copy.deepcopy(b)
    extra.graph.node.append(onnx.helper.make_node("Neg", ["x"], ["neg_extra"], name="extra"))
    extra.graph.output.append(
        onnx.helper.make_tensor_value_info("neg_extra", onnx.TensorProto.FLOAT, None)
    )
    ref, cand = (a, extra) if order == "extra_in_candidate" else (extra, a)
    records = list(run_aligned_onnx(ref, cand, feeds))
    lone = next(r for r in _outputs(records) if "neg_extra" in (r.ep_name, r.onnx_name))
    assert (lone.status, lone.paired_by) == (STATUS_NOT_COMPARED, UNPAIRED)
    assert "reference model" in lone.comment and "program" not in lone.comment
    s = summarize(records)
    assert s.verdict == "incomplete", s.to_text()
    assert s.culprit is None
    assert "1 output with no twin" in s.to_text()


def test_quantization_noise_speaks_of_the_reference_models_inputs(tmp_path):
    """A dynamic int8 quantization against its float model: the note on values off by
    quantization noise names the reference model's inputs, not torch's."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 64)
    ).eval()
    x = torch.randn(4, 64)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        a = torch.onnx.export(torch.export.export(m, (x,)), (x,), dynamo=True).model_proto
    onnx.save(a, tmp_path / "a.onnx")
    quantize_dynamic(tmp_path / "a.onnx", tmp_path / "q.onnx", weight_type=QuantType.QInt8)
    q = onnx.load(tmp_path / "q.onnx")
    text = summarize(list(run_aligned_onnx(a, q, {"input": x.numpy()}, own_error=True))).to_text()
    note = next(line for line in text.splitlines() if line.startswith("quantization noise:"))
    assert "the reference model's inputs" in note and "torch" not in note, text
