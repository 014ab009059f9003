"""The graph onnxruntime runs after its optimizations, mapped onto the exported graph."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.pairing.graph_map import (
    META_REPLACED,
    NODE_FUSED,
    NODE_INSERTED,
    NODE_REWRITTEN,
    NODE_UNCHANGED,
)
from onnx_sbs_nb.align.pairing.onnxruntime_session import _parse_log, ort_session, process_temp_dir
from onnx_sbs_nb.align.pairing.optimized import optimize_model
from onnx_sbs_nb.align.source.fx_metadata import FX_NODE_KEY, fx_name_from_metadata
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.records import STATUS_UNPAIRED_EP

from ...quant_models import exported


@pytest.fixture(scope="module")
def linear_all():
    ep, onx, args = exported("linear")
    return ep, onx, args, optimize_model(onx, "all")


def test_fused_node_keeps_the_names_of_its_values(linear_all):
    _, onx, _, om = linear_all
    assert "QDQSelectorActionTransformer" in om.applied
    assert "WeightBiasQuantization" in om.applied
    fused = om.node("node_linear")
    assert (fused.kind, fused.op_type, fused.domain) == (NODE_FUSED, "QGemm", "com.microsoft")
    assert set(fused.replaced) == {
        "node_dequantize_per_tensor",
        "node_dequantize_per_tensor_1",
        "node_linear",
        "node_quantize_per_tensor_2",
    }
    # it produces the value of the QuantizeLinear it swallowed, under that value's name
    proto = om.model.graph.node[fused.index]
    assert list(proto.output) == ["quantize_per_tensor_2"]
    assert om.node("quantize_per_tensor_2") is fused
    # what the fusion made internal is listed as such
    assert {om.internal[v] for v in ("linear", "dequantize_per_tensor")} == {"node_linear"}
    assert set(fused.internal) == {"linear", "dequantize_per_tensor", "dequantize_per_tensor_1"}
    # constant folding stored the quantized weight (quantized first, in forward) as an
    # int8 initializer
    assert om.folded == {"node_quantize_per_tensor": "quantize_per_tensor"}
    init = next(i for i in om.model.graph.initializer if i.name == "quantize_per_tensor")
    assert init.data_type == onnx.TensorProto.INT8
    assert [n.name for n in om.changed] == ["node_linear"]
    json.dumps(om.to_dict())


def test_metadata_is_carried_over(linear_all):
    _, onx, _, om = linear_all
    # onnxruntime writes its nodes without metadata_props: ours come from the originals
    by_name = {n.name: n for n in onx.graph.node}
    for node in om.model.graph.node:
        assert any(p.key == FX_NODE_KEY for p in node.metadata_props), node.name
        mapped = om.node(node.name)
        if mapped.kind == NODE_UNCHANGED:
            assert list(node.metadata_props) == list(by_name[node.name].metadata_props)
    fused = next(n for n in om.model.graph.node if n.name == "node_linear")
    # the fused node carries the fx node whose value it produces
    assert fx_name_from_metadata(fused) == "quantize_per_tensor_2"
    meta = {p.key: p.value for p in fused.metadata_props}
    assert "node_linear" in json.loads(meta[META_REPLACED])


def test_engine_runs_the_optimized_graph_node_by_node(linear_all):
    ep, onx, args, om = linear_all
    assert not [r for r in run_aligned(ep, onx, args) if r.failed], "the export is faithful"
    recs = list(run_aligned(ep, om.model, args))
    failing = [r for r in recs if r.failed]
    first = failing[0]
    assert (first.onnx_name, first.onnx_op_type, first.onnx_domain) == (
        "quantize_per_tensor_2",
        "QGemm",
        "com.microsoft",
    )
    assert first.err_abs >= 1  # whole quantization steps (uint8)
    # the fx values the fusion swallowed have no ONNX twin, and the map says why
    # (the weights onnxruntime folded into quantized initializers are listed as weights)
    swallowed = {r.ep_name for r in recs if r.status == STATUS_UNPAIRED_EP and r.kind == "node"}
    assert swallowed == {"linear", "dequantize_per_tensor", "dequantize_per_tensor_1"}
    assert all(om.internal[v] == "node_linear" for v in swallowed)
    # one node at a time computes what the whole optimized session computes
    sess = ort_session(om.original, "all").session
    whole = sess.run(None, {"x": args[0].numpy()})[0]
    with torch.no_grad():
        want = ep.module()(*args).numpy()
    out = next(r for r in recs if r.onnx_name == "dequantize_per_tensor_2")
    assert out.err_abs == pytest.approx(float(np.abs(whole - want).max()))


def test_nhwc_layout_nodes_belong_to_their_fused_kernel():
    ep, onx, args = exported("conv")
    om = optimize_model(onx, "all")
    assert "NhwcTransformer" in om.applied
    conv = next(n for n in om.nodes if n.op_type == "QLinearConv")
    assert conv.kind == NODE_FUSED and "node_conv2d" in conv.replaced
    transposes = [n for n in om.nodes if n.op_type == "Transpose"]
    assert len(transposes) == 2
    assert all(t.kind == NODE_INSERTED and t.group == conv.name for t in transposes)
    # the Transpose writing the conv's quantized output answers for the QLinearConv
    assert om.group("quantize_per_tensor_2") is conv
    assert om.internal["conv2d"] == conv.name
    assert [n.name for n in om.changed] == [conv.name]


def test_control_model_agrees_after_fusion():
    ep, onx, args = exported("mlp")
    om = optimize_model(onx, "all")
    assert "GemmActivationFusion" in om.applied
    fused = next(n for n in om.nodes if n.op_type == "FusedGemm")
    assert fused.kind == NODE_FUSED
    recs = list(run_aligned(ep, om.model, args))
    assert not [r for r in recs if r.failed]
    assert {r.ep_name for r in recs if r.status == STATUS_UNPAIRED_EP} == {"linear"}


def test_float16_run_in_float32_is_renamed_not_internal():
    ep, onx, args = exported("mlp16")
    om = optimize_model(onx, "basic")
    # on CPU the float16 Gemms run in float32 between Casts, under their own names
    gemm = om.node("node_linear")
    assert gemm.kind == NODE_REWRITTEN and gemm.replaced == ["node_linear"]
    assert set(om.renamed) >= {"linear", "relu"} and not om.internal
    casts = [n for n in om.nodes if n.op_type == "Cast"]
    assert casts and all(n.kind == NODE_INSERTED and n.group != n.name for n in casts)
    # the new values are declared float32: nothing pairs a float16 value with them
    types = {vi.name: vi.type.tensor_type.elem_type for vi in om.model.graph.value_info}
    assert types[om.renamed["linear"]] == onnx.TensorProto.FLOAT
    assert not [r for r in run_aligned(ep, om.model, args) if r.failed]


def test_bad_level_and_missing_provider_are_input_errors():
    _, onx, _ = exported("mlp")
    with pytest.raises(SbsInputError, match="not a level"):
        optimize_model(onx, "everything")
    missing = "TensorrtExecutionProvider"
    assert missing not in ort.get_available_providers()
    with pytest.raises(SbsInputError, match="available"):
        optimize_model(onx, "all", providers=[missing])


def test_external_data_in_and_out(tmp_path):
    _, onx, _ = exported("mlp")
    src = tmp_path / "model.onnx"
    copy = onnx.ModelProto()
    copy.CopyFrom(onx)  # onnx.save moves the weights of the proto it saves out of it
    onnx.save(copy, str(src), save_as_external_data=True, location="model.onnx.data")
    out = tmp_path / "opt.onnx"
    ort_session(onnx.load(str(src)), "basic", optimized_model_path=out)
    assert (tmp_path / "opt.onnx.data").stat().st_size > 1024  # weights went to the side file
    om = optimize_model(str(src), "basic")
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in om.model.graph.initializer}
    for init in onx.graph.initializer:
        if init.name in weights:
            np.testing.assert_array_equal(weights[init.name], onnx.numpy_helper.to_array(init))
    leftovers = [p for p in process_temp_dir().iterdir() if p.is_dir()]
    assert leftovers == []


def test_a_large_model_goes_to_onnxruntime_through_a_file(monkeypatch):
    import onnx_sbs_nb.align.pairing.onnxruntime_session as optimized

    _, onx, _ = exported("mlp")
    before = onx.SerializeToString()
    monkeypatch.setattr(optimized, "_INLINE_LIMIT", 0)  # as if it were beyond 1 GiB
    om = optimize_model(onx, "all")
    assert any(n.op_type == "FusedGemm" for n in om.nodes)
    assert onx.SerializeToString() == before  # the caller's model keeps its weights


def test_log_lines_of_others_are_given_back():
    log = "\n".join(
        [
            "2026 [I:onnxruntime:, graph_transformer.cc:30 Apply] GraphTransformer A modified: 0 with status: OK",
            "2026 [I:onnxruntime:, graph_transformer.cc:30 Apply] GraphTransformer B modified: 1 with status: OK",
            "2026 [I:onnxruntime:, graph_transformer.cc:30 Apply] GraphTransformer B modified: 1 with status: OK",
            "2026 [I:onnxruntime:, inference_session.cc:1 X] Initializing session.",
            "a line some other library printed",
        ]
    )
    applied, notes, others = _parse_log(log)
    assert applied == ["B"]
    assert others == ["a line some other library printed"]


def test_saved_quantized_program_needs_the_registration(tmp_path):
    ep, _, _ = exported("linear")
    path = tmp_path / "qdq.pt2"
    torch.export.save(ep, str(path))
    code = (
        "import sys, torch\n"
        "try:\n"
        "    torch.export.load(sys.argv[1])\n"
        "    print('loaded-before')\n"
        "except Exception:\n"
        "    print('failed-before')\n"
        "from onnx_sbs_nb.align.source.quant_ops import register_quantized_ops\n"
        "assert register_quantized_ops()\n"
        "ep = torch.export.load(sys.argv[1])\n"
        "print('loaded-after', len(list(ep.graph.nodes)))\n"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.split()
    assert lines[0] == "failed-before"  # torch alone cannot read it
    assert lines[1] == "loaded-after"


class _SquareProjections(torch.nn.Module):
    """Two square projections with a bias on 3-d inputs, as attention's q_proj/o_proj:
    onnxruntime's MatMulAddFusion turns each MatMul + Add into a Gemm."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(64, 64)
        self.o_proj = torch.nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o_proj(torch.relu(self.q_proj(x)))


def test_square_weight_of_a_fused_gemm_is_the_same_weight_transposed():
    """A 64x64 weight folded transposed for MatMul is still that weight transposed once
    the MatMul became a Gemm: it compares at 0, not as weight_differs."""
    import warnings

    torch.manual_seed(0)
    x = (torch.randn(2, 5, 64),)
    ep = torch.export.export(_SquareProjections().eval(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, x, dynamo=True, verbose=False)
    recs = list(run_aligned(ep, onx, x, optimize="all"))
    assert any(r.onnx_op_type == "Gemm" for r in recs)  # the fusion happened
    weights = [r for r in recs if r.ep_name in ("p_q_proj_weight", "p_o_proj_weight")]
    assert len(weights) == 2
    for r in weights:
        assert r.status == "ok" and r.err_abs == 0, (r.ep_name, r.status, r.comment)
        assert "transposed" in (r.comment or "")
    assert not [r for r in recs if r.failed]
