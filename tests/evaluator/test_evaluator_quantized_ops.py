"""Quantized operators in the torch evaluator against onnxruntime on CPU, node by node:
QLinearMatMul, QLinearConv, MatMulInteger, ConvInteger, DynamicQuantizeLinear (ai.onnx),
and onnxruntime's com.microsoft QLinearAdd, QLinearMul, QLinearSigmoid,
QLinearLeakyRelu, QLinearSoftmax, QLinearConcat, QGemm, MatMulIntegerToFloat,
DynamicQuantizeMatMul, QuantizeLinear / DequantizeLinear,
QLinearAveragePool, QLinearGlobalAveragePool, QLinearWhere, QAttention,
QEmbedLayerNormalization.

Quantized outputs must be the same codes (the kernels follow onnxruntime's rounding
order); float outputs agree to a few float32 ulps.  onnxruntime runs with its graph
optimizations off, so it computes the graph as given."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper

from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator

MS = "com.microsoft"
PAIRS = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]
PAIR_IDS = ["u8u8", "u8s8", "s8s8"]


def _f(name: str, v) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, dtype=np.float32), name)


def _z(name: str, v, dtype) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, dtype=dtype), name)


def _elem(dtype) -> int:
    return onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def _both(nodes, inits, feeds: dict, out_type: int) -> tuple[np.ndarray, np.ndarray]:
    """(torch evaluator, onnxruntime) outputs of a one-output graph."""
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info(k, _elem(v.dtype), v.shape) for k, v in feeds.items()],
        [h.make_tensor_value_info("y", out_type, None)],
        initializer=inits,
    )
    opsets = [h.make_opsetid("", 17), h.make_opsetid(MS, 1)]
    model = h.make_model(graph, opset_imports=opsets, ir_version=9)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    exp = sess.run(None, feeds)[0]
    got = TorchOnnxEvaluator(model).run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})
    got = got[0].numpy()
    assert got.dtype == exp.dtype and got.shape == exp.shape, (got.dtype, exp.dtype)
    return got, exp


def _codes(rng, dtype, shape) -> np.ndarray:
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _zero_point(rng, dtype, shape=()):
    """A random zero point; 0 for int8 weights, as onnxruntime requires of them."""
    if dtype == np.int8:
        return np.zeros(shape, dtype=np.int64)
    return rng.integers(0, 256, shape)


def _params(rng, n: int, per_channel: bool):
    sa = np.float32(rng.random() * 0.05 + 0.001)
    sb = (rng.random(n if per_channel else ()) * 0.05 + 0.001).astype(np.float32)
    sy = np.float32(rng.random() * 2 + 0.5)
    return sa, sb, sy


@pytest.mark.parametrize("k", [200, 2000], ids=["k200", "k2000"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("adt, bdt", PAIRS, ids=PAIR_IDS)
def test_qlinear_matmul_and_conv_give_onnxruntime_codes(adt, bdt, per_channel, k):
    """k=2000: accumulators above 2**24, which onnxruntime rounds to float32."""
    rng = np.random.default_rng(k + per_channel)
    n = 16
    sa, sb, sy = _params(rng, n, per_channel)
    za, zy = rng.integers(*((0, 256) if adt == np.uint8 else (-128, 128)), 2)
    zb = _zero_point(rng, bdt, n if per_channel else ())
    common = [_f("sa", sa), _z("za", za, adt), _f("sb", sb), _z("zb", zb, bdt)]
    common += [_f("sy", sy), _z("zy", zy, adt)]
    a = _codes(rng, adt, (2, 3, k))
    b = _z("b", _codes(rng, bdt, (k, n)), bdt)
    node = h.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    got, exp = _both([node], [*common, b], {"a": a}, _elem(adt))
    np.testing.assert_array_equal(got, exp)

    x = _codes(rng, adt, (2, 8, 9, 9))
    w = _z("w", _codes(rng, bdt, (n, 8, 3, 3)), bdt)
    bias = _z("bias", rng.integers(-5000, 5000, (n,)), np.int32)
    node = h.make_node(
        "QLinearConv", ["x", "sa", "za", "w", "sb", "zb", "sy", "zy", "bias"], ["y"], pads=[1] * 4
    )
    got, exp = _both([node], [*common, w, bias], {"x": x}, _elem(adt))
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("adt, bdt", PAIRS, ids=PAIR_IDS)
def test_matmul_integer_and_conv_integer_give_onnxruntime_integers(adt, bdt):
    rng = np.random.default_rng(5)
    a = _codes(rng, adt, (2, 5, 64))
    b = _z("b", _codes(rng, bdt, (64, 7)), bdt)
    za, zb = _z("za", 3, adt), _z("zb", _zero_point(rng, bdt, (7,)), bdt)
    node = h.make_node("MatMulInteger", ["a", "b", "za", "zb"], ["y"])
    got, exp = _both([node], [b, za, zb], {"a": a}, TP.INT32)
    np.testing.assert_array_equal(got, exp)

    x = _codes(rng, adt, (1, 4, 6, 6))
    w = _z("w", _codes(rng, bdt, (5, 4, 3, 3)), bdt)
    wz = _z("wz", _zero_point(rng, bdt), bdt)
    node = h.make_node("ConvInteger", ["x", "w", "za", "wz"], ["y"], strides=[2, 2])
    got, exp = _both([node], [w, za, wz], {"x": x}, TP.INT32)
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("values", ["random", "zeros", "positive"])
def test_dynamic_quantize_linear_gives_onnxruntime_codes_and_parameters(values):
    """Zeros only: no range, onnxruntime's scale is 1."""
    rng = np.random.default_rng(6)
    x = (rng.standard_normal((4, 33)) * 3 + 1).astype(np.float32)
    x = {"random": x, "zeros": np.zeros_like(x), "positive": np.abs(x) + 1}[values]
    for out in ("q", "s", "z"):
        node = h.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"])
        ident = h.make_node("Identity", [out], ["y"])
        elem = TP.FLOAT if out == "s" else TP.UINT8
        got, exp = _both([node, ident], [], {"x": x}, elem)
        np.testing.assert_array_equal(got, exp)


