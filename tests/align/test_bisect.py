"""bisect_optimizers: the onnxruntime optimizer behind an optimized session's disagreement."""

from __future__ import annotations

import json

import onnx
import pytest

from onnx_sbs_nb.align.bisect import (
    AGREES,
    EXPORT_DISAGREES,
    FOUND,
    bisect_optimizers,
    minimal_disabling_set,
)
from onnx_sbs_nb.align.pairing.graph_map import NODE_FUSED, NODE_REWRITTEN
from onnx_sbs_nb.errors import SbsInputError

from ..quant_models import cpu_features, exported, u8s8_saturates


def test_bias_quantization_is_named_at_level_all():
    ep, onx, args = exported("linear")
    steps = []
    blame = bisect_optimizers(ep, onx, args, level="all", progress=steps.append)
    assert blame.verdict == FOUND, blame.message
    # the int32 bias is what moves outputs by a step; without it no QGemm is formed either
    assert blame.optimizers == ["WeightBiasQuantization"]
    assert (blame.node, blame.node_op_type, blame.node_kind) == ("node_linear", "QGemm", NODE_FUSED)
    assert "node_linear" in blame.node_replaced
    assert blame.value == "quantize_per_tensor_2" and blame.err_abs >= 1
    assert blame.unoptimized_err_abs == 0 and blame.fixed_err_abs == 0
    assert blame.optimized_err_abs > 0
    # a handful of sessions, each reported while it ran
    assert 4 <= blame.sessions <= 10
    assert [s.sessions for s in steps] == list(range(1, len(steps) + 1))
    assert all(s.estimate >= s.sessions for s in steps)
    assert steps[0].disabled == [] and steps[0].agrees
    assert "WeightBiasQuantization" in blame.message
    json.dumps(blame.to_dict())


def test_bias_quantization_at_level_basic_names_the_rewritten_gemm():
    ep, onx, args = exported("linear")
    blame = bisect_optimizers(ep, onx, args, level="basic")
    assert blame.optimizers == ["WeightBiasQuantization"]
    # the Gemm now adds a dequantized int32 bias: its own output is already off
    assert (blame.node, blame.node_op_type, blame.node_kind) == (
        "node_linear",
        "Gemm",
        NODE_REWRITTEN,
    )
    assert blame.value == "linear"


def test_first_diverging_node_of_an_nhwc_conv_is_the_qlinearconv():
    ep, onx, args = exported("conv")
    blame = bisect_optimizers(ep, onx, args, level="all")
    assert blame.verdict == FOUND
    assert blame.optimizers == ["WeightBiasQuantization"]
    # the value is written by a layout Transpose, the node named is the kernel
    assert blame.node_op_type == "QLinearConv"
    assert "node_conv2d" in blame.node_replaced


def test_int8_saturation_depends_on_the_host_cpu():
    """Host-dependent: u8 x s8 kernels saturate on x86 with AVX2 but no VNNI."""
    ep, onx, args = exported("matmul")
    blame = bisect_optimizers(ep, onx, args, level="all")
    host = f"host CPU: {cpu_features()}, u8s8 saturates: {u8s8_saturates()}"
    if u8s8_saturates():
        assert blame.verdict == FOUND, host
        assert blame.optimizers == ["QDQSelectorActionTransformer"], host
        assert (blame.node_op_type, blame.node_kind) == ("QLinearMatMul", NODE_FUSED), host
        assert blame.err_abs >= 2, host  # several uint8 steps, not a rounding
    else:
        # exact int32 accumulation: at most a rounding step from the float path
        assert blame.verdict == AGREES or blame.err_abs <= 1, (host, blame.to_dict())


def test_control_model_has_nothing_to_bisect():
    ep, onx, args = exported("mlp")
    blame = bisect_optimizers(ep, onx, args, level="all")
    assert blame.verdict == AGREES
    assert blame.optimizers == [] and blame.node is None
    assert blame.sessions == 2
    assert "GemmActivationFusion" in blame.applied


def test_a_wrong_export_is_not_an_optimizer_problem():
    ep, onx, args = exported("mlp")
    broken = onnx.ModelProto()
    broken.CopyFrom(onx)
    relu = next(n for n in broken.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"
    blame = bisect_optimizers(ep, broken, args, level="all")
    assert blame.verdict == EXPORT_DISAGREES
    assert blame.sessions == 1 and "run_aligned" in blame.message


def test_bad_level():
    ep, onx, args = exported("mlp")
    with pytest.raises(SbsInputError, match="level"):
        bisect_optimizers(ep, onx, args, level="max")


@pytest.mark.parametrize("needed", [{"c"}, {"b", "g"}, {"a", "h"}, set("abcdefgh")])
def test_minimal_disabling_set(needed):
    calls = []

    def agrees(disabled):
        calls.append(list(disabled))
        return needed <= set(disabled)

    found = minimal_disabling_set(list("abcdefgh"), agrees)
    assert set(found) == needed
    assert len(calls) <= 1 + len(needed) * 4  # log2(8) + 1 per name found
