"""onnxruntime's contrib and fused ops (com.microsoft, and the two it registers in the
default domain) in the torch evaluator.

Each op with a CPU kernel in onnxruntime runs as a one-node model in both, on the same
seeded inputs, float32 and (where onnxruntime's CPU kernel takes it) float16; ops only
CUDA implements (NhwcConv, GroupNorm, SkipGroupNorm, BiasSplitGelu, BiasAdd,
GemmFastGelu) are checked against a plain torch computation of their definition, and
NhwcConv also through the engine's fallback: onnxruntime refuses the node on the CPU and
the torch evaluator runs it instead.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper
import onnxruntime
import pytest
import torch
import torch.nn.functional as F

from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator

MS = "com.microsoft"
# per dtype: float16 results round once in float16 on both sides, but the two sides
# accumulate in other orders
TOL = {np.float64: (1e-6, 1e-6), np.float32: (2e-5, 2e-5), np.float16: (2e-3, 2e-3)}

Inputs = list[tuple[str, np.ndarray | None]]


def _model(op_type: str, inputs: Inputs, outputs: list[str], domain: str, **attrs: Any):
    node = oh.make_node(op_type, [n for n, _ in inputs], outputs, domain=domain, **attrs)
    graph = oh.make_graph(
        [node],
        "g",
        [
            oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for n, v in inputs
            if n
        ],
        [oh.make_value_info(o, onnx.TypeProto()) for o in outputs if o],
    )
    opsets = [oh.make_opsetid("", 17), oh.make_opsetid(MS, 1)]
    return oh.make_model(graph, opset_imports=opsets, ir_version=9)


def _ours(m: onnx.ModelProto, inputs: Inputs) -> list[np.ndarray]:
    feeds = {n: torch.from_numpy(v) for n, v in inputs if n}
    return [t.numpy() for t in TorchOnnxEvaluator(m).run(None, feeds)]


def _ort(m: onnx.ModelProto, inputs: Inputs) -> list[np.ndarray]:
    sess = onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {n: v for n, v in inputs if n})


def _check(got: np.ndarray, expected: np.ndarray, dtype=np.float32, scale: float = 1.0) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    rtol, atol = TOL[dtype]
    np.testing.assert_allclose(got, expected, rtol=rtol * scale, atol=atol * scale)


def _against_ort(
    op_type: str,
    inputs: Inputs,
    outputs: list[str] | None = None,
    domain: str = MS,
    dtype=np.float32,
    **attrs: Any,
) -> list[np.ndarray]:
    m = _model(op_type, inputs, outputs or ["y"], domain, **attrs)
    expected, got = _ort(m, inputs), _ours(m, inputs)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        _check(g, e, dtype)
    return got


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _randn(rng: np.random.Generator, *shape: int, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


# -- layer normalizations ---------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("skip_shape", [(2, 5, 16), (1, 5, 16), (5, 16)])
def test_skip_layer_norm_all_outputs(dtype, skip_shape):
    rng = _rng(1)
    inputs = [
        ("x", _randn(rng, 2, 5, 16, dtype=dtype)),
        ("skip", _randn(rng, *skip_shape, dtype=dtype)),
        ("gamma", _randn(rng, 16, dtype=dtype)),
        ("beta", _randn(rng, 16, dtype=dtype)),
        ("bias", _randn(rng, 16, dtype=dtype)),
    ]
    got = _against_ort(
        "SkipLayerNormalization",
        inputs,
        ["y", "mean", "inv", "sum"],
        dtype=dtype,
        epsilon=1e-5,
    )
    assert got[1].dtype == np.float32 and got[1].shape == (2, 5, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_layer_norm_without_beta_and_bias_and_omitted_outputs(dtype):
    rng = _rng(2)
    inputs = [
        ("x", _randn(rng, 3, 4, 8, dtype=dtype)),
        ("skip", _randn(rng, 3, 4, 8, dtype=dtype)),
        ("gamma", _randn(rng, 8, dtype=dtype)),
    ]
    _against_ort("SkipLayerNormalization", inputs, ["y", "", "", "sum"], dtype=dtype)
    _against_ort("SkipLayerNormalization", inputs, ["y"], dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("outputs", [["y"], ["y", "", "", "sum"], ["y", "mean", "inv", "sum"]])
def test_skip_simplified_layer_norm(dtype, outputs):
    rng = _rng(3)
    inputs = [
        ("x", _randn(rng, 2, 6, 32, dtype=dtype)),
        ("skip", _randn(rng, 2, 6, 32, dtype=dtype)),
        ("gamma", _randn(rng, 32, dtype=dtype)),
        ("bias", _randn(rng, 32, dtype=dtype)),
    ]
    got = _against_ort(
        "SkipSimplifiedLayerNormalization", inputs, outputs, dtype=dtype, epsilon=1e-6
    )
    # the empty names are outputs the node does not produce, not outputs in another order
    assert len(got) == sum(map(bool, outputs))
    if len(outputs) == 4 and "mean" in outputs:
        assert not got[1].any()


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_skip_simplified_layer_norm_2d_tokens_without_bias(dtype):
    rng = _rng(4)
    inputs = [
        ("x", _randn(rng, 7, 16, dtype=dtype)),
        ("skip", _randn(rng, 7, 16, dtype=dtype)),
        ("gamma", _randn(rng, 16, dtype=dtype)),
    ]
    _against_ort("SkipSimplifiedLayerNormalization", inputs, ["y", "", "inv", "sum"], dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
@pytest.mark.parametrize("axis", [-1, 1])
def test_simplified_layer_norm_default_domain(dtype, axis):
    rng = _rng(5)
    x = _randn(rng, 2, 3, 8, dtype=dtype)
    scale = _randn(rng, *x.shape[axis % 3 :], dtype=dtype)
    inputs = [("x", x), ("scale", scale)]
    _against_ort("SimplifiedLayerNormalization", inputs, ["y", "inv"], "", dtype=dtype, axis=axis)
    _against_ort("SimplifiedLayerNormalization", inputs, ["y"], "", dtype=dtype, epsilon=1e-3)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_layer_norm_before_opset_17_is_onnxruntimes(dtype):
    rng = _rng(6)
    inputs = [
        ("x", _randn(rng, 2, 3, 8, dtype=dtype)),
        ("scale", _randn(rng, 8, dtype=dtype)),
        ("b", _randn(rng, 8, dtype=dtype)),
    ]
    m = _model("LayerNormalization", inputs, ["y", "mean", "inv"], "", epsilon=1e-4)
    m.opset_import[0].version = 13  # ONNX's own op starts at 17
    for g, e in zip(_ours(m, inputs), _ort(m, inputs)):
        _check(g, e, dtype)


# -- GELU family ------------------------------------------------------------------------------


def test_gelu_family_against_onnxruntime():
    rng = _rng(7)
    x = _randn(rng, 2, 5, 12) * 3
    b = _randn(rng, 12)
    _against_ort("Gelu", [("x", x)])
    _against_ort("BiasGelu", [("x", x), ("b", b)])
    _against_ort("FastGelu", [("x", x)])
    _against_ort("FastGelu", [("x", x), ("b", b)])
    _against_ort("QuickGelu", [("x", x)])
    _against_ort("QuickGelu", [("x", x)], alpha=1.3)


def _tanh_gelu(t: torch.Tensor) -> torch.Tensor:
    """The tanh form written out, so that the check does not use the kernel's F.gelu."""
    return 0.5 * t * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t**3)))