BROADCASTS = [
    ((4, 33), (4, 33)),
    ((4, 33), (33,)),
    ((4, 33), (1,)),
    ((1,), (4, 33)),
    ((4, 33), (4, 1)),
]


@pytest.mark.parametrize("shapes", BROADCASTS, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qlinear_add_and_mul_give_onnxruntime_codes(op_type, dtype, shapes):
    rng = np.random.default_rng(7)
    a, b = _codes(rng, dtype, shapes[0]), _codes(rng, dtype, shapes[1])
    for _ in range(5):  # five sets of scales and zero points
        s = rng.random(3).astype(np.float32) * 0.1 + 0.001
        z = _codes(rng, dtype, 3)
        inits = [_f("sa", s[0]), _z("za", z[0], dtype), _f("sb", s[1]), _z("zb", z[1], dtype)]
        inits += [_f("sc", s[2]), _z("zc", z[2], dtype)]
        node = h.make_node(
            op_type, ["a", "sa", "za", "b", "sb", "zb", "sc", "zc"], ["y"], domain=MS
        )
        got, exp = _both([node], inits, {"a": a, "b": b}, _elem(dtype))
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize(
    "op_type, attrs", [("QLinearSigmoid", {}), ("QLinearLeakyRelu", {"alpha": 0.1})]
)
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qlinear_lookup_table_ops_give_onnxruntime_codes(op_type, attrs, dtype):
    rng = np.random.default_rng(8)
    x = _codes(rng, dtype, (3, 5, 40))
    for _ in range(5):
        s = rng.random(2).astype(np.float32) * 0.1 + 0.001
        z = _codes(rng, dtype, 2)
        inits = [_f("sx", s[0]), _z("zx", z[0], dtype), _f("sy", s[1]), _z("zy", z[1], dtype)]
        node = h.make_node(op_type, ["x", "sx", "zx", "sy", "zy"], ["y"], domain=MS, **attrs)
        got, exp = _both([node], inits, {"x": x}, _elem(dtype))
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("opset, axis", [(13, -1), (13, 1), (12, 1), (12, 2)])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qlinear_softmax_gives_onnxruntime_codes(dtype, opset, axis):
    """The output scale and zero point the quantizer gives a softmax (1/256, 0 or -128);
    opset 12 normalizes over every axis from ``axis`` on."""
    rng = np.random.default_rng(9)
    x = _codes(rng, dtype, (3, 5, 40))
    zy = 0 if dtype == np.uint8 else -128
    for _ in range(4):
        sx = np.float32(rng.random() * 0.2 + 0.01)
        inits = [_f("sx", sx), _z("zx", 0, dtype), _f("sy", 1 / 256), _z("zy", zy, dtype)]
        node = h.make_node(
            "QLinearSoftmax",
            ["x", "sx", "zx", "sy", "zy"],
            ["y"],
            domain=MS,
            axis=axis,
            opset=opset,
        )
        got, exp = _both([node], inits, {"x": x}, _elem(dtype))
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qlinear_concat_gives_onnxruntime_codes(dtype):
    """The first input shares the output's parameters (copied), the others are
    requantized."""
    rng = np.random.default_rng(10)
    x = _codes(rng, dtype, (2, 3, 4))
    for _ in range(3):
        s = rng.random(3).astype(np.float32) * 0.1 + 0.001
        z = _codes(rng, dtype, 3)
        inits = [_f("sy", s[0]), _z("zy", z[0], dtype), _f("s2", s[1]), _z("z2", z[1], dtype)]
        inits += [_f("s3", s[2]), _z("z3", z[2], dtype)]
        ins = ["sy", "zy", "x", "sy", "zy", "x", "s2", "z2", "x", "s3", "z3"]
        node = h.make_node("QLinearConcat", ins, ["y"], domain=MS, axis=1)
        got, exp = _both([node], inits, {"x": x}, _elem(dtype))
        np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("trans_b", [0, 1])
@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("adt, bdt", PAIRS, ids=PAIR_IDS)
def test_qgemm_gives_onnxruntime_codes_and_floats(adt, bdt, per_channel, trans_b):
    rng = np.random.default_rng(11)
    m, k, n = 6, 300, 16
    sa, sb, sy = _params(rng, n, per_channel)
    a = _codes(rng, adt, (m, k))
    b = _codes(rng, bdt, (n, k) if trans_b else (k, n))
    za, zy = _codes(rng, adt, 2)
    zb = _zero_point(rng, bdt, n if per_channel else ())
    inits = [_f("sa", sa), _z("za", za, adt), _z("b", b, bdt), _f("sb", sb), _z("zb", zb, bdt)]
    inits.append(_z("c", rng.integers(-20000, 20000, (n,)), np.int32))
    ins = ["a", "sa", "za", "b", "sb", "zb", "c"]
    kw = {"domain": MS, "transB": trans_b, "alpha": 0.5}
    node = h.make_node("QGemm", [*ins, "sy", "zy"], ["y"], **kw)
    got, exp = _both([node], [*inits, _f("sy", sy), _z("zy", zy, adt)], {"a": a}, _elem(adt))
    np.testing.assert_array_equal(got, exp)
    # without an output scale the output is float
    got, exp = _both([h.make_node("QGemm", ins, ["y"], **kw)], inits, {"a": a}, TP.FLOAT)
    np.testing.assert_allclose(got, exp, rtol=1e-6)


@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("bdt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_integer_matmuls_to_float_match_onnxruntime(bdt, per_channel):
    """MatMulIntegerToFloat and DynamicQuantizeMatMul, onnxruntime's fusions of
    quantize_dynamic's MatMulInteger chains."""
    rng = np.random.default_rng(12)
    k, n = 96, 16
    sa, sb, _ = _params(rng, n, per_channel)
    b = _z("b", _codes(rng, bdt, (k, n)), bdt)
    zb = _z("zb", _zero_point(rng, bdt, n if per_channel else ()), bdt)
    bias = _f("bias", rng.standard_normal(n))
    a = _codes(rng, np.uint8, (3, k))
    node = h.make_node(
        "MatMulIntegerToFloat", ["a", "b", "sa", "sb", "za", "zb", "bias"], ["y"], domain=MS
    )
    inits = [b, _f("sa", sa), _f("sb", sb), _z("za", 7, np.uint8), zb, bias]
    got, exp = _both([node], inits, {"a": a}, TP.FLOAT)
    np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-6)

    x = rng.standard_normal((3, k)).astype(np.float32)
    node = h.make_node("DynamicQuantizeMatMul", ["x", "b", "sb", "zb", "bias"], ["y"], domain=MS)
    got, exp = _both([node], [b, _f("sb", sb), zb, bias], {"x": x}, TP.FLOAT)
    np.testing.assert_allclose(got, exp, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.uint16, np.int16, np.uint8, np.int8])
