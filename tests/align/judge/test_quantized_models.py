"""Quantized ONNX models against the float torch program (issue 51, item 1): onnxruntime's
real ``quantize_dynamic`` and ``quantize_static`` (QDQ, per-channel) of an MLP and a small
CNN built here with random weights.  A faithful quantization is quantization noise, no
fault; a planted fault (a DequantizeLinear scale x2, a zero point +10, an Add swapped for
Sub) is named, by its node or the lowering its rerun starts from.
"""

from __future__ import annotations

import functools

import numpy as np
import onnx
import onnx.helper
import onnx.numpy_helper
import pytest
import torch

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.judge.quantization_noise import (
    QuantizationNoise,
    noise_bits,
    noise_floor,
    own_noise_floor,
    quantization_bits,
    rerun_sources,
)
from onnx_sbs_nb.align.pairing.quantized import QUANT_OPS
from onnx_sbs_nb.align.pairing.rules import PAIRED_BY_DEQUANTIZED
from onnx_sbs_nb.align.run import run_aligned
from onnx_sbs_nb.records import (
    KIND_INPUT,
    STATUS_FAIL,
    STATUS_OK,
    STATUS_QUANTIZATION_NOISE,
)

from ...corpus.quantized_models import upstream_nodes
from ...models import export
from ...quant_models import ort_quantize

q = pytest.importorskip("onnxruntime.quantization")

_COMPARED = (STATUS_OK, STATUS_FAIL, STATUS_QUANTIZATION_NOISE)


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = torch.nn.Linear(32, 64), torch.nn.Linear(64, 64)
        self.fc3 = torch.nn.Linear(64, 10)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8 * 8 * 8, 10)

    def forward(self, x):
        x = torch.relu(self.c1(x))
        x = torch.relu(self.c2(x)) + x
        return self.fc(x.flatten(1))


SHAPES = {"mlp": (8, 32), "cnn": (2, 3, 8, 8), "mlp3d": (2, 4, 32)}


def _inputs(name: str) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.randn(SHAPES[name], generator=g) for _ in range(8)]


@functools.cache
def _float(name: str):
    model = {"mlp": MLP, "cnn": CNN, "mlp3d": MLP}[name]().eval()
    return export(model, (_inputs(name)[0],))


@functools.cache
def _quantized(name: str, mode: str, tmp: str, fmt: str = "QDQ") -> onnx.ModelProto:
    """onnxruntime's own quantization of the float export (QDQ, per-channel when static)."""
    _, onx = _float(name)
    feeds = [{onx.graph.input[0].name: x.numpy()} for x in _inputs(name)]
    return ort_quantize(
        onx, tmp, f"{name}_{fmt}", mode, feeds, quant_format=getattr(q.QuantFormat, fmt)
    )


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("quantized"))


def _run(name: str, onx: onnx.ModelProto):
    ep, _ = _float(name)
    recs = list(run_aligned(ep, onx, (_inputs(name)[0],), own_error=True))
    return recs, summarize(recs)


def _compared(recs) -> set[str]:
    return {r.ep_name for r in recs if r.status in _COMPARED and r.kind != KIND_INPUT}


@pytest.mark.parametrize("mode", ["dynamic", "static"])
@pytest.mark.parametrize("name", ["mlp", "cnn"])
def test_faithful_quantization_is_noise(name, mode, tmp):
    onx = _quantized(name, mode, tmp)
    recs, s = _run(name, onx)
    text = s.to_text()
    assert s.verdict == "pass" and s.culprit is None, text
    assert "quantization noise" in text
    noisy = [r for r in recs if r.status == STATUS_QUANTIZATION_NOISE]
    assert noisy and all(r.err_snr is not None and r.err_snr > 20 for r in noisy)
    # every compared value carries its SQNR
    assert all(r.err_snr is not None for r in recs if r.status in _COMPARED)
    # the quantization nodes are in compared pairs (the float domain of QDQ, dynamic's Mul
    # after MatMulInteger inside the rerun lowering of a compared value)
    if mode == "static":
        assert any(r.onnx_op_type == "DequantizeLinear" for r in noisy), text
    # a large share of the float export's pairs compared: all of them in QDQ (a Gemm whose
    # output the quantizer renamed after the Relu it folded is torch's linear); dynamic
    # quantization keeps no float twin of a MatMulInteger's weight: its float view does
    # (pairing/float_views.py; 73% of the MLP's pairs, 77% of the CNN's without it)
    float_recs, _ = _run(name, _float(name)[1])
    share = len(_compared(recs) & _compared(float_recs)) / len(_compared(float_recs))
    print(f"{name} {mode}: {share:.0%} of the float export's pairs compared")
    assert share >= (0.8 if mode == "dynamic" else 0.95), sorted(_compared(float_recs))


