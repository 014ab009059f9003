"""Quantized (QDQ) programs built in code: where onnxruntime's optimized graph really
computes something else than the graph it was given, on CPU.

The programs call ``torch.ops.quantized_decomposed.quantize_per_tensor`` /
``dequantize_per_tensor`` around linear, matmul and conv, as PT2E quantization leaves
them; the exporter lowers those to QuantizeLinear / DequantizeLinear, and onnxruntime's
QDQ optimizers fuse them into integer kernels:

- ``WeightBiasQuantization`` (level basic, microsoft/onnxruntime#22889) quantizes a float
  bias to int32 with scale x_scale * w_scale; the rounding of the bias moves a few
  outputs across a rounding boundary of the output QuantizeLinear: one quantization step
  off, on any CPU (the reason pytorch/pytorch#89976 stopped requantizing biases);
- ``QDQSelectorActionTransformer`` (level extended) fuses DQ -> MatMul/Gemm/Conv -> Q into
  QLinearMatMul / QGemm / QLinearConv.  On x86 CPUs with AVX2 but no VNNI, onnxruntime's
  u8 x s8 kernels add pairs of products in int16 with saturation (VPMADDUBSW): with
  weights and activations over their whole range the sums clip, and the outputs are many
  steps off (microsoft/onnxruntime#16105, #6004, #14642; PR #24220 added a checker for
  it).  With VNNI (or on ARM) they are exact.  :func:`u8s8_saturates` asks the host.

Weights lie on their quantization grid, so the torch program and onnxruntime start from
the same integers.
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import torch

from onnx_sbs_nb.align.source.quant_ops import register_quantized_ops

register_quantized_ops()
_qd = torch.ops.quantized_decomposed

U8 = (0, 255, torch.uint8)
S8 = (-128, 127, torch.int8)


class _Calibration:
    """onnxruntime's calibration reader over a list of feeds (a CalibrationDataReader by
    its protocol: ``get_next`` until None)."""

    def __init__(self, feeds) -> None:
        self.it = iter(feeds)

    def get_next(self):
        return next(self.it, None)


def ort_quantize(
    onx: onnx.ModelProto, folder: str, name: str, mode: str = "static", feeds=(), **options
) -> onnx.ModelProto:
    """onnxruntime's own ``quantize_dynamic`` or ``quantize_static`` of ``onx`` (static:
    calibrated on ``feeds``, QDQ per channel unless ``options`` say otherwise), written
    under ``folder`` as ``name``."""
    from onnxruntime import quantization as q

    src, out = f"{folder}/{name}.onnx", f"{folder}/{name}_{mode}.onnx"
    onnx.save(onx, src)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if mode == "dynamic":
            q.quantize_dynamic(src, out)
        elif mode == "static":
            options = {"quant_format": q.QuantFormat.QDQ, "per_channel": True, **options}
            q.quantize_static(src, out, _Calibration(feeds), **options)
        else:
            raise ValueError(mode)
    return onnx.load(out)


def qdq(x: torch.Tensor, scale: float, zero_point: int, kind=U8) -> torch.Tensor:
    lo, hi, dtype = kind
    q = _qd.quantize_per_tensor(x, scale, zero_point, lo, hi, dtype)
    return _qd.dequantize_per_tensor(q, scale, zero_point, lo, hi, dtype)


def _grid_weight(shape: tuple[int, ...], scale: float, seed: int, steps: int):
    """Weights on their int8 grid: integers in [-steps, steps] times the scale."""
    g = torch.Generator().manual_seed(seed)
    ints = torch.randint(-steps, steps + 1, shape, generator=g)
    return torch.nn.Parameter(ints.float() * scale)


def _bias(n: int, seed: int) -> torch.nn.Parameter:
    g = torch.Generator().manual_seed(seed)
    return torch.nn.Parameter(torch.randn(n, generator=g) * 0.5)


X_SCALE, X_ZP = 0.02, 128  # activations over the whole uint8 range: [-2.56, 2.54]
# Small weights (8 steps) and a coarse weight scale: the int32 bias (scale 0.001) is
# rounded by up to a hundredth of an output step, enough to move ~2% of the outputs
# across a rounding boundary of the output QuantizeLinear; no int16 pair sum saturates.
SMALL_W_SCALE, SMALL_STEPS, SMALL_Y_SCALE = 0.05, 8, 0.0625
# Full-range weights: 255 * 127 * 2 overflows int16 where the kernels saturate.
FULL_W_SCALE, FULL_STEPS, FULL_Y_SCALE = 0.005, 127, 0.05
Y_ZP = 128


class QdqLinear(torch.nn.Module):
    """uint8 activations, small int8 weights, a float bias: the bias rounding case."""

    def __init__(self, d_in: int = 64, d_out: int = 32, seed: int = 0):
        super().__init__()
        self.weight = _grid_weight((d_out, d_in), SMALL_W_SCALE, seed, SMALL_STEPS)
        self.bias = _bias(d_out, seed + 1)

    def forward(self, x):
        w = qdq(self.weight, SMALL_W_SCALE, 0, S8)
        y = torch.nn.functional.linear(qdq(x, X_SCALE, X_ZP), w, self.bias)
        return qdq(y, SMALL_Y_SCALE, Y_ZP)


class QdqMatMul(torch.nn.Module):
    """x @ w, full-range weights, no bias: the saturation case (QLinearMatMul)."""

    def __init__(self, k: int = 64, n: int = 32, seed: int = 2):
        super().__init__()
        self.weight = _grid_weight((k, n), FULL_W_SCALE, seed, FULL_STEPS)

    def forward(self, x):
        w = qdq(self.weight, FULL_W_SCALE, 0, S8)
        return qdq(torch.matmul(qdq(x, X_SCALE, X_ZP), w), FULL_Y_SCALE, Y_ZP)


class QdqConv(torch.nn.Module):
    """A QDQ conv: at level all, QLinearConv between the Transposes of the NHWC layout."""

    def __init__(self, c_in: int = 8, c_out: int = 8, seed: int = 3):
        super().__init__()
        self.weight = _grid_weight((c_out, c_in, 3, 3), SMALL_W_SCALE, seed, SMALL_STEPS)
        self.bias = _bias(c_out, seed + 1)

    def forward(self, x):
        w = qdq(self.weight, SMALL_W_SCALE, 0, S8)
        y = torch.nn.functional.conv2d(qdq(x, X_SCALE, X_ZP), w, self.bias, padding=1)
        return qdq(y, SMALL_Y_SCALE, Y_ZP)


class FloatMLP(torch.nn.Module):
    """The control: float32 Gemm + Relu, fused (FusedGemm) with no visible change."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 16)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def half_mlp() -> torch.nn.Module:
    """The control in float16: onnxruntime runs it in float32 between Casts on CPU."""
    return FloatMLP().half()


