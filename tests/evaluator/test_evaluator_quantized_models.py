"""Whole quantized models through the torch evaluator against onnxruntime on CPU:
small torch programs exported with torch.onnx.export(dynamo=True), then quantized by
onnxruntime.quantization as users do (quantize_dynamic; quantize_static in QDQ and
QOperator formats, per tensor and per channel, uint8 and int8 activations; 4-bit
MatMulNBits), each run whole by TorchOnnxEvaluator and by onnxruntime (graph
optimizations off: the graph as the quantizer wrote it)."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)
from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator


class SmallCNN(torch.nn.Module):
    """Conv, ReLU, MaxPool, AveragePool, a residual Add, x * sigmoid(x), a global
    average, Linear, Softmax: QLinearConv, QLinearAveragePool, QLinearAdd, QLinearMul,
    QLinearSigmoid, QGemm, QLinearSoftmax in the QOperator format."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = torch.nn.Conv2d(8, 8, 3, padding=1)
        self.fc = torch.nn.Linear(8, 10)

    def forward(self, x):
        y = torch.nn.functional.max_pool2d(torch.relu(self.c1(x)), 2)
        y = y + torch.nn.functional.avg_pool2d(torch.relu(self.c2(y)), 3, 1, 1)
        y = y * torch.sigmoid(y)
        return torch.softmax(self.fc(y.mean(dim=(2, 3))), -1)


class SmallEncoder(torch.nn.Module):
    """Embedding, two Linear with a GELU, a residual and a LayerNorm."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(50, 32)
        self.l1 = torch.nn.Linear(32, 64)
        self.l2 = torch.nn.Linear(64, 32)
        self.ln = torch.nn.LayerNorm(32)

    def forward(self, ids):
        x = self.emb(ids)
        return self.ln(x + self.l2(torch.nn.functional.gelu(self.l1(x))))


class _Reader(CalibrationDataReader):
    def __init__(self, name: str, feeds: list[np.ndarray]) -> None:
        self._it = iter([{name: f} for f in feeds])

    def get_next(self):
        return next(self._it, None)


def _feeds(kind: str, rng: np.random.Generator, n: int) -> list[np.ndarray]:
    if kind == "cnn":
        return [rng.standard_normal((2, 3, 8, 8)).astype(np.float32) for _ in range(n)]
    return [rng.integers(0, 50, (2, 7)).astype(np.int64) for _ in range(n)]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (path of the float ONNX model, input name)."""
    torch.manual_seed(0)
    out = {}
    d = tmp_path_factory.mktemp("quantized_models")
    for name, model, args in [
        ("cnn", SmallCNN(), (torch.randn(2, 3, 8, 8),)),
        ("encoder", SmallEncoder(), (torch.randint(0, 50, (2, 7)),)),
    ]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(model.eval(), args, dynamo=True, verbose=False)
        path = d / f"{name}.onnx"
        onnx.save(prog.model_proto, path)
        out[name] = (path, prog.model_proto.graph.input[0].name)
    return out


QUANTIZATIONS = {
    "dynamic_u8": {"dynamic": True, "weight_type": QuantType.QUInt8},
    "dynamic_s8_per_channel": {
        "dynamic": True,
        "weight_type": QuantType.QInt8,
        "per_channel": True,
    },
    "static_qdq": {"quant_format": QuantFormat.QDQ},
    "static_qdq_s8s8_per_channel": {
        "quant_format": QuantFormat.QDQ,
        "activation_type": QuantType.QInt8,
        "per_channel": True,
    },
    "static_qoperator": {"quant_format": QuantFormat.QOperator},
    "static_qoperator_per_channel": {"quant_format": QuantFormat.QOperator, "per_channel": True},
}


def _quantize(src, dst, input_name: str, kind: str, options: dict) -> None:
    logging.getLogger().setLevel(logging.WARNING)
    options = dict(options)
    if options.pop("dynamic", False):
        quantize_dynamic(src, dst, **options)
        return
    reader = _Reader(input_name, _feeds(kind, np.random.default_rng(1), 4))
    options.setdefault("weight_type", QuantType.QInt8)
    quantize_static(src, dst, reader, **options)


def _ort(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def _ours(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    ev = TorchOnnxEvaluator(model)
    return [g.numpy() for g in ev.run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})]


QUANT_OPS = {
    "ConvInteger",
    "DequantizeLinear",
    "DynamicQuantizeLinear",
    "MatMulInteger",
    "QGemm",
    "QLinearAdd",
    "QLinearAveragePool",
    "QLinearConv",
    "QLinearMatMul",
    "QLinearMul",
    "QLinearSigmoid",
    "QLinearSoftmax",
    "QuantizeLinear",
}


@pytest.mark.parametrize("quantization", sorted(QUANTIZATIONS))
@pytest.mark.parametrize("kind", ["cnn", "encoder"])
def test_quantized_model_runs_whole_as_onnxruntime_runs_it(exported, tmp_path, kind, quantization):
    src, input_name = exported[kind]
    dst = tmp_path / "q.onnx"
    _quantize(src, dst, input_name, kind, QUANTIZATIONS[quantization])
    model = onnx.load(dst)
    assert {n.op_type for n in model.graph.node} & QUANT_OPS  # really quantized
    for x in _feeds(kind, np.random.default_rng(2), 2):
        feeds = {input_name: x}
        for got, ref in zip(_ours(model, feeds), _ort(model, feeds)):
            assert got.dtype == ref.dtype and got.shape == ref.shape
            # a quantization step of the outputs is >= 1e-3: one code off fails
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


