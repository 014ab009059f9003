"""Float views of a quantized model's integer values (pairing/float_views.py): onnxruntime's
real ``quantize_dynamic`` (per tensor and per channel) and ``MatMulNBitsQuantizer`` (int4,
blocked, with and without zero points) of the MLP and CNN of the quantized-models tests.
An integer weight dequantized with the model's own scale and zero point pairs with the
torch weight; a ``DynamicQuantizeLinear``'s output dequantized pairs with the activation it
quantizes; a faithful int4 model is quantization noise over the 12 dB floor, a doubled
MatMulNBits scale is named at that node's weight.
"""

from __future__ import annotations

import functools
import logging
import warnings

import numpy as np
import onnx
import onnx.numpy_helper
import pytest

from onnx_sbs_nb.align.judge.quantization_noise import MIN_FLOOR_DB, noise_floor
from onnx_sbs_nb.align.pairing.float_view_nodes import FLOAT_VIEW, view_kind, view_name
from onnx_sbs_nb.align.pairing.float_views import with_float_views
from onnx_sbs_nb.align.pairing.rules import PAIRED_BY_DEQUANTIZED
from onnx_sbs_nb.align.pairing.values import TRANSFORM_TRANSPOSE
from onnx_sbs_nb.records import STATUS_FAIL, STATUS_QUANTIZATION_NOISE

from ..judge.test_quantized_models import _COMPARED, _compared, _float, _inputs, _quantized, _run

q = pytest.importorskip("onnxruntime.quantization")
nbits = pytest.importorskip("onnxruntime.quantization.matmul_nbits_quantizer")

WEIGHTS = {
    "mlp": ["p_fc1_weight", "p_fc2_weight", "p_fc3_weight"],
    "cnn": ["p_c1_weight", "p_c2_weight", "p_fc_weight"],
    "mlp3d": ["p_fc1_weight", "p_fc2_weight", "p_fc3_weight"],
}


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("quantized_pairing"))