def _erf_gelu(t: torch.Tensor) -> torch.Tensor:
    return 0.5 * t * (1 + torch.erf(t / math.sqrt(2)))


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_cuda_only_gelu_fusions_match_their_definitions(dtype):
    rng = _rng(8)
    x = _randn(rng, 2, 6, 16, dtype=dtype)
    bias = _randn(rng, 16, dtype=dtype)
    skip = _randn(rng, 2, 6, 16, dtype=dtype)
    w = _randn(rng, 16, 8, dtype=dtype)
    b8 = _randn(rng, 8, dtype=dtype)
    tx, tb, ts, tw, tb8 = (torch.from_numpy(v).double() for v in (x, bias, skip, w, b8))

    def ours(op_type, inputs):
        return _ours(_model(op_type, inputs, ["y"], MS), inputs)[0]

    s = tx + tb
    cases = {
        "BiasSplitGelu": ([("x", x), ("b", bias)], s[..., :8] * _erf_gelu(s[..., 8:])),
        "BiasAdd": ([("x", x), ("b", bias), ("s", skip)], tx + tb + ts),
        "GemmFastGelu": ([("x", x), ("w", w), ("b", b8)], _tanh_gelu(tx @ tw + tb8)),
    }
    for op_type, (inputs, expected) in cases.items():
        got = ours(op_type, inputs)
        _check(
            got, expected.numpy().astype(dtype), dtype, scale=5 if op_type == "GemmFastGelu" else 1
        )
    got = ours("GemmFastGelu", [("x", x), ("w", w)])
    _check(got, _tanh_gelu(tx @ tw).numpy().astype(dtype), dtype, scale=5)


# -- NhwcConv ---------------------------------------------------------------------------------

NHWC_CASES = {
    "plain": {},
    "strided_padded": {"strides": [2, 1], "pads": [1, 0, 1, 2]},
    "dilated_grouped": {"dilations": [2, 1], "group": 2},
    "same_upper": {"auto_pad": "SAME_UPPER", "strides": [2, 2]},
}