def _new_init(onx: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    onx.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
    return name


def _init(onx: onnx.ModelProto, name: str) -> np.ndarray:
    return next(onnx.numpy_helper.to_array(i) for i in onx.graph.initializer if i.name == name)


def _dq_of(onx: onnx.ModelProto, startswith: str) -> onnx.NodeProto:
    return next(
        n
        for n in onx.graph.node
        if n.op_type == "DequantizeLinear" and n.input[0].startswith(startswith)
    )


def _plant_scale_x2(onx: onnx.ModelProto) -> str:
    """The scale of the second layer's weight DequantizeLinear, doubled."""
    dq = _dq_of(onx, "fc2.weight" if "fc2" in str(onx.graph.node) else "c2.weight")
    dq.input[1] = _new_init(onx, "planted_scale", _init(onx, dq.input[1]) * 2)
    return dq.name


def _plant_dynamic_scale_x2(onx: onnx.ModelProto) -> str:
    """The scale of the second integer product's weight (``quantize_dynamic``: it only
    meets the product, through the Mul of the two scales), doubled; the product's name."""
    product = [n for n in onx.graph.node if n.op_type in ("MatMulInteger", "ConvInteger")][1]
    scale = product.input[1].replace("_quantized", "_scale")
    planted = _new_init(onx, "planted_scale", _init(onx, scale) * 2)
    for node in onx.graph.node:
        node.input[:] = [planted if i == scale else i for i in node.input]
    return product.name


def _plant_zero_point(onx: onnx.ModelProto) -> str:
    """The zero point of the first activation DequantizeLinear (not the QuantizeLinear's
    it shares), +10."""
    dq = _dq_of(onx, "relu_QuantizeLinear")
    zp = _init(onx, dq.input[2])
    dq.input[2] = _new_init(onx, "planted_zp", (zp.astype(np.int32) + 10).astype(zp.dtype))
    return dq.name


def _plant_sub(onx: onnx.ModelProto) -> str:
    """The first float Add (a bias, or the residual) computes Sub."""
    node = next(n for n in onx.graph.node if n.op_type == "Add")
    node.op_type = "Sub"
    return node.name


def _plant_leaky_relu(onx: onnx.ModelProto) -> str:
    """The first Relu (a float node between quantized ones) leaks 2% of its negatives: a
    small error, above the noise floor in SQNR, but made where nothing is quantized."""
    node = next(n for n in onx.graph.node if n.op_type == "Relu")
    node.op_type = "LeakyRelu"
    node.attribute.append(onnx.helper.make_attribute("alpha", 0.02))
    return node.name


@pytest.mark.parametrize(
    ("name", "mode", "plant"),
    [
        ("mlp", "static", _plant_scale_x2),
        ("cnn", "static", _plant_scale_x2),
        ("mlp", "static", _plant_zero_point),
        ("cnn", "static", _plant_zero_point),
        ("cnn", "static", _plant_sub),
        ("mlp", "dynamic", _plant_sub),
        ("mlp", "dynamic", _plant_leaky_relu),
        ("mlp", "dynamic", _plant_dynamic_scale_x2),
        ("cnn", "dynamic", _plant_dynamic_scale_x2),
    ],
    ids=[
        "mlp-scale",
        "cnn-scale",
        "mlp-zp",
        "cnn-zp",
        "cnn-sub",
        "mlp-dynamic-sub",
        "mlp-leaky",
        "mlp-dynamic-scale",
        "cnn-dynamic-scale",
    ],
)
def test_planted_fault_named(name, mode, plant, tmp):
    onx = onnx.ModelProto()
    onx.CopyFrom(_quantized(name, mode, tmp))
    planted = plant(onx)
    recs, s = _run(name, onx)
    text = s.to_text()
    assert s.verdict == "fail" and s.culprit is not None, text
    c = s.culprit
    paired = {r.onnx_name for r in recs if r.status in _COMPARED and r.onnx_name != c.onnx_name}
    lowering = upstream_nodes(onx, c.onnx_name, paired) | set(c.onnx_nodes)
    # or the float view of the planted node's weight (pairing/float_views.py)
    assert planted in lowering or f"{planted}/weight_float_view" in lowering, (
        planted,
        sorted(lowering),
        text,
    )
    assert c.status == STATUS_FAIL and c.err_snr is not None, text
    if plant is not _plant_leaky_relu:
        assert c.err_snr < 20, text  # far below the noise floor


def test_pairs_through_the_quantization_nodes(tmp):
    """QDQ: a value the model only quantizes pairs with its DequantizeLinear output (a
    Relu folded into the QuantizeLinear's range has no other twin), a parameter with its
    quantized weight's DequantizeLinear; no pair holds a quantized weight, scale or zero
    point (a size alone once paired a per-channel scale with a bias)."""
    onx = _quantized("cnn", "static", tmp)
    recs, _ = _run("cnn", onx)
    by_fx = {r.ep_name: r for r in recs if r.status in _COMPARED}
    assert by_fx["relu"].onnx_name == "relu_DequantizeLinear_Output"
    assert by_fx["relu"].paired_by == PAIRED_BY_DEQUANTIZED
    assert by_fx["conv2d"].onnx_op_type == "Conv"  # its output, renamed relu, before the Q
    assert by_fx["p_c1_weight"].onnx_name == "c1.weight_DequantizeLinear_Output"
    assert by_fx["p_c1_bias"].onnx_op_type == "DequantizeLinear"
    quant_inits = {
        i
        for n in onx.graph.node
        if n.op_type in QUANT_OPS
        for i in n.input
        if i in {t.name for t in onx.graph.initializer}
    }
    assert not quant_inits & {r.onnx_name for r in recs if r.status in _COMPARED}
    # dynamic: the MatMulInteger chain's float output is the linear's value
    dyn, _ = _run("mlp", _quantized("mlp", "dynamic", tmp))
    assert {r.ep_name for r in dyn if r.status == STATUS_QUANTIZATION_NOISE} >= {"linear"}


def test_bits_and_the_floor(tmp):
    assert quantization_bits(_quantized("mlp", "dynamic", tmp).graph) == 8
    assert quantization_bits(_quantized("cnn", "static", tmp).graph) == 8
    assert quantization_bits(_float("mlp")[1].graph) is None
    assert noise_floor(8) == pytest.approx(20.16)
    # a float reference: the candidate's bits; a reference that quantizes too: no noise
    quantized = _quantized("cnn", "static", tmp)
    assert noise_bits(quantized.graph, object()) == 8
    both = type("OnnxReference", (), {"model": quantized})()
    assert noise_bits(quantized.graph, both) is None


def test_the_rule_against_the_floor():
    """The rule alone: a failing value above the floor is noise, its own rerun below it
    keeps it a failure, and a value below the floor stays one."""
    from onnx_sbs_nb.align.judge.context import RuleContext
    from onnx_sbs_nb.records import Record

    rule, ctx = QuantizationNoise(), RuleContext(quant_bits=8, quantized={"v"})
    ctx.name = "v"

    def judged(snr: float, passed2: bool | None, own_snr: float | None) -> str:
        rec = Record(step=0, status=STATUS_FAIL, err_snr=snr, passed2=passed2)
        ctx.own_snr = own_snr
        rule.judge(rec, None, None, ctx)
        return rec.status

    assert judged(35.0, None, None) == STATUS_QUANTIZATION_NOISE
    assert judged(35.0, True, None) == STATUS_QUANTIZATION_NOISE  # inherits noise
    assert judged(35.0, False, 30.0) == STATUS_QUANTIZATION_NOISE
    assert judged(35.0, False, 6.0) == STATUS_FAIL  # its own error is beyond the noise
    assert judged(12.0, True, None) == STATUS_FAIL
    ctx.name = "a_float_node"  # its rerun quantizes nothing: an own error is its own
    assert judged(35.0, False, 30.0) == STATUS_FAIL
    assert judged(35.0, True, None) == STATUS_QUANTIZATION_NOISE
    ctx.name = "v"
    assert judged(float("nan"), None, None) == STATUS_FAIL
    assert not rule.applies(None, RuleContext())  # a float model: never noise
    # an own error over the value's floor but under the own rerun's (6.02·b − 20: one
    # quantization, no accumulation): a zero point 10 steps off on a narrow value
    assert own_noise_floor(8) == pytest.approx(28.16)
    assert judged(30.0, False, 25.0) == STATUS_FAIL


def test_amplified_noise_of_noisy_sources():
    """Under the floor, a value whose own error is noise and whose rerun's sources are
    noise amplifies their noise (cos of a quantized timestep): noise, said so; with a
    failing source, or its sources unknown, it stays a failure."""
    from onnx_sbs_nb.align.judge.context import RuleContext
    from onnx_sbs_nb.records import Record

    rule = QuantizationNoise()
    ctx = RuleContext(quant_bits=8, quantized={"v"}, rerun_sources={"v": frozenset({"t"})})
    ctx.name = "v"

    def judged(passed2: bool | None, own_snr: float | None) -> Record:
        rec = Record(step=0, status=STATUS_FAIL, err_snr=3.5, passed2=passed2)
        ctx.own_snr = own_snr
        rule.judge(rec, None, None, ctx)
        return rec

    rec = judged(False, 45.0)
    assert rec.status == STATUS_QUANTIZATION_NOISE and "amplified" in rec.comment
    assert judged(True, None).status == STATUS_QUANTIZATION_NOISE
    assert judged(None, None).status == STATUS_FAIL  # no rerun: nothing to tell by
    assert judged(False, 20.0).status == STATUS_FAIL  # its own error is a fault's
    ctx.failing = {"t"}
    assert judged(False, 45.0).status == STATUS_FAIL  # it inherits a fault
    ctx.failing, ctx.name = set(), "w"
    assert judged(True, None).status == STATUS_FAIL  # sources unknown


def test_rerun_sources_walk_through_unpaired_values():
    import onnx.helper as oh

    graph = oh.make_graph(
        [
            oh.make_node("Relu", ["x"], ["a"]),
            oh.make_node("Neg", ["a"], ["b"]),
            oh.make_node("Add", ["b", "w"], ["c"]),
            oh.make_node("Mul", ["c", "x"], ["d"]),
        ],
        "g",
        [],
        [],
    )
    found = rerun_sources(graph, {"x", "c", "d"})
    assert found == {"c": frozenset({"x"}), "d": frozenset({"c", "x"})}


def test_qoperator_integer_values_are_no_twins(tmp):
    """QOperator (QLinearConv, an int8 Reshape between them): an integer value is the
    quantized form of a float torch value, not that value: no pair, no dtype mismatch
    named as a fault; what is compared (the dequantized output) is noise."""
    recs, s = _run("cnn", _quantized("cnn", "static", tmp, "QOperator"))
    assert s.verdict != "fail" and s.culprit is None, s.to_text()
    assert not [r for r in recs if r.failed], s.to_text()
    out = next(r for r in recs if r.kind == "output")
    assert out.status == STATUS_QUANTIZATION_NOISE and out.err_snr > 20


def test_many_inputs_keep_the_noise_apart(tmp):
    """Over several inputs, a faithful quantization still fails nothing and names no
    culprit; each pair keeps its status and SQNR."""
    from onnx_sbs_nb import aligned_over_inputs

    ep, _ = _float("mlp")
    onx = _quantized("mlp", "static", tmp)
    recs = list(aligned_over_inputs(ep, onx, [(x,) for x in _inputs("mlp")[:3]], own_error=True))
    s = summarize(recs)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    noisy = [r for r in recs if r.status == STATUS_QUANTIZATION_NOISE]
    assert noisy and all(r.inputs_failing == 0 for r in noisy), [r.ep_name for r in noisy]


def test_dynamic_quantizer_nodes_join_their_linear(tmp):
    """Trial finding 12: the nodes quantize_dynamic adds for fc2 (DynamicQuantizeLinear of
    its input, MatMulInteger, the Cast, the scale Muls) only feed fc2's linear: they are in
    its lowering, and a fault in its bias Add is not said to be maybe in "the lowering of
    relu" (the previous layer's activation, where nothing differs)."""
    onx = onnx.ModelProto()
    onx.CopyFrom(_quantized("mlp", "dynamic", tmp))
    add = [n for n in onx.graph.node if n.op_type == "Add"][1]  # fc2's bias
    add.op_type = "Sub"
    recs, s = _run("mlp", onx)
    text = s.to_text()
    c = s.culprit
    assert s.verdict == "fail" and c is not None and c.onnx_name == add.output[0], text
    ops = {n.name: n.op_type for n in onx.graph.node}
    held = {ops.get(n) for n in c.onnx_nodes}
    assert {"DynamicQuantizeLinear", "MatMulInteger", "Cast", "Mul", "Sub"} <= held, text
    assert "lowering of relu" not in text and "it makes the error" in text, text


def test_saturation_is_named_at_the_clipping_pair(tmp):
    """Trial finding 11: a faithful QDQ model run on inputs 4x beyond its calibration: the
    input's QuantizeLinear clips a third of x.  The input's DequantizeLinear output is
    paired with x, so the QDQ pair is the culprit (not fc1's exact float Gemm), and the why
    says which node clips how much to which range."""
    onx = _quantized("mlp", "static", tmp)
    ep, _ = _float("mlp")
    x = _inputs("mlp")[1] * 4
    recs = list(run_aligned(ep, onx, (x,), own_error=True))
    s = summarize(recs)
    text = s.to_text()
    x_name = onx.graph.input[0].name
    q = next(n for n in onx.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == x_name)
    dq = next(
        n for n in onx.graph.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]
    )
    rec = next(r for r in recs if r.onnx_name == dq.output[0])
    assert rec.ep_name == x_name and rec.status == STATUS_FAIL, text
    c = s.culprit
    assert c is not None and c.onnx_name == dq.output[0], text
    assert (
        f"{q.name} clips " in c.why
        and f"% of {x_name}'s elements to its calibrated range [" in c.why
    )
    assert "recalibrate on inputs like these" in c.why, text
    # the calibrated inputs clip nothing: the model passes there, with no word of clipping
    s = summarize(run_aligned(ep, onx, (_inputs("mlp")[1],), own_error=True))
    assert s.verdict != "fail" and "clips" not in s.to_text(), s.to_text()


def test_rerun_through_an_unpaired_input_qdq_says_so(tmp):
    """Trial finding 11 (c): where a graph input's DequantizeLinear output has no torch twin
    (a debug tap makes x read twice, so it is not paired), fc1's Gemm is rerun through the
    input's QDQ pair, and its why must not claim a clean rerun on torch's inputs."""
    onx = onnx.ModelProto()
    onx.CopyFrom(_quantized("mlp", "static", tmp))
    x = onx.graph.input[0]
    onx.graph.node.append(onnx.helper.make_node("Identity", [x.name], ["x_seen"], name="tap"))
    tap = onnx.ValueInfoProto()
    tap.CopyFrom(x)
    tap.name = "x_seen"
    onx.graph.output.append(tap)
    ep, _ = _float("mlp")
    s = summarize(run_aligned(ep, onx, (_inputs("mlp")[1] * 4,), own_error=True))
    text = s.to_text()
    c = s.culprit
    assert c is not None and c.record.onnx_op_type == "Gemm", text
    assert "recomputed through the lowering of x_DequantizeLinear" in c.why, text
    assert "it makes the error, it does not inherit it" not in c.why, text
