"""com.microsoft MatMulNBits and GatherBlockQuantized in the torch evaluator
(kernels/quant_nbits.py) against onnxruntime on CPU: models quantized by onnxruntime's
own MatMulNBitsQuantizer, and nodes built by hand for the inputs the quantizer does not
write (float zero points, g_idx, bias, float8 tables)."""

from __future__ import annotations

import logging

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper
from onnxruntime.quantization.matmul_nbits_quantizer import (
    DefaultWeightOnlyQuantConfig,
    MatMulNBitsQuantizer,
)

from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator
from onnx_sbs_nb.evaluator.kernels.quant_nbits import dequantize_nbits

K, N = 80, 24


def _ort(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _ours(model: onnx.ModelProto, feeds: dict) -> np.ndarray:
    got = TorchOnnxEvaluator(model).run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})
    return got[0].numpy()


def _mlp(dtype: int, rng: np.random.Generator) -> onnx.ModelProto:
    """x @ w1 -> Relu -> @ w2 + b: two MatMuls for the quantizer."""
    np_dt = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    inits = [
        numpy_helper.from_array(rng.standard_normal((K, N)).astype(np_dt), "w1"),
        numpy_helper.from_array(rng.standard_normal((N, 16)).astype(np_dt), "w2"),
        numpy_helper.from_array(rng.standard_normal((16,)).astype(np_dt), "b"),
    ]
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["t"]),
        h.make_node("Relu", ["t"], ["r"]),
        h.make_node("MatMul", ["r", "w2"], ["m"]),
        h.make_node("Add", ["m", "b"], ["y"]),
    ]
    graph = h.make_graph(
        nodes,
        "mlp",
        [h.make_tensor_value_info("x", dtype, [None, 5, K])],
        [h.make_tensor_value_info("y", dtype, None)],
        initializer=inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def _quantized(model, **kw) -> onnx.ModelProto:
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    q = MatMulNBitsQuantizer(model, **kw)
    q.process()
    out = q.model.model
    assert [n.op_type for n in out.graph.node].count("MatMulNBits") == 2
    return out


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("block_size", [16, 32])
@pytest.mark.parametrize("symmetric", [False, True], ids=["zero_points", "symmetric"])
@pytest.mark.parametrize("accuracy_level", [None, 4], ids=["float", "int8"])
def test_matmul_nbits_quantizer_models_match_onnxruntime(
    bits, block_size, symmetric, accuracy_level
):
    rng = np.random.default_rng(bits * 100 + block_size)
    model = _quantized(
        _mlp(TP.FLOAT, rng),
        bits=bits,
        block_size=block_size,
        is_symmetric=symmetric,
        accuracy_level=accuracy_level,
    )
    x = rng.standard_normal((2, 5, K)).astype(np.float32)
    got, exp = _ours(model, {"x": x}), _ort(model, {"x": x})
    assert got.dtype == exp.dtype == np.float32
    if accuracy_level is None:
        # the float path: B dequantized exactly, then a float32 GEMM
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-5)
    else:
        # A quantized to int8 per block: far from the float path, close to onnxruntime
        np.testing.assert_allclose(got, exp, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("accuracy_level", [0, 4])
def test_matmul_nbits_in_float16_matches_onnxruntime(accuracy_level):
    rng = np.random.default_rng(7)
    model = _quantized(_mlp(TP.FLOAT16, rng), bits=4, block_size=32, accuracy_level=accuracy_level)
    x = rng.standard_normal((2, 5, K)).astype(np.float16)
    got, exp = _ours(model, {"x": x}), _ort(model, {"x": x})
    assert got.dtype == exp.dtype == np.float16
    # one float16 step at most (float32 summation order before the rounding)
    np.testing.assert_allclose(got.astype(np.float32), exp.astype(np.float32), rtol=2e-3, atol=2e-3)


def _node_model(inputs: list[str], inits: list, acc: int = 0, k=40, n=6, bs=16):
    node = h.make_node(
        "MatMulNBits",
        ["a", *inputs],
        ["y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=bs,
        accuracy_level=acc,
    )
    graph = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("a", TP.FLOAT, [2, 3, k])],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        initializer=inits,
    )
    opsets = [h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]
    return h.make_model(graph, opset_imports=opsets, ir_version=9)