def _nhwc_inputs(rng, dtype, group: int = 1) -> Inputs:
    x = _randn(rng, 2, 9, 8, 4, dtype=dtype)  # N, H, W, C
    w = _randn(rng, 6, 3, 3, 4 // group, dtype=dtype)  # M, kH, kW, C / group
    return [("x", x), ("w", w), ("b", _randn(rng, 6, dtype=dtype))]


def _nhwc_reference(inputs: Inputs, **attrs) -> torch.Tensor:
    x, w, b = (torch.from_numpy(v).double() for _, v in inputs)
    pads = attrs.get("pads", [0, 0, 0, 0])
    xp = F.pad(x.permute(0, 3, 1, 2), (pads[1], pads[3], pads[0], pads[2]))
    y = F.conv2d(
        xp,
        w.permute(0, 3, 1, 2),
        b,
        stride=attrs.get("strides", 1),
        dilation=attrs.get("dilations", 1),
        groups=attrs.get("group", 1),
    )
    return y.permute(0, 2, 3, 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", sorted(NHWC_CASES))
def test_nhwc_conv_is_permuted_conv2d(dtype, case):
    attrs = NHWC_CASES[case]
    inputs = _nhwc_inputs(_rng(9), dtype, attrs.get("group", 1))
    (got,) = _ours(_model("NhwcConv", inputs, ["y"], MS, **attrs), inputs)
    if attrs.get("auto_pad") == "SAME_UPPER":
        # output ceil(9 / 2) x ceil(8 / 2): pads of 2 along H and 1 along W, the odd one
        # at the end
        expected = _nhwc_reference(inputs, strides=[2, 2], pads=[1, 0, 1, 1])
        assert got.shape == (2, 5, 4, 6)
    else:
        expected = _nhwc_reference(inputs, **attrs)
    _check(got, expected.numpy().astype(dtype), dtype, scale=5)


def test_nhwc_conv_falls_back_to_the_torch_evaluator_in_the_engine():
    """onnxruntime has no CPU NhwcConv: the engine's runner gets the torch evaluator's
    values and says why."""
    from onnx_sbs_nb.align.engine.runners import ModelContext, OnnxruntimeRunner

    inputs = _nhwc_inputs(_rng(10), np.float32)
    m = _model("NhwcConv", inputs, ["y"], MS, strides=[2, 1], pads=[1, 0, 1, 2])
    with pytest.raises(Exception, match="NOT_IMPLEMENTED|Could not find an implementation"):
        _ort(m, inputs)
    prepared = OnnxruntimeRunner().prepare(m.graph.node[0], ModelContext.from_model(m))
    (got,) = prepared([v for _, v in inputs])
    assert prepared.elsewhere and "torch evaluator" in prepared.fallback_reason
    expected = _nhwc_reference(inputs, strides=[2, 1], pads=[1, 0, 1, 2])
    _check(np.asarray(got), expected.numpy().astype(np.float32), scale=5)


# -- GroupNorm, SkipGroupNorm -------------------------------------------------------------------


def _group_norm_reference(x: torch.Tensor, gamma, beta, groups, eps, silu) -> torch.Tensor:
    """NHWC in, NHWC out, statistics written out over each group of channels."""
    n, h, w, c = x.shape
    g = x.reshape(n, h * w, groups, c // groups)
    mean = g.mean((1, 3), keepdim=True)
    var = ((g - mean) ** 2).mean((1, 3), keepdim=True)
    y = ((g - mean) / torch.sqrt(var + eps)).reshape(n, h, w, c) * gamma + beta
    return y * torch.sigmoid(y) if silu else y


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("activation", [0, 1])
@pytest.mark.parametrize("channels_last", [1, 0])
def test_group_norm(dtype, activation, channels_last):
    rng = _rng(11)
    x = _randn(rng, 2, 5, 4, 12, dtype=dtype) * 2 + 1
    gamma, beta = _randn(rng, 12), _randn(rng, 12)  # float32 even for float16 X (type M)
    tx, tg, tb = (torch.from_numpy(v).double() for v in (x, gamma, beta))
    expected = _group_norm_reference(tx, tg, tb, 3, 1e-5, activation)
    feed_x = x if channels_last else np.ascontiguousarray(x.transpose(0, 3, 1, 2))
    inputs = [("x", feed_x), ("gamma", gamma), ("beta", beta)]
    m = _model("GroupNorm", inputs, ["y"], MS, activation=activation, groups=3)
    if not channels_last:
        m.graph.node[0].attribute.append(oh.make_attribute("channels_last", 0))
        expected = expected.permute(0, 3, 1, 2)
    (got,) = _ours(m, inputs)
    _check(got, expected.numpy().astype(dtype), dtype, scale=2)


@pytest.mark.parametrize("skip_shape", [(2, 5, 4, 12), (2, 1, 1, 12), (2, 12)])
def test_skip_group_norm_sum_and_output(skip_shape):
    rng = _rng(12)
    x = _randn(rng, 2, 5, 4, 12)
    skip = _randn(rng, *skip_shape)
    gamma, beta, bias = _randn(rng, 12), _randn(rng, 12), _randn(rng, 12)
    inputs = [("x", x), ("gamma", gamma), ("beta", beta), ("skip", skip), ("bias", bias)]
    m = _model("SkipGroupNorm", inputs, ["y", "s"], MS, activation=1, groups=4, epsilon=1e-4)
    y, s = _ours(m, inputs)
    tskip = torch.from_numpy(skip).double()
    if tskip.dim() == 2:
        tskip = tskip[:, None, None, :]
    ts = torch.from_numpy(x).double() + tskip + torch.from_numpy(bias).double()
    _check(s, ts.numpy().astype(np.float32))
    tg, tb = torch.from_numpy(gamma).double(), torch.from_numpy(beta).double()
    _check(y, _group_norm_reference(ts, tg, tb, 4, 1e-4, 1).numpy().astype(np.float32), scale=2)


# -- RotaryEmbedding ----------------------------------------------------------------------------


def _caches(rng, max_len: int, half: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    angles = rng.uniform(0, 2 * np.pi, (max_len, half))
    return np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)


ROTARY_CASES = {
    # name: (input shape, num_heads, rotary_embedding_dim, position ids as (1,) offset)
    "3d_heads_inferred": ((2, 5, 32), 0, 0, False),
    "3d_offset_position": ((2, 5, 32), 0, 0, True),
    "3d_partial": ((2, 5, 32), 2, 8, False),
    "4d_bnsh": ((2, 2, 5, 16), 0, 0, False),
    "4d_partial_offset": ((2, 2, 5, 16), 2, 8, True),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("case", sorted(ROTARY_CASES))
def test_rotary_embedding_contrib(dtype, interleaved, case):
    shape, num_heads, rot_dim, offset = ROTARY_CASES[case]
    rng = _rng(13)
    x = _randn(rng, *shape, dtype=dtype)
    head = 16
    cos, sin = _caches(rng, 12, (rot_dim or head) // 2, dtype)
    if offset:
        pos = np.array([3], np.int64)
    else:
        pos = rng.integers(0, 12, (2, 5)).astype(np.int64)
    attrs: dict[str, Any] = {"interleaved": interleaved}
    if num_heads:
        attrs["num_heads"] = num_heads
    if rot_dim:
        attrs["rotary_embedding_dim"] = rot_dim
    inputs = [("x", x), ("pos", pos), ("cos", cos), ("sin", sin)]
    (got,) = _against_ort("RotaryEmbedding", inputs, dtype=dtype, **attrs)
    if rot_dim:  # what is not rotated passes through
        np.testing.assert_array_equal(got[..., rot_dim:head], x[..., rot_dim:head])


def test_rotary_embedding_scale_attribute_changes_nothing_as_in_onnxruntime():
    rng = _rng(15)
    cos, sin = _caches(rng, 12, 8, np.float32)
    inputs = [("x", _randn(rng, 2, 5, 32)), ("pos", np.array([1], np.int64))]
    inputs += [("cos", cos), ("sin", sin)]
    scaled = _against_ort("RotaryEmbedding", inputs, scale=2.0)[0]
    np.testing.assert_array_equal(scaled, _against_ort("RotaryEmbedding", inputs)[0])


def test_rotary_embedding_packed_batching_is_refused():
    rng = _rng(14)
    cos, sin = _caches(rng, 8, 8, np.float32)
    inputs = [("x", _randn(rng, 1, 4, 16)), ("pos", np.zeros(1, np.int64))]
    inputs += [("cos", cos), ("sin", sin)]
    m = _model("RotaryEmbedding", inputs, ["y"], MS, is_packed_batching=1)
    with pytest.raises(Exception, match="is_packed_batching"):
        _ours(m, inputs)


# -- Attention ------------------------------------------------------------------------------------


def _attention_inputs(rng, batch=2, seq=4, din=16, sizes=(16, 16, 16), past=0, heads=2):
    inputs: Inputs = [
        ("x", _randn(rng, batch, seq, din)),
        ("w", _randn(rng, din, sum(sizes)) / 4),
        ("bias", _randn(rng, sum(sizes))),
    ]
    return inputs, (_randn(rng, 2, batch, heads, past, sizes[0] // heads) if past else None)


def _mask_cases(batch: int, total: int) -> dict[str, np.ndarray | None]:
    raw = np.ones((batch, total), np.int32)
    raw[0, -2:] = 0
    raw[1, :1] = 0
    return {
        "none": None,
        "lengths": np.array([total - 1, total - 2], np.int32)[:batch],
        "end_and_start": np.array([total - 1, total, 1, 2], np.int32),
        "raw_2d": raw,
        "raw_3d": np.repeat(raw[:, None, :], 4, 1),
        # every key hidden for one sequence: onnxruntime's -10000 then averages them all
        "raw_all_hidden": np.concatenate([raw[:1], np.zeros_like(raw[:1])]),
    }


@pytest.mark.parametrize("mask", sorted(_mask_cases(2, 4)))
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_attention_bert_masks(mask, unidirectional):
    rng = _rng(20)
    inputs, _ = _attention_inputs(rng)
    m = _mask_cases(2, 4)[mask]
    if m is not None:
        inputs.append(("mask", m))
    _against_ort("Attention", inputs, ["y", "present"], num_heads=2, unidirectional=unidirectional)


def test_attention_gpt2_with_past_and_mask():
    rng = _rng(21)
    inputs, past = _attention_inputs(rng, seq=3, past=5)
    mask = np.ones((2, 8), np.int32)
    mask[1, :2] = 0  # left padding
    inputs += [("mask", mask), ("past", past)]
    got = _against_ort(
        "Attention",
        inputs,
        ["y", "present"],
        num_heads=2,
        unidirectional=1,
        mask_filter_value=-1e4,
        scale=0.3,
    )
    np.testing.assert_array_equal(got[1][:, :, :, :5], past)


def test_attention_bias_input():
    rng = _rng(28)
    inputs, _ = _attention_inputs(rng)
    inputs += [("mask", np.array([4, 3], np.int32)), ("", None)]
    inputs += [("attention_bias", _randn(rng, 2, 1, 4, 4))]
    _against_ort("Attention", inputs, num_heads=2)


def test_attention_qkv_hidden_sizes_and_refusals():
    rng = _rng(22)
    inputs, _ = _attention_inputs(rng, sizes=(8, 8, 12))
    _against_ort("Attention", inputs, ["y"], num_heads=2, qkv_hidden_sizes=[8, 8, 12])
    mask4 = np.ones((2, 1, 4, 4), np.int32)
    m = _model(
        "Attention", [*inputs, ("mask", mask4)], ["y"], MS, num_heads=2, qkv_hidden_sizes=[8, 8, 12]
    )
    with pytest.raises(Exception, match="Megatron"):
        _ours(m, [*inputs, ("mask", mask4)])


# -- MultiHeadAttention ------------------------------------------------------------------------


@pytest.mark.parametrize("mask", ["none", "lengths", "raw_2d", "raw_3d", "raw_all_hidden"])
@pytest.mark.parametrize("unidirectional", [0, 1])
def test_multi_head_attention_self(mask, unidirectional):
    rng = _rng(23)
    q, k, v = (_randn(rng, 2, 4, 16) for _ in range(3))
    inputs: Inputs = [("q", q), ("k", k), ("v", v), ("bias", _randn(rng, 48))]
    m = _mask_cases(2, 4)[mask]
    if m is not None:
        inputs.append(("mask", m))
    _against_ort(
        "MultiHeadAttention",
        inputs,
        ["y", "pk", "pv"],
        num_heads=4,
        unidirectional=unidirectional,
    )


def test_multi_head_attention_with_past_and_attention_bias():
    rng = _rng(24)
    q, k, v = (_randn(rng, 2, 3, 16) for _ in range(3))
    past_k, past_v = _randn(rng, 2, 2, 5, 8), _randn(rng, 2, 2, 5, 8)
    inputs: Inputs = [
        ("q", q),
        ("k", k),
        ("v", v),
        ("", None),
        ("", None),
        ("ab", _randn(rng, 2, 1, 3, 8)),
        ("pk", past_k),
        ("pv", past_v),
    ]
    _against_ort("MultiHeadAttention", inputs, ["y", "k2", "v2"], num_heads=2, unidirectional=1)


def test_multi_head_attention_cross_with_bnsh_keys():
    rng = _rng(25)
    q = _randn(rng, 2, 3, 16)
    k4, v4 = _randn(rng, 2, 2, 6, 8), _randn(rng, 2, 2, 6, 8)
    _against_ort("MultiHeadAttention", [("q", q), ("k", k4), ("v", v4)], num_heads=2, scale=0.5)
    k3, v3 = _randn(rng, 2, 6, 16), _randn(rng, 2, 6, 24)
    inputs = [("q", q), ("k", k3), ("v", v3), ("bias", _randn(rng, 56))]
    _against_ort("MultiHeadAttention", inputs, num_heads=2)


# -- GroupQueryAttention ----------------------------------------------------------------------


def _gqa_inputs(rng, dtype, seq, past, seqlens, total, heads=4, kv_heads=2, head=8, packed=False):
    b = len(seqlens)
    q = _randn(rng, b, seq, heads * head, dtype=dtype)
    k = _randn(rng, b, seq, kv_heads * head, dtype=dtype)
    v = _randn(rng, b, seq, kv_heads * head, dtype=dtype)
    inputs: Inputs = (
        [("q", np.concatenate([q, k, v], -1)), ("", None), ("", None)]
        if packed
        else [("q", q), ("k", k), ("v", v)]
    )
    if past is None:
        inputs += [("", None), ("", None)]
    else:
        inputs += [
            ("pk", _randn(rng, b, kv_heads, past, head, dtype=dtype)),
            ("pv", _randn(rng, b, kv_heads, past, head, dtype=dtype)),
        ]
    inputs += [
        ("seqlens_k", np.array(seqlens, np.int32) - 1),
        ("total", np.array(total, np.int32)),
    ]
    return inputs


GQA_CASES: dict[str, tuple[dict, dict]] = {
    # name: (input layout, attributes)
    "prompt": (dict(seq=5, past=None, seqlens=[5, 5], total=5), {}),
    "prompt_empty_past": (dict(seq=5, past=0, seqlens=[5, 5], total=5), {}),
    "prompt_packed": (dict(seq=5, past=0, seqlens=[5, 5], total=5, packed=True), {}),
    "decode_ragged": (dict(seq=1, past=8, seqlens=[6, 8], total=8), {}),
    "decode_grown": (dict(seq=1, past=6, seqlens=[7, 7], total=7), {}),
    # onnxruntime takes a chunk after the first prompt for one sequence only
    "continue_prompt": (dict(seq=3, past=4, seqlens=[7], total=7), {}),
    "window_softcap": (
        dict(seq=5, past=0, seqlens=[5, 5], total=5),
        {"local_window_size": 2, "softcap": 2.0, "scale": 0.4},
    ),
    "decode_window": (dict(seq=1, past=8, seqlens=[6, 8], total=8), {"local_window_size": 3}),
    "smooth_softmax": (dict(seq=1, past=6, seqlens=[7, 7], total=7), {"smooth_softmax": 1}),
    "not_causal": (dict(seq=4, past=0, seqlens=[4, 4], total=4), {"causal": 0}),
    # a batch of prompts right-padded to the longest
    "ragged_prompt": (dict(seq=5, past=0, seqlens=[3, 5], total=5), {}),
    "ragged_prompt_no_past": (dict(seq=5, past=None, seqlens=[3, 5], total=5), {}),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("case", sorted(GQA_CASES))
def test_group_query_attention(dtype, case):
    layout, attrs = GQA_CASES[case]
    inputs = _gqa_inputs(_rng(26), dtype, **layout)
    m = _model(
        "GroupQueryAttention", inputs, ["y", "pk2", "pv2"], MS, num_heads=4, kv_num_heads=2, **attrs
    )
    _check_gqa(m, inputs, layout["seqlens"], dtype)


def _check_gqa(m: onnx.ModelProto, inputs: Inputs, lens: list[int], dtype) -> None:
    expected, got = _ort(m, inputs), _ours(m, inputs)
    assert len(got) == len(expected) == 3
    _check(got[0], expected[0], dtype)
    for g, e in zip(got[1:], expected[1:]):
        # present rows past each sequence's length are not written by onnxruntime
        assert g.shape == e.shape
        for b, n in enumerate(lens):
            _check(g[b, :, :n], e[b, :, :n], dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("decode", [False, True])
def test_group_query_attention_rotary_and_head_sink(dtype, interleaved, decode):
    rng = _rng(27)
    layout = (
        dict(seq=1, past=8, seqlens=[6, 8], total=8)
        if decode
        else dict(seq=5, past=0, seqlens=[5, 5], total=5)
    )
    # onnxruntime rotates heads of a multiple of 16 only
    inputs = _gqa_inputs(rng, dtype, head=16, **layout)
    cos, sin = _caches(rng, 16, 8, dtype)
    inputs += [
        ("cos", cos),
        ("sin", sin),
        ("", None),
        ("", None),
        ("sink", _randn(rng, 4, dtype=dtype)),
    ]
    # the presents are asked for, as every fused decoder does: without them onnxruntime's
    # CPU kernel leaves the past out in token generation
    m = _model(
        "GroupQueryAttention",
        inputs,
        ["y", "pk2", "pv2"],
        MS,
        num_heads=4,
        kv_num_heads=2,
        do_rotary=1,
        rotary_interleaved=interleaved,
    )
    _check_gqa(m, inputs, layout["seqlens"], dtype)


def test_uncovered_attention_forms_are_refused_by_name():
    rng = _rng(29)
    inputs = _gqa_inputs(rng, np.float32, seq=1, past=6, seqlens=[7, 7], total=7)
    refused = {
        "query_seqlens": (inputs + [("", None)] * 9 + [("qs", np.ones(2, np.int32))], {}),
        "sliding_window_cache": (inputs, {"sliding_window_cache": 1, "local_window_size": 4}),
        "quantized KV cache": (inputs, {"k_quant_type": "PER_TENSOR"}),
    }
    for what, (feeds, attrs) in refused.items():
        m = _model(
            "GroupQueryAttention",
            feeds,
            ["y", "k2", "v2"],
            MS,
            num_heads=4,
            kv_num_heads=2,
            **attrs,
        )
        with pytest.raises(Exception, match=what):
            _ours(m, feeds)
    q = [("q", _randn(rng, 2, 4, 16)), ("k", _randn(rng, 2, 4, 16)), ("v", _randn(rng, 2, 4, 16))]
    m = _model("MultiHeadAttention", q, ["y", "", "", "qk"], MS, num_heads=2)
    with pytest.raises(Exception, match="qk output"):
        _ours(m, q)


# -- EmbedLayerNormalization ----------------------------------------------------------------------


@pytest.mark.parametrize("with_mask", [False, True])
@pytest.mark.parametrize("with_positions", [False, True])
@pytest.mark.parametrize("with_segments", [False, True])
def test_embed_layer_norm(with_mask, with_positions, with_segments):
    rng = _rng(30)
    inputs: Inputs = [
        ("ids", rng.integers(0, 20, (2, 6)).astype(np.int32)),
        ("seg", rng.integers(0, 2, (2, 6)).astype(np.int32)) if with_segments else ("", None),
        ("we", _randn(rng, 20, 16)),
        ("pe", _randn(rng, 10, 16)),
        ("se", _randn(rng, 2, 16)) if with_segments else ("", None),
        ("gamma", _randn(rng, 16)),
        ("beta", _randn(rng, 16)),
    ]
    # a hole in the second mask: the index counts ones, it is not the first zero
    mask = np.array([[1, 1, 1, 1, 0, 0], [1, 0, 1, 1, 1, 0]], np.int32)
    inputs.append(("mask", mask) if with_mask else ("", None))
    if with_positions:
        inputs.append(("pos", np.arange(3, 9, dtype=np.int32).reshape(1, 6)))
    got = _against_ort("EmbedLayerNormalization", inputs, ["y", "mask_index", "sum"], epsilon=1e-5)
    assert got[1].tolist() == ([4, 4] if with_mask else [0, 0])


# -- whole models as onnxruntime's transformer optimizer fuses them ----------------------------


def _legacy_export(
    model: torch.nn.Module,
    args: tuple,
    names: list[str],
    path,
    opset: int = 17,
    dynamic: bool = False,
) -> str:
    # the optimizer's fusions match the TorchScript exporter's patterns
    torch.onnx.export(
        model,
        args,
        str(path),
        input_names=names,
        output_names=["y"],
        opset_version=opset,
        dynamo=False,
        # with fixed batch and sequence lengths the embedding fusion does not match
        dynamic_axes={n: {0: "batch", 1: "seq"} for n in names} if dynamic else None,
    )
    return str(path)


def test_unet_fusions_nhwc_conv_and_group_norm_match_eager(tmp_path):
    from onnxruntime.transformers.optimizer import optimize_model

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(32, 32, 3, padding=1)
            self.norm = torch.nn.GroupNorm(8, 32)
            self.out = torch.nn.Conv2d(32, 32, 3, stride=2, padding=1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.out(F.silu(self.norm(self.conv(x))))

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(2, 32, 8, 8)
    path = _legacy_export(model, (x,), ["x"], tmp_path / "block.onnx")
    fused = optimize_model(path, model_type="unet", opt_level=0).model
    ops = {n.op_type for n in fused.graph.node if n.domain == MS}
    assert ops == {"NhwcConv", "GroupNorm"}
    (got,) = TorchOnnxEvaluator(fused).run(None, {"x": x})
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    # the engine, comparing the model with its fused form: onnxruntime refuses NhwcConv
    # and GroupNorm on the CPU, the torch evaluator runs them, the output pairs and agrees
    from onnx_sbs_nb import run_aligned_onnx

    records = list(run_aligned_onnx(onnx.load(path), fused, {"x": x}))
    (out,) = [r for r in records if r.onnx_name == "y"]
    assert out.status == "ok" and out.err_abs < 1e-4
    assert {r.onnx_op_type for r in records} >= {"NhwcConv", "GroupNorm"}


def test_bert_fusions_match_onnxruntime(tmp_path):
    transformers = pytest.importorskip("transformers")
    from onnxruntime.transformers.optimizer import optimize_model

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            config = transformers.BertConfig(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                vocab_size=100,
                attn_implementation="eager",
            )
            self.bert = transformers.BertModel(config, add_pooling_layer=False)

        def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=ids, attention_mask=mask).last_hidden_state

    torch.manual_seed(0)
    ids = torch.randint(0, 100, (2, 7))
    mask = torch.ones(2, 7, dtype=torch.int64)
    mask[1, 5:] = 0
    # before opset 17 the layer norms come decomposed: the optimizer fuses the embeddings'
    path = _legacy_export(
        Encoder().eval(), (ids, mask), ["ids", "mask"], tmp_path / "b.onnx", 14, True
    )
    fused = optimize_model(path, model_type="bert", num_heads=4, hidden_size=32, opt_level=0)
    m = fused.model
    ops = {n.op_type for n in m.graph.node if n.domain == MS}
    assert {"EmbedLayerNormalization", "Attention", "SkipLayerNormalization"} <= ops
    feeds = {"ids": ids.numpy(), "mask": mask.numpy()}
    (expected,) = _ort(m, list(feeds.items()))
    (got,) = TorchOnnxEvaluator(m).run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})
    np.testing.assert_allclose(got.numpy(), expected, atol=1e-5, rtol=1e-5)


def _meta_cases() -> dict[str, tuple[str, Inputs, list[str], tuple[str, ...], dict]]:
    rng = _rng(31)
    gqa = _gqa_inputs(rng, np.float32, seq=1, past=8, seqlens=[6, 8], total=8, head=16)
    cos, sin = _caches(rng, 16, 8, np.float32)
    att, past = _attention_inputs(rng, seq=3, past=5)
    q = _randn(rng, 2, 4, 16)
    return {
        "gqa": (
            "GroupQueryAttention",
            [*gqa, ("cos", cos), ("sin", sin)],
            ["y", "k2", "v2"],
            ("seqlens_k", "total"),
            {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1},
        ),
        "attention": (
            "Attention",
            [*att, ("mask", np.array([[1] * 8, [0] * 2 + [1] * 6], np.int32)), ("past", past)],
            ["y", "present"],
            (),
            {"num_heads": 2, "unidirectional": 1},
        ),
        "mha": (
            "MultiHeadAttention",
            [("q", q), ("k", q), ("v", q), ("b", _randn(rng, 48)), ("m", np.ones(2, np.int32))],
            ["y", "k2", "v2"],
            (),
            {"num_heads": 2},
        ),
        "rotary": (
            "RotaryEmbedding",
            [("x", _randn(rng, 2, 5, 32)), ("p", np.array([2], np.int64)), ("c", cos), ("s", sin)],
            ["y"],
            (),
            {},
        ),
    }


@pytest.mark.parametrize("name", sorted(_meta_cases()))
def test_no_device_value_is_read_on_the_host(name):
    """On the meta device a kernel that reads a device value on the host raises, where on
    CUDA it would wait for the GPU; the values that size the result are host inputs,
    given as constants, as exporters write them."""
    op_type, inputs, outputs, host, attrs = _meta_cases()[name]
    m = _model(op_type, inputs, outputs, MS, **attrs)
    for n, v in inputs:
        if n in host:
            m.graph.initializer.append(onnx.numpy_helper.from_array(v, n))
    kept = [vi for vi in m.graph.input if vi.name not in host]
    del m.graph.input[:]
    m.graph.input.extend(kept)
    feeds = {n: torch.from_numpy(v).to("meta") for n, v in inputs if n and n not in host}
    got = TorchOnnxEvaluator(m, device="meta").run(None, feeds)
    assert all(t.device.type == "meta" for t in got)
    expected = _ours(_model(op_type, inputs, outputs, MS, **attrs), inputs)
    assert [tuple(t.shape) for t in got] == [e.shape for e in expected]


@pytest.mark.parametrize("decode", [False, True])
def test_group_query_attention_position_ids_and_attention_bias(decode):
    rng = _rng(32)
    layout = (
        dict(seq=1, past=8, seqlens=[6, 8], total=8)
        if decode
        else dict(seq=5, past=0, seqlens=[5, 5], total=5)
    )
    inputs = _gqa_inputs(rng, np.float32, head=16, **layout)
    cos, sin = _caches(rng, 16, 8, np.float32)
    # in a first prompt onnxruntime starts every sequence at the first position id
    pos = np.array([[9], [3]]) if decode else np.array([[2, 3, 4, 5, 6], [0, 1, 2, 3, 4]])
    total = layout["total"]
    inputs += [("cos", cos), ("sin", sin), ("pid", pos.astype(np.int64))]
    inputs.append(("bias", _randn(rng, 2, 4, layout["seq"], total)))
    m = _model(
        "GroupQueryAttention",
        inputs,
        ["y", "pk2", "pv2"],
        MS,
        num_heads=4,
        kv_num_heads=2,
        do_rotary=1,
    )
    _check_gqa(m, inputs, layout["seqlens"], np.float32)


def test_multi_head_attention_packed_inputs_equal_the_unpacked_in_onnxruntime():
    """onnxruntime's CPU kernel refuses packed QKV and KV (the engine falls back to the
    torch evaluator): the same attention unpacked, which it runs, is the reference."""
    rng = _rng(33)
    qkv = _randn(rng, 2, 4, 2, 3, 8)  # B, L, N, 3, H
    unpacked = [
        (n, np.ascontiguousarray(qkv[:, :, :, i]).reshape(2, 4, 16)) for i, n in enumerate("qkv")
    ]
    (expected,) = _ort(_model("MultiHeadAttention", unpacked, ["y"], MS, num_heads=2), unpacked)
    m = _model("MultiHeadAttention", [("qkv", qkv)], ["y"], MS, num_heads=2)
    with pytest.raises(Exception, match="not implemented for CPU"):
        _ort(m, [("qkv", qkv)])
    _check(_ours(m, [("qkv", qkv)])[0], expected)
    q, kv = _randn(rng, 2, 3, 16), _randn(rng, 2, 6, 2, 2, 8)
    unpacked = [("q", q)] + [
        (n, np.ascontiguousarray(kv[:, :, :, i]).reshape(2, 6, 16)) for i, n in enumerate("kv")
    ]
    (expected,) = _ort(_model("MultiHeadAttention", unpacked, ["y"], MS, num_heads=2), unpacked)
    packed = [("q", q), ("kv", kv)]
    _check(_ours(_model("MultiHeadAttention", packed, ["y"], MS, num_heads=2), packed)[0], expected)


def test_multi_head_attention_causal_with_other_key_lengths():
    rng = _rng(34)
    inputs = [
        ("q", _randn(rng, 2, 3, 16)),
        ("k", _randn(rng, 2, 6, 16)),
        ("v", _randn(rng, 2, 6, 16)),
    ]
    _against_ort("MultiHeadAttention", inputs, num_heads=2, unidirectional=1)
    m = np.ones((2, 8), np.int32)
    m[0, :3] = 0
    q = _randn(rng, 2, 3, 16)
    with_past: Inputs = [("q", q), ("k", q), ("v", q), ("", None), ("m", m), ("", None)]
    with_past += [("pk", _randn(rng, 2, 2, 5, 8)), ("pv", _randn(rng, 2, 2, 5, 8))]
    _against_ort("MultiHeadAttention", with_past, ["y", "k2", "v2"], num_heads=2, unidirectional=1)