@functools.cache
def _per_channel(tmp: str) -> onnx.ModelProto:
    """The MLP's ``quantize_dynamic(per_channel=True)``: a scale and zero point per output
    column of each ``[K, N]`` integer weight."""
    _, onx = _float("mlp")
    src, out = f"{tmp}/mlp_pc.onnx", f"{tmp}/mlp_pc_dynamic.onnx"
    onnx.save(onx, src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        q.quantize_dynamic(src, out, per_channel=True)
    return onnx.load(out)


@functools.cache
def _int4(symmetric: bool) -> onnx.ModelProto:
    """The MLP on ``(batch, seq, features)`` inputs (the exporter lowers its linears to
    MatMul, which the quantizer knows) quantized to int4 weight-only, blocks of 32."""
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    model = onnx.ModelProto()
    model.CopyFrom(_float("mlp3d")[1])  # the quantizer rewrites the model it is given
    quantizer = nbits.MatMulNBitsQuantizer(model, block_size=32, is_symmetric=symmetric)
    quantizer.process()
    model = quantizer.model.model
    assert [n.op_type for n in model.graph.node].count("MatMulNBits") == 3
    return model


def _weights(recs, name: str) -> dict:
    by = {r.ep_name: r for r in recs if r.status in _COMPARED and r.ep_name in WEIGHTS[name]}
    assert sorted(by) == sorted(WEIGHTS[name]), sorted(by)
    return by


@pytest.mark.parametrize("name", ["mlp", "cnn", "mlp-per-channel"])
def test_dynamic_integer_weights_pair_through_their_float_view(name, tmp):
    """Each MatMulInteger / ConvInteger weight pairs, dequantized by its view, with the
    torch weight (a linear's through the transposition the MatMul multiplies by): about
    48 dB at 8 bits, noise; each quantized activation pairs a second time, as the next
    node computes on it."""
    onx = _per_channel(tmp) if name == "mlp-per-channel" else _quantized(name, "dynamic", tmp)
    model = name.split("-")[0]
    recs, s = _run(model, onx)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    for r in _weights(recs, model).values():
        assert r.onnx_op_type == "DequantizeLinear" and r.paired_by == PAIRED_BY_DEQUANTIZED
        assert r.onnx_name.endswith("_float_view")
        assert r.status == STATUS_QUANTIZATION_NOISE and r.err_snr > 40, r
    activations = [r for r in recs if r.onnx_name and r.onnx_name.endswith("_quantized_float_view")]
    assert {r.ep_name for r in activations} >= {"relu"}
    assert all(r.status == STATUS_QUANTIZATION_NOISE and r.err_snr > 30 for r in activations)
    # the program input's view pairs with nothing: none is made
    assert not any(r.onnx_name == "x_quantized_float_view" for r in recs)
    viewed = with_float_views(onx)
    views = {n.output[0]: n for n in viewed.graph.node if view_kind(n) == "weight"}
    if name == "mlp-per-channel":
        assert all(n.attribute[0].name == "axis" and n.attribute[0].i == 1 for n in views.values())
    else:
        assert all(not n.attribute for n in views.values())
    if model == "mlp":
        fc1 = views[view_name("fc1.weight_Transposed_quantized")]
        assert fc1.name == "node_linear_MatMul_quant/weight_float_view"


def test_views_leave_the_users_model_alone(tmp):
    """The views go into a copy, read by no node; a float model comes back as it is."""
    onx = _quantized("cnn", "dynamic", tmp)
    before = onx.SerializeToString()
    viewed = with_float_views(onx)
    assert onx.SerializeToString() == before and viewed is not onx
    views = [n for n in viewed.graph.node if any(p.key == FLOAT_VIEW for p in n.metadata_props)]
    assert len(views) == 3 + 2  # the three weights, relu and view (x is a program input)
    read = {i for n in viewed.graph.node for i in n.input}
    assert not read & {n.output[0] for n in views}
    float_model = _float("cnn")[1]
    assert with_float_views(float_model) is float_model
    # the weight views in float are the weights onnxruntime multiplies by
    import onnxruntime as ort

    wanted = [n.output[0] for n in views if view_kind(n) == "weight"]
    out = onnx.ModelProto()
    out.CopyFrom(viewed)
    out.graph.output.extend(onnx.helper.make_empty_tensor_value_info(w) for w in wanted)
    sess = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(wanted, {"x": _inputs("cnn")[0].numpy()})
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in onx.graph.initializer}
    w = inits["c1.weight_quantized"].astype(np.float32) - inits["c1.weight_zero_point"]
    np.testing.assert_allclose(got[0], w * inits["c1.weight_scale"], rtol=1e-6)


@pytest.mark.parametrize("symmetric", [False, True], ids=["zero_points", "symmetric"])
def test_int4_weight_only_is_noise_and_pairs_its_weights(symmetric):
    """MatMulNBits (int4, blocks of 32): every weight, dequantized by onnxruntime's own
    MatMulNBits on the identity, pairs with the torch weight at about 24 dB; a faithful
    model passes as quantization noise over the 12 dB floor, with every pair of the float
    export compared."""
    assert noise_floor(4) == MIN_FLOOR_DB
    recs, s = _run("mlp3d", _int4(symmetric))
    text = s.to_text()
    assert s.verdict == "pass" and s.culprit is None, text
    assert "quantization noise" in text
    for r in _weights(recs, "mlp3d").values():
        assert r.onnx_op_type == "MatMulNBits" and r.paired_by == PAIRED_BY_DEQUANTIZED
        assert r.status == STATUS_QUANTIZATION_NOISE and 18 < r.err_snr < 35, r
    noisy = [r for r in recs if r.status == STATUS_QUANTIZATION_NOISE]
    assert all(r.err_snr > MIN_FLOOR_DB for r in noisy)
    float_recs, _ = _run("mlp3d", _float("mlp3d")[1])
    share = len(_compared(recs) & _compared(float_recs)) / len(_compared(float_recs))
    print(f"mlp3d int4: {share:.0%} of the float export's pairs compared")
    assert share >= 0.95


def test_the_weight_view_pairs_through_the_transposition():
    """MatMulNBits multiplies by ``[K, N]``; the linear's weight is ``[N, K]``."""
    from onnx_sbs_nb.align.pairing.names import pair_values

    ep, _ = _float("mlp3d")
    viewed = with_float_views(_int4(False))
    weights = {s.arg.name: s.target for s in ep.graph_signature.input_specs if s.target is not None}
    pairing = pair_values(ep.graph, viewed, weights, ["x"])
    pair = pairing.by_fx["p_fc2_weight"][0]
    assert pair.onnx_name.endswith("_float_view") and pair.transform == TRANSFORM_TRANSPOSE