@pytest.mark.parametrize("axis, shape", [(1, (4,)), (0, ())], ids=["axis", "tensor"])
def test_contrib_quantize_dequantize_match_onnxruntime(dtype, axis, shape):
    """The com.microsoft pair the QDQ quantizer writes for 16-bit types."""
    rng = np.random.default_rng(13)
    x = (rng.standard_normal((3, 4, 5)) * 50).astype(np.float32)
    s = (rng.random(shape) + 0.01).astype(np.float32)
    z = rng.integers(0, 100, shape)
    nodes = [
        h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], domain=MS, axis=axis),
        h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], domain=MS, axis=axis),
    ]
    got, exp = _both(nodes, [_f("s", s), _z("z", z, dtype)], {"x": x}, TP.FLOAT)
    np.testing.assert_array_equal(got, exp)


POOLS = [
    {"kernel_shape": [3, 3]},
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]},
    {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1},
    {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1},
]


@pytest.mark.parametrize("channels_last", [0, 1], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qlinear_average_pools_give_onnxruntime_codes(dtype, channels_last):
    rng = np.random.default_rng(14)
    x = _codes(rng, dtype, (2, 9, 8, 7) if channels_last else (2, 7, 9, 8))
    for _ in range(3):
        s = rng.random(2).astype(np.float32) * 0.1 + 0.001
        z = _codes(rng, dtype, 2)
        inits = [_f("sx", s[0]), _z("zx", z[0], dtype), _f("sy", s[1]), _z("zy", z[1], dtype)]
        ins = ["x", "sx", "zx", "sy", "zy"]
        kw = {"domain": MS, "channels_last": channels_last}
        node = h.make_node("QLinearGlobalAveragePool", ins, ["y"], **kw)
        got, exp = _both([node], inits, {"x": x}, _elem(dtype))
        np.testing.assert_array_equal(got, exp)
        for attrs in POOLS:
            node = h.make_node("QLinearAveragePool", ins, ["y"], **kw, **attrs)
            got, exp = _both([node], inits, {"x": x}, _elem(dtype))
            np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("unidirectional", [0, 1])
@pytest.mark.parametrize("mask", [False, True], ids=["no_mask", "mask_index"])
@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("wdt", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qattention_matches_onnxruntime(wdt, per_channel, mask, unidirectional):
    """quantize_dynamic's QAttention: an integer Q/K/V projection, then the attention
    in float32 (a few ulps from onnxruntime's summation order)."""
    rng = np.random.default_rng(15)
    batch, seq, hidden = 2, 5, 16
    cols = 3 * hidden if per_channel else ()
    x = _codes(rng, np.uint8, (batch, seq, hidden))
    inits = [
        _z("w", _codes(rng, wdt, (hidden, 3 * hidden)), wdt),
        _f("b", rng.standard_normal(3 * hidden)),
        _f("xs", 0.02),
        _f("ws", rng.random(cols) * 0.01 + 0.001),
        _z("xz", 120, np.uint8),
        _z("wz", _zero_point(rng, wdt, cols), wdt),
    ]
    feeds = {"x": x}
    if mask:
        feeds["m"] = np.array([5, 3], dtype=np.int32)  # the valid length of each sequence
    ins = ["x", "w", "b", "xs", "ws", "m" if mask else "", "xz", "wz"]
    node = h.make_node(
        "QAttention", ins, ["y"], domain=MS, num_heads=2, unidirectional=unidirectional
    )
    got, exp = _both([node], inits, feeds, TP.FLOAT)
    np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("y_scale", [1 / 128, 4.0], ids=["saturating", "fractions"])
def test_qlinear_matmul_to_float8_casts_the_rescaled_product(y_scale):
    """Opset 21's float8 QLinearMatMul (onnxruntime and the ONNX reference run none):
    against its definition, dequantize, multiply, divide by y_scale, cast saturating.
    Power-of-two scales keep every step exact."""
    import ml_dtypes

    from onnx_sbs_nb.convert import to_numpy, to_torch

    f8 = ml_dtypes.float8_e4m3fn
    rng = np.random.default_rng(16)
    a = (rng.standard_normal((3, 8)) * 4).astype(f8)
    b = (rng.standard_normal((8, 5)) * 4).astype(f8)
    zero = np.array(0, dtype=f8)
    inits = [_f("sa", 0.5), numpy_helper.from_array(zero, "za"), numpy_helper.from_array(b, "b")]
    inits += [_f("sb", 0.25), numpy_helper.from_array(zero, "zb"), _f("sy", y_scale)]
    inits.append(numpy_helper.from_array(zero, "zy"))
    node = h.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
    graph = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("a", TP.FLOAT8E4M3FN, a.shape)],
        [h.make_tensor_value_info("y", TP.FLOAT8E4M3FN, None)],
        initializer=inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)], ir_version=10)
    got = to_numpy(TorchOnnxEvaluator(model).run(None, {"a": to_torch(a)})[0])
    y = (a.astype(np.float32) * 0.5) @ (b.astype(np.float32) * 0.25) / np.float32(y_scale)
    exp = np.clip(y, -448, 448).astype(f8)
    assert got.dtype == exp.dtype
    np.testing.assert_array_equal(got.astype(np.float32), exp.astype(np.float32))
    if y_scale < 1:
        assert np.abs(y).max() > 448  # the saturation is exercised
    else:  # values off the integer grid, which an integer rounding would lose
        assert (exp.astype(np.float32) % 1 != 0).sum() > 3