@pytest.mark.parametrize(
    "case", ["no_zero_points", "uint8_zero_points", "float_zero_points", "bias", "g_idx"]
)
@pytest.mark.parametrize("acc", [0, 4])
def test_hand_built_matmul_nbits_nodes_match_onnxruntime(case, acc):
    """K = 40 is not a multiple of the block (16): the last block is padded."""
    rng = np.random.default_rng(3)
    n, nb = 6, 3
    b = numpy_helper.from_array(rng.integers(0, 256, (n, nb, 8), dtype=np.uint8), "B")
    s = numpy_helper.from_array(rng.random((n * nb,), dtype=np.float32) * 0.1 + 0.01, "S")
    zu = numpy_helper.from_array(rng.integers(0, 256, (n * 2,), dtype=np.uint8), "Z")
    zf = numpy_helper.from_array(rng.random((n * nb,), dtype=np.float32) * 15, "Z")
    bias = numpy_helper.from_array(rng.standard_normal((n,)).astype(np.float32), "bias")
    g = numpy_helper.from_array(rng.integers(0, nb, (40,)).astype(np.int32), "g")
    inputs, inits = {
        "no_zero_points": (["B", "S"], [b, s]),
        "uint8_zero_points": (["B", "S", "Z"], [b, s, zu]),
        "float_zero_points": (["B", "S", "Z"], [b, s, zf]),
        "bias": (["B", "S", "Z", "", "bias"], [b, s, zu, bias]),
        "g_idx": (["B", "S", "Z", "g"], [b, s, zf, g]),
    }[case]
    model = _node_model(inputs, inits, acc)
    a = rng.standard_normal((2, 3, 40)).astype(np.float32)
    np.testing.assert_allclose(_ours(model, {"a": a}), _ort(model, {"a": a}), rtol=1e-5, atol=1e-5)


def test_dequantized_weights_are_the_codes_minus_zero_point_times_scale():
    """Independent of onnxruntime: one byte 0x3A holds the codes 0xA then 0x3."""
    b = torch.tensor([[[0x3A]]], dtype=torch.uint8)  # N=1, one block of 2
    s = torch.tensor([0.5])
    zp = torch.tensor([0x02], dtype=torch.uint8)  # block 0's zero point in the low bits
    w = dequantize_nbits(b, s, zp, None, K=2, N=1, bits=4, block_size=2)
    assert w.tolist() == [[(10 - 2) * 0.5, (3 - 2) * 0.5]]
    w = dequantize_nbits(b, s, None, None, K=2, N=1, bits=4, block_size=2)
    assert w.tolist() == [[(10 - 8) * 0.5, (3 - 8) * 0.5]]


# -- GatherBlockQuantized ---------------------------------------------------------------------


def _gather_model(inits, ids_shape, attrs, inputs=("data", "ids", "s", "z")) -> onnx.ModelProto:
    node = h.make_node("GatherBlockQuantized", list(inputs), ["y"], domain="com.microsoft", **attrs)
    out_type = next(i.data_type for i in inits if i.name == "s")
    graph = h.make_graph(
        [node],
        "g",
        [h.make_tensor_value_info("ids", TP.INT64, ids_shape)],
        [h.make_tensor_value_info("y", out_type, None)],
        initializer=inits,
    )
    opsets = [h.make_opsetid("", 21), h.make_opsetid("com.microsoft", 1)]
    return h.make_model(graph, opset_imports=opsets, ir_version=10)


# 12 and -13 are out of range for 10 rows: onnxruntime gives zeros there
IDS = np.array([[0, 3, -1], [9, 12, -13]], dtype=np.int64)


def _same_as_onnxruntime(model) -> None:
    got, exp = _ours(model, {"ids": IDS}), _ort(model, {"ids": IDS})
    assert got.dtype == exp.dtype and got.shape == exp.shape
    np.testing.assert_array_equal(got, exp)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("case", ["zero_points", "no_zero_points", "float16"])
