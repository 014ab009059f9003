"""Quantized models of a Conv the exporter folded a BatchNorm into (trial findings 01
and 02): the quantized weight and bias hold the folded values, so they differ from the
torch parameters by design; they are judged as the float path judges a folded weight
(by their consumer, here within quantization noise), never element by element against
the unfolded parameter (``quantization_step.py``).  A planted fault in a conv nothing
was folded into is still named.  And a program whose input is named ``input``
(``nn.Sequential``'s forward) pairs that input in quantized models too.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
import torch

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.run import run_aligned
from onnx_sbs_nb.records import STATUS_FAIL, STATUS_WEIGHT_DIFFERS

from ...models import export
from ...quant_models import ort_quantize

q = pytest.importorskip("onnxruntime.quantization")

SHAPE = (2, 3, 8, 8)


def _with_bn_stats(bn: torch.nn.BatchNorm2d) -> None:
    """Statistics far from the identity: folding changes the weight and bias a lot."""
    g = torch.Generator().manual_seed(3)
    n = bn.num_features
    bn.running_mean.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)
    bn.running_var.copy_(torch.rand(n, generator=g) + 0.5)
    bn.weight.data.copy_(torch.rand(n, generator=g) + 0.5)
    bn.bias.data.copy_(torch.rand(n, generator=g) * 0.4 - 0.2)


class ConvBN(torch.nn.Module):
    """c1 + BatchNorm (folded by the exporter), then c2 with nothing folded into it."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)
        _with_bn_stats(self.bn)

    def forward(self, x):
        x = torch.relu(self.bn(self.c1(x)))
        x = torch.relu(self.c2(x))
        return self.fc(x.flatten(1))


def _sequential() -> torch.nn.Module:
    """forward(input): its placeholder is named ``input``, a Python builtin."""
    torch.manual_seed(0)
    m = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()
    )
    _with_bn_stats(m[1])
    return m


def _inputs() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(SHAPE, generator=g) for _ in range(8)]


@functools.cache
def _float(name: str):
    model = {"convbn": ConvBN, "sequential": _sequential}[name]().eval()
    return export(model, (_inputs()[0],))


@functools.cache
def _quantized(name: str, mode: str, tmp: str) -> onnx.ModelProto:
    """onnxruntime's quantization of the float export (QDQ per-channel when static)."""
    _, onx = _float(name)
    feeds = [{onx.graph.input[0].name: x.numpy()} for x in _inputs()]
    return ort_quantize(onx, tmp, name, mode, feeds)


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("quantized_folding"))


def _run(name: str, onx: onnx.ModelProto):
    ep, _ = _float(name)
    recs = list(run_aligned(ep, onx, (_inputs()[0],), own_error=True))
    return recs, summarize(recs)


def test_the_export_folds_the_batch_norm():
    """The premise: no BatchNormalization in the float export (folded into c1)."""
    _, onx = _float("convbn")
    assert not any(n.op_type == "BatchNormalization" for n in onx.graph.node)


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_folded_quantized_weights_are_no_fault(mode, tmp):
    recs, s = _run("convbn", _quantized("convbn", mode, tmp))
    text = s.to_text()
    assert s.verdict == "pass" and s.culprit is None, text
    # c1's quantized weight and bias (folded values) differ by design, judged by their
    # consumer; c2's (nothing folded) are compared as usual and not by design
    folded = {r.ep_name: r for r in recs if r.status == STATUS_WEIGHT_DIFFERS}
    assert "p_c1_weight" in folded, text
    assert "the exporter folded" in folded["p_c1_weight"].comment
    assert "quantization noise" in folded["p_c1_weight"].comment
    assert folded["p_c1_weight"].passed2 is None  # its own rerun is no error of its own
    assert not any(n.startswith("p_c2") for n in folded), sorted(folded)
    assert not any(r.status == STATUS_FAIL for r in recs), text


def _init(onx: onnx.ModelProto, name: str) -> np.ndarray:
    return next(onnx.numpy_helper.to_array(i) for i in onx.graph.initializer if i.name == name)


def _plant_channel_scale_x2(onx: onnx.ModelProto) -> str:
    """One channel of c2's (per-channel) weight scale, doubled: c2 folds nothing."""
    dq = next(
        n
        for n in onx.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0].startswith("c2.weight")
    )
    scale = _init(onx, dq.input[1]).copy()
    assert scale.size == 8  # per channel
    scale[2] *= 2
    onx.graph.initializer.append(onnx.numpy_helper.from_array(scale, "planted_scale"))
    dq.input[1] = "planted_scale"
    return dq.name


def _plant_dynamic_scale_x2(onx: onnx.ModelProto) -> str:
    """c2's weight scale (``quantize_dynamic``: per tensor, met at the product) doubled."""
    product = next(
        n for n in onx.graph.node if n.op_type == "ConvInteger" and "c2.weight" in n.input[1]
    )
    scale = product.input[1].replace("_quantized", "_scale")
    planted = onnx.numpy_helper.from_array(_init(onx, scale) * 2, "planted_scale")
    onx.graph.initializer.append(planted)
    for node in onx.graph.node:
        node.input[:] = ["planted_scale" if i == scale else i for i in node.input]
    return product.name


@pytest.mark.parametrize(
    ("mode", "plant"),
    [("static", _plant_channel_scale_x2), ("dynamic", _plant_dynamic_scale_x2)],
    ids=["static-channel", "dynamic"],
)
def test_planted_fault_beside_a_folded_conv_is_named(mode, plant, tmp):
    onx = onnx.ModelProto()
    onx.CopyFrom(_quantized("convbn", mode, tmp))
    planted = plant(onx)
    recs, s = _run("convbn", onx)
    text = s.to_text()
    assert s.verdict == "fail" and s.culprit is not None, text
    c = s.culprit
    # the planted weight's DequantizeLinear, or the float view of the product's weight
    assert c.onnx_node_name in (planted, f"{planted}/weight_float_view"), text
    assert c.ep_name == "p_c2_weight", text
    # the folded conv's weights are still not blamed
    assert not any(r.failed and (r.ep_name or "").startswith("p_c1") for r in recs), text


@pytest.mark.parametrize("mode", ["static", "dynamic"])
def test_sequential_input_named_input(mode, tmp):
    """``input`` (nn.Sequential's argument) is paired in quantized models (finding 02:
    refused, "ONNX input 'input' matches no input of the program ['input']")."""
    _, onx = _float("sequential")
    assert onx.graph.input[0].name == "input"
    recs, s = _run("sequential", _quantized("sequential", mode, tmp))
    text = s.to_text()
    assert s.verdict == "pass" and s.culprit is None, text
    assert any(r.onnx_name == "input" and r.ep_name == "input" for r in recs), text


def test_reproduction_keeps_a_builtin_input_name():
    """The fast reproduction of the exporter's preparation names its placeholders as the
    program does (fx alone would make ``input_1``)."""
    from onnx_sbs_nb.align.source.prepare.exporter_ops import exporter_ops
    from onnx_sbs_nb.align.source.prepare.reproduce import prepare_light

    ep, _ = _float("sequential")
    prepared = prepare_light(ep, exporter_ops())
    names = [n.name for n in prepared.graph.nodes if n.op == "placeholder"]
    assert names == [s.arg.name for s in prepared.graph_signature.input_specs]
    assert "input" in names
    out = prepared.module()(_inputs()[0])
    torch.testing.assert_close(out, ep.module()(_inputs()[0]))