def test_static_qoperator_cnn_uses_the_microsoft_qlinear_ops(exported, tmp_path):
    """The CNN above really exercises the com.microsoft kernels in QOperator format."""
    src, input_name = exported["cnn"]
    dst = tmp_path / "q.onnx"
    _quantize(src, dst, input_name, "cnn", QUANTIZATIONS["static_qoperator"])
    ops = {(n.domain, n.op_type) for n in onnx.load(dst).graph.node}
    names = ("QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearSoftmax", "QGemm")
    for op_type in (*names, "QLinearAveragePool"):
        assert ("com.microsoft", op_type) in ops


@pytest.mark.parametrize("accuracy_level", [None, 4], ids=["float", "int8"])
def test_int4_weight_only_encoder_runs_whole_as_onnxruntime_runs_it(exported, accuracy_level):
    src, input_name = exported["encoder"]
    logging.getLogger().setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(
        onnx.load(src), bits=4, block_size=32, is_symmetric=False, accuracy_level=accuracy_level
    )
    quantizer.process()
    model = quantizer.model.model
    assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) == 2
    for x in _feeds("encoder", np.random.default_rng(3), 2):
        got, exp = _ours(model, {input_name: x}), _ort(model, {input_name: x})
        np.testing.assert_allclose(got[0], exp[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "kind, quantization, fused",
    [
        ("cnn", "static_qdq", "QLinearAveragePool"),
        ("cnn", "dynamic_u8", "DynamicQuantizeMatMul"),
        ("encoder", "dynamic_s8_per_channel", "DynamicQuantizeMatMul"),
    ],
)
def test_model_saved_by_onnxruntime_after_its_quantized_fusions_runs_as_it_does(
    exported, tmp_path, kind, quantization, fused
):
    """onnxruntime's extended optimizations fuse QDQ pairs into QLinear* / QGemm and
    quantize_dynamic's chains into DynamicQuantizeMatMul; the model it saves then runs
    through the evaluator as through onnxruntime."""
    src, input_name = exported[kind]
    dst, opt = tmp_path / "q.onnx", tmp_path / "q_optimized.onnx"
    _quantize(src, dst, input_name, kind, QUANTIZATIONS[quantization])
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.optimized_model_filepath = str(opt)
    ort.InferenceSession(str(dst), so, providers=["CPUExecutionProvider"])
    model = onnx.load(opt)
    assert ("com.microsoft", fused) in {(n.domain, n.op_type) for n in model.graph.node}
    for x in _feeds(kind, np.random.default_rng(4), 2):
        feeds = {input_name: x}
        np.testing.assert_allclose(
            _ours(model, feeds)[0], _ort(model, feeds)[0], rtol=1e-5, atol=1e-5
        )


def test_bert_fused_by_onnxruntime_then_quantized_dynamically_runs_as_onnxruntime_runs_it(
    tmp_path,
):
    """The classic BERT int8 recipe: onnxruntime's transformer optimizer fuses Attention
    and EmbedLayerNormalization, then quantize_dynamic turns them into QAttention and
    QEmbedLayerNormalization.  The optimizer recognizes the TorchScript exporter's
    eager-attention graph (dynamo=False), which is what this recipe starts from."""
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers.optimizer import optimize_model

    torch.manual_seed(0)
    cfg = transformers.BertConfig(
        vocab_size=100,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
    )
    cfg._attn_implementation = "eager"
    bert = transformers.BertModel(cfg).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, ids, mask, types):
            return self.bert(input_ids=ids, attention_mask=mask, token_type_ids=types)[0]

    ids = torch.randint(0, 100, (2, 8))
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 6:] = 0
    types = torch.zeros(2, 8, dtype=torch.int64)
    names = ["ids", "mask", "types"]
    src, fused, dst = tmp_path / "bert.onnx", tmp_path / "fused.onnx", tmp_path / "q.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Encoder(),
            (ids, mask, types),
            str(src),
            input_names=names,
            dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
            dynamo=False,
            opset_version=17,
        )
    logging.getLogger().setLevel(logging.WARNING)
    optimize_model(str(src), model_type="bert", num_heads=2, hidden_size=32).save_model_to_file(
        str(fused)
    )
    extra = {"DefaultTensorType": onnx.TensorProto.FLOAT}
    quantize_dynamic(fused, dst, weight_type=QuantType.QInt8, extra_options=extra)
    model = onnx.load(dst)
    ops = {n.op_type for n in model.graph.node}
    assert {"QAttention", "QEmbedLayerNormalization", "MatMulInteger"} <= ops
    feeds = dict(zip(names, (ids.numpy(), mask.numpy(), types.numpy())))
    np.testing.assert_allclose(_ours(model, feeds)[0], _ort(model, feeds)[0], rtol=1e-5, atol=1e-5)