def test_int4_doubled_scale_is_named_at_its_node():
    """A MatMulNBits scales initializer x2: that node's weight view is the culprit, far
    below the int4 floor; the values after it fail, inherited."""
    onx = onnx.ModelProto()
    onx.CopyFrom(_int4(False))
    node = [n for n in onx.graph.node if n.op_type == "MatMulNBits"][1]
    scales = next(i for i in onx.graph.initializer if i.name == node.input[2])
    doubled = onnx.numpy_helper.to_array(scales) * 2
    scales.CopyFrom(onnx.numpy_helper.from_array(doubled, scales.name))
    recs, s = _run("mlp3d", onx)
    text = s.to_text()
    assert s.verdict == "fail" and s.culprit is not None, text
    c = s.culprit
    assert c.onnx_nodes == [f"{node.name}/weight_float_view"], text
    assert c.ep_name == "p_fc2_weight" and c.status == STATUS_FAIL, text
    assert c.err_snr < MIN_FLOOR_DB, text
    assert node.name in text


@pytest.mark.parametrize("name", ["cnn", "mlp", "mlp3d"])
def test_qoperator_internals_are_compared(name, tmp):
    """QOperator: each QLinear node's integer output, dequantized with its own output
    scale and zero point, pairs with the torch activation (the Relu the quantizer folded
    into the output range, for a Conv or Gemm before one), each integer weight and int32
    bias with the torch parameter; a faithful model is noise throughout.  Of the float
    export's pairs only the values before a folded Relu stay uncompared (the model never
    computes them): 8% compared without the views (the output alone).  ``mlp3d``: a
    QLinearMatMul, whose bias a QLinearAdd adds as an int8 operand of its own."""
    recs, s = _run(name, _quantized(name, "static", tmp, "QOperator"))
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    by = {r.ep_name: r for r in recs if r.status in _COMPARED}
    assert by["relu"].onnx_op_type == "DequantizeLinear"
    assert by["relu"].onnx_name.endswith("_quantized_float_view")
    assert by["relu"].status == STATUS_QUANTIZATION_NOISE and by["relu"].err_snr > 30
    _weights(recs, name)
    biases = [r for k, r in by.items() if k.endswith("_bias")]
    assert len(biases) == 3 and all(r.err_snr > 40 for r in biases), biases
    float_recs, _ = _run(name, _float(name)[1])
    share = len(_compared(recs) & _compared(float_recs)) / len(_compared(float_recs))
    print(f"{name} QOperator: {share:.0%} of the float export's pairs compared")
    assert share >= 0.8, sorted(_compared(float_recs) - _compared(recs))


def test_qoperator_doubled_weight_scale_is_named(tmp):
    """A QLinearConv's weight scales x2: that node's weight view is the culprit."""
    onx = onnx.ModelProto()
    onx.CopyFrom(_quantized("cnn", "static", tmp, "QOperator"))
    node = [n for n in onx.graph.node if n.op_type == "QLinearConv"][1]
    scales = next(i for i in onx.graph.initializer if i.name == node.input[4])
    doubled = onnx.numpy_helper.to_array(scales) * 2
    scales.CopyFrom(onnx.numpy_helper.from_array(doubled, scales.name))
    recs, s = _run("cnn", onx)
    text = s.to_text()
    assert s.verdict == "fail" and s.culprit is not None, text
    assert s.culprit.onnx_nodes == [f"{node.name}/weight_float_view"], text
    assert s.culprit.ep_name == "p_c2_weight" and s.culprit.err_snr < 12, text