@pytest.mark.parametrize("same", [False, True], ids=["requantized", "copied"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8], ids=["u8", "s8"])
def test_qlinear_where_gives_onnxruntime_codes(dtype, same):
    rng = np.random.default_rng(17)
    feeds = {
        "c": rng.random((3, 4)) > 0.5,
        "x": _codes(rng, dtype, (3, 4)),
        "w": _codes(rng, dtype, (4,)),
    }
    s = rng.random(3).astype(np.float32) * 0.1 + 0.001
    z = _codes(rng, dtype, 3)
    if same:  # x already on the output's scale and zero point
        s[2], z[2] = s[0], z[0]
    inits = [_f("xs", s[0]), _z("xz", z[0], dtype), _f("ys", s[1]), _z("yz", z[1], dtype)]
    inits += [_f("zs", s[2]), _z("zz", z[2], dtype)]
    ins = ["c", "x", "xs", "xz", "w", "ys", "yz", "zs", "zz"]
    node = h.make_node("QLinearWhere", ins, ["y"], domain=MS)
    got, exp = _both([node], inits, feeds, _elem(dtype))
    np.testing.assert_array_equal(got, exp)


def _both_outputs(nodes, inits, feeds: dict, outputs: list[tuple[str, int]]):
    """(torch evaluator, onnxruntime) outputs of a graph with several outputs."""
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info(k, _elem(v.dtype), v.shape) for k, v in feeds.items()],
        [h.make_tensor_value_info(n, t, None) for n, t in outputs],
        initializer=inits,
    )
    opsets = [h.make_opsetid("", 17), h.make_opsetid(MS, 1)]
    model = h.make_model(graph, opset_imports=opsets, ir_version=9)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = TorchOnnxEvaluator(model).run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})
    return [g.numpy() for g in got], sess.run(None, feeds)