def test_gather_block_quantized_on_packed_uint8_matches_onnxruntime(bits, case):
    rng = np.random.default_rng(bits)
    per_byte = 8 // bits
    data = numpy_helper.from_array(
        rng.integers(0, 256, (10, 64 // per_byte), dtype=np.uint8), "data"
    )
    s = (rng.random((10, 2)) * 0.1).astype(np.float16 if case == "float16" else np.float32)
    inits = [data, numpy_helper.from_array(s, "s")]
    inputs = ("data", "ids", "s")
    if case == "zero_points":
        z = rng.integers(0, 256, (10, -(-2 // per_byte)), dtype=np.uint8)
        inits.append(numpy_helper.from_array(z, "z"))
        inputs += ("z",)
    _same_as_onnxruntime(_gather_model(inits, IDS.shape, {"bits": bits, "block_size": 32}, inputs))


@pytest.mark.parametrize("dtype", [ml_dtypes.int4, ml_dtypes.uint4], ids=["int4", "uint4"])
@pytest.mark.parametrize("gather_axis", [0, 1])
def test_gather_block_quantized_on_4bit_types_matches_onnxruntime(dtype, gather_axis):
    """int4/uint4 tables (held one code per byte by the evaluator), gathered along
    either axis and quantized along the other."""
    rng = np.random.default_rng(4)
    info = ml_dtypes.iinfo(dtype)
    shape, blocks = ((10, 48), (10, 3)) if gather_axis == 0 else ((48, 10), (3, 10))
    inits = [
        numpy_helper.from_array(rng.integers(info.min, info.max + 1, shape).astype(dtype), "data"),
        numpy_helper.from_array((rng.random(blocks) * 0.1).astype(np.float32), "s"),
        numpy_helper.from_array(rng.integers(info.min, info.max + 1, blocks).astype(dtype), "z"),
    ]
    attrs = {"block_size": 16, "gather_axis": gather_axis, "quantize_axis": 1 - gather_axis}
    _same_as_onnxruntime(_gather_model(inits, IDS.shape, attrs))


@pytest.mark.parametrize(
    "block_size, blocks", [(16, (10, 3)), (0, (1, 1))], ids=["blocks", "tensor"]
)
def test_gather_block_quantized_on_float8_matches_onnxruntime(block_size, blocks):
    rng = np.random.default_rng(8)
    data = (rng.standard_normal((10, 48)) * 4).astype(ml_dtypes.float8_e4m3fn)
    inits = [
        numpy_helper.from_array(data, "data"),
        numpy_helper.from_array((rng.random(blocks) * 0.1).astype(np.float32), "s"),
    ]
    model = _gather_model(inits, IDS.shape, {"block_size": block_size}, ("data", "ids", "s"))
    _same_as_onnxruntime(model)


def test_int4_embedding_and_matmul_from_the_quantizer_match_onnxruntime():
    """MatMulNBitsQuantizer asked to quantize Gather too: an int4 GatherBlockQuantized
    embedding (uint4 codes and zero points) feeding a MatMulNBits."""
    rng = np.random.default_rng(9)
    graph = h.make_graph(
        [h.make_node("Gather", ["emb", "ids"], ["e"]), h.make_node("MatMul", ["e", "w"], ["y"])],
        "g",
        [h.make_tensor_value_info("ids", TP.INT64, [2, 7])],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        initializer=[
            numpy_helper.from_array(rng.standard_normal((50, 64)).astype(np.float32), "emb"),
            numpy_helper.from_array(rng.standard_normal((64, 16)).astype(np.float32), "w"),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)], ir_version=10)
    config = DefaultWeightOnlyQuantConfig(
        block_size=32,
        is_symmetric=False,
        op_types_to_quantize=("MatMul", "Gather"),
        quant_axes=(("MatMul", 0), ("Gather", 1)),
    )
    logging.getLogger("onnxruntime.quantization").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(model, algo_config=config, block_size=32)
    quantizer.process()
    q = quantizer.model.model
    assert [n.op_type for n in q.graph.node] == ["GatherBlockQuantized", "MatMulNBits"]
    ids = rng.integers(0, 50, (2, 7)).astype(np.int64)
    np.testing.assert_allclose(_ours(q, {"ids": ids}), _ort(q, {"ids": ids}), rtol=1e-5, atol=1e-5)