@pytest.mark.slow
def test_int4_tiny_llama_pairs_every_projection_and_names_a_doubled_scale():
    """The corpus' tiny Llama (one layer) quantized int4 weight-only: every projection's
    weight and the LM head pair through their MatMulNBits views at about 22 dB, the model
    passes as quantization noise; a doubled scale of the down projection is named there."""
    pytest.importorskip("transformers")
    import torch
    import transformers

    from ...corpus.zoo_kv_cache_and_popular_exports import _llama_config, _Logits
    from ...models import export

    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(_llama_config(1, use_cache=False))
    model = _Logits(llama, "input_ids").eval()
    args = (torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(0)),)
    ep, onx = export(model, args)
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(onx)  # the quantizer rewrites the model it is given
    quantizer = nbits.MatMulNBitsQuantizer(model_copy, block_size=32, is_symmetric=False)
    quantizer.process()
    quantized = quantizer.model.model
    from onnx_sbs_nb.align.blame.summary import summarize
    from onnx_sbs_nb.align.run import run_aligned

    recs = list(run_aligned(ep, quantized, args, own_error=True))
    s = summarize(recs)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    views = [r for r in recs if r.onnx_op_type == "MatMulNBits" and r.ep_name]
    views = [r for r in views if r.onnx_name.endswith("_float_view")]
    assert len(views) == 8, [r.ep_name for r in views]  # q k v o gate up down, lm_head
    assert all(r.status == STATUS_QUANTIZATION_NOISE and 18 < r.err_snr < 30 for r in views)
    down = next(r for r in views if "down_proj" in r.ep_name)
    weight = down.onnx_name.removesuffix("_float_view")
    node = next(
        n for n in quantized.graph.node if n.op_type == "MatMulNBits" and n.input[1] == weight
    )
    scales = next(i for i in quantized.graph.initializer if i.name == node.input[2])
    scales.CopyFrom(
        onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(scales) * 2, scales.name)
    )
    s = summarize(list(run_aligned(ep, quantized, args, own_error=True)))
    assert s.verdict == "fail" and s.culprit is not None, s.to_text()
    assert s.culprit.onnx_nodes == [f"{node.name}/weight_float_view"], s.to_text()
    assert s.culprit.ep_name == down.ep_name, s.to_text()


def test_a_large_matmul_nbits_weight_gets_no_view():
    """A weight whose product with the identity costs more than NBITS_VIEW_MAX_MACS gets
    no view (its error shows in the node's output); a small one does."""
    from onnx import TensorProto as TP
    from onnx import helper as h

    from onnx_sbs_nb.align.pairing.float_views import NBITS_VIEW_MAX_MACS

    def model(k: int, n: int) -> onnx.ModelProto:
        blocks = k // 32
        inits = [
            onnx.numpy_helper.from_array(np.zeros((n, blocks, 16), np.uint8), "b"),
            onnx.numpy_helper.from_array(np.ones((n * blocks,), np.float32), "s"),
        ]
        node = h.make_node(
            "MatMulNBits", ["x", "b", "s"], ["y"], "mm", domain="com.microsoft",
            K=k, N=n, bits=4, block_size=32,
        )  # fmt: skip
        graph = h.make_graph(
            [node],
            "g",
            [h.make_tensor_value_info("x", TP.FLOAT, [1, k])],
            [h.make_tensor_value_info("y", TP.FLOAT, [1, n])],
            initializer=inits,
        )
        opsets = [h.make_opsetid("", 20), h.make_opsetid("com.microsoft", 1)]
        return h.make_model(graph, opset_imports=opsets)

    assert 4096 * 4096 * 256 > NBITS_VIEW_MAX_MACS
    big = model(4096, 256)
    assert with_float_views(big) is big
    small = with_float_views(model(64, 8))
    assert [view_kind(n) for n in small.graph.node] == ["helper", "helper", "weight", None]


def test_views_survive_onnxruntime_optimizations(tmp):
    """With ``optimize="all"`` onnxruntime rewrites the products (MatMulIntegerToFloat,
    DynamicQuantizeMatMul); the views stay, and the square fc2 weight still pairs through
    the transposition its view records (not the rewritten product's op type)."""
    from onnx_sbs_nb.align.blame.summary import summarize
    from onnx_sbs_nb.align.run import run_aligned

    ep, _ = _float("mlp")
    onx = _quantized("mlp", "dynamic", tmp)
    recs = list(run_aligned(ep, onx, (_inputs("mlp")[0],), own_error=True, optimize="all"))
    s = summarize(recs)
    assert s.verdict == "pass" and s.culprit is None, s.to_text()
    fc2 = next(r for r in recs if r.ep_name == "p_fc2_weight")
    assert fc2.onnx_name.endswith("_float_view") and fc2.status == STATUS_QUANTIZATION_NOISE