@pytest.mark.parametrize("segments", [False, True], ids=["no_segments", "segments"])
def test_qembed_layer_normalization_matches_onnxruntime(segments):
    """quantize_dynamic's QEmbedLayerNormalization: uint8 tables dequantized, then the
    embeddings' sum normalized; the mask index counts each sequence's ones."""
    rng = np.random.default_rng(18)
    batch, seq, hidden, vocab = 2, 6, 16, 30
    shapes = {"we": (vocab, hidden), "pe": (seq, hidden), "se": (2, hidden)}
    shapes.update(g=(hidden,), b=(hidden,))
    inits = []
    for name, shape in shapes.items():
        inits.append(_z(name, _codes(rng, np.uint8, shape), np.uint8))
        inits += [_f(name + "_s", rng.random() * 0.02 + 0.001), _z(name + "_z", 100, np.uint8)]
    feeds = {
        "ids": rng.integers(0, vocab, (batch, seq)).astype(np.int32),
        "mask": np.array([[1] * 6, [1] * 4 + [0] * 2], dtype=np.int32),
    }
    if segments:
        feeds["seg"] = rng.integers(0, 2, (batch, seq)).astype(np.int32)
    se = "se" if segments else ""
    ins = ["ids", "seg" if segments else "", "we", "pe", se, "g", "b", "mask"]
    ins += [
        "we_s",
        "pe_s",
        se and "se_s",
        "g_s",
        "b_s",
        "we_z",
        "pe_z",
        se and "se_z",
        "g_z",
        "b_z",
    ]
    node = h.make_node("QEmbedLayerNormalization", ins, ["y", "mi"], domain=MS, epsilon=1e-5)
    got, exp = _both_outputs([node], inits, feeds, [("y", TP.FLOAT), ("mi", TP.INT32)])
    np.testing.assert_allclose(got[0], exp[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], exp[1])