def _input(name: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(10)
    shape = {"conv": (1, 8, 8, 8), "mlp": (8, 32), "mlp16": (8, 32)}.get(name, (16, 64))
    x = (torch.rand(shape, generator=g) * 5.0 - 2.5).float()
    return x.half() if name == "mlp16" else x


MODELS = {
    "linear": QdqLinear,
    "matmul": QdqMatMul,
    "conv": QdqConv,
    "mlp": FloatMLP,
    "mlp16": half_mlp,
}


@functools.cache
def exported(name: str) -> tuple[torch.export.ExportedProgram, onnx.ModelProto, tuple]:
    """(program, ONNX model, args) of one of MODELS, exported once per test session."""
    model = MODELS[name]().eval()
    args = (_input(name),)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args)
        onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return ep, onx, args


@functools.lru_cache(maxsize=1)
def u8s8_saturates() -> bool:
    """Whether this host's onnxruntime u8 x s8 kernels clip pair sums to int16.

    255*127 + 255*127 = 64770 does not fit int16: AVX2 without VNNI returns 32767.
    """
    import onnx.helper as oh
    import onnxruntime as ort

    tp = onnx.TensorProto
    graph = oh.make_graph(
        [oh.make_node("MatMulInteger", ["a", "b"], ["y"])],
        "probe",
        [
            oh.make_tensor_value_info("a", tp.UINT8, [1, 2]),
            oh.make_tensor_value_info("b", tp.INT8, [2, 1]),
        ],
        [oh.make_tensor_value_info("y", tp.INT32, [1, 1])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"a": np.full((1, 2), 255, np.uint8), "b": np.full((2, 1), 127, np.int8)}
    return int(sess.run(None, feeds)[0][0, 0]) != 255 * 127 * 2


def cpu_features() -> str:
    """The host's SIMD flags that decide the int8 kernels (for assertion messages)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return "unknown CPU"
    wanted = [f for f in flags if f.startswith(("avx2", "avx512", "avx_vnni", "amx"))]
    return " ".join(wanted) or "no AVX2"
