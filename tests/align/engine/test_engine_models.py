"""run_aligned on real exports: pairs exist, outputs and weights pair, no false alarm."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.pairing.rules import PAIRED_BY_STATE_DICT
from onnx_sbs_nb.records import (
    KIND_INPUT,
    KIND_OUTPUT,
    KIND_WEIGHT,
    STATUS_OK,
    STATUS_UNPAIRED_EP,
    STATUS_UNPAIRED_ONNX,
)

from ...models import (
    MLP,
    Attention,
    Chain,
    CloneMemoryFormat,
    Cond,
    NonZero,
    ShapeOps,
    export,
    tiny_llama,
)

UNPAIRED = {STATUS_UNPAIRED_EP, STATUS_UNPAIRED_ONNX}


def _check_faithful(records, *, n_weights=0):
    """Every paired value agrees; outputs and inputs pair; no pair is a mismatch."""
    paired = [r for r in records if r.status not in UNPAIRED]
    assert paired, "nothing was paired"
    bad = [
        (r.ep_name, r.onnx_name, r.status, r.err_abs, r.comment)
        for r in paired
        if r.status != STATUS_OK
    ]
    assert not bad, bad
    kinds = {r.kind for r in paired}
    assert KIND_OUTPUT in kinds
    weights = [r for r in paired if r.kind == KIND_WEIGHT and r.paired_by == PAIRED_BY_STATE_DICT]
    assert len(weights) >= n_weights
    # the stream is in execution order and numbered
    assert [r.step for r in records] == list(range(len(records)))
    return paired


def test_chain_pairs_every_node():
    x = torch.randn(3, 4)
    ep, onx = export(Chain(), (x,))
    recs = list(run_aligned(ep, onx, (x,)))
    paired = _check_faithful(recs)
    names = [r.ep_name for r in paired]
    assert names[0] == "x" and paired[0].kind == KIND_INPUT
    for expected in ("abs_1", "exp", "add", "log"):
        assert expected in names, names
    assert paired[-1].kind == KIND_OUTPUT and paired[-1].onnx_op_type == "Log"
    df = pd.DataFrame(recs)  # DataFrame from dataclasses, no extra step
    assert {"ep_name", "onnx_name", "err_abs", "err_rel", "err_nan", "paired_by"} <= set(df.columns)


def test_mlp_weights_compared_by_content():
    x = torch.randn(5, 8)
    ep, onx = export(MLP(), (x,))
    recs = list(run_aligned(ep, onx, (x,)))
    paired = _check_faithful(recs, n_weights=6)
    w = {r.onnx_name for r in paired if r.kind == KIND_WEIGHT}
    assert {"fc1.weight", "fc1.bias", "fc3.bias"} <= w
    assert all(r.err_abs == 0 for r in paired if r.kind == KIND_WEIGHT)


def test_shape_arithmetic():
    x = torch.randn(2, 3, 8)
    ep, onx = export(ShapeOps(), (x,))
    _check_faithful(list(run_aligned(ep, onx, (x,))))


def test_attention_sdpa():
    x = torch.randn(2, 5, 16)
    ep, onx = export(Attention(), (x,))
    recs = list(run_aligned(ep, onx, (x,)))
    paired = _check_faithful(recs, n_weights=2)
    assert any(r.ep_target.startswith("aten.scaled_dot_product_attention") for r in paired)


def test_tiny_llama_faithful():
    ep, onx, args = tiny_llama()
    recs = list(run_aligned(ep, onx, args))
    paired = _check_faithful(recs, n_weights=15)
    # transposed weights folded by the exporter are compared through the transposition
    assert any(r.comment and "transpose" in r.comment for r in paired if r.kind == KIND_WEIGHT)
    assert sum(r.kind == "node" for r in paired) >= 80
    out = [r for r in paired if r.kind == KIND_OUTPUT]
    assert len(out) == 1 and out[0].ep_shape_type == "float32[1x12x128]"
    # values in the user's words: their fx node names, module paths, source lines
    user_names = {n.name for n in ep.graph.nodes}
    nodes = [r for r in paired if r.kind == "node"]
    assert all(r.ep_user_name in user_names for r in nodes)
    q = [r for r in nodes if r.ep_module == "model.model.layers.0.self_attn.q_proj"]
    assert q and all("modeling_llama.py" in r.ep_source for r in q)
    assert all(r.onnx_node_name and r.onnx_fx_node for r in nodes if r.onnx_id_node >= 0)
    w = next(r for r in paired if r.ep_name == "p_model_model_layers_0_mlp_up_proj_weight")
    assert w.ep_module == "model.model.layers.0.mlp.up_proj"


def test_fp16_model_uses_half_tolerance():
    x = torch.randn(4, 8, dtype=torch.float16)
    ep, onx = export(MLP().half(), (x,))
    recs = list(run_aligned(ep, onx, (x,)))
    paired = _check_faithful(recs)
    halves = [r for r in paired if r.ep_shape_type.startswith("float16")]
    assert halves and all(r.atol == 1e-2 for r in halves)


def test_data_dependent_shape_nonzero():
    x = torch.randn(6, 3)
    ep, onx = export(NonZero(), (x,))
    recs = list(run_aligned(ep, onx, (x,)))
    paired = _check_faithful(recs)
    assert any("nonzero" in (r.ep_name or "") for r in paired)
    # another input with another number of non-zero elements runs too
    x2 = torch.randn(6, 3)
    _check_faithful(list(run_aligned(ep, onx, (x2,))))


def test_torch_cond():
    x = torch.randn(3, 4)
    ep, onx = export(Cond(), (x,))
    recs = list(run_aligned(ep, onx, (x,)))
    paired = _check_faithful(recs)
    assert any(r.onnx_op_type == "If" for r in paired) or any(r.onnx_op_type == "If" for r in recs)


def test_clone_memory_format_argument():
    x = torch.randn(3, 4)
    ep, onx = export(CloneMemoryFormat(), (x,))
    _check_faithful(list(run_aligned(ep, onx, (x,))))


@pytest.mark.parametrize("runner", ["reference", "torch"])
def test_other_runners_agree(runner):
    x = torch.randn(5, 8)
    ep, onx = export(MLP(), (x,))
    recs = list(run_aligned(ep, onx, (x,), runner=runner))
    _check_faithful(recs, n_weights=6)


def test_exporter_preparation_is_reproduced():
    """The private preparation step exists in the installed torch and is what we run."""
    from onnx_sbs_nb.align.source.prepare.prepared import PREPARED_BY_EXPORTER
    from onnx_sbs_nb.align.source.prepare.program import prepare_program

    x = torch.randn(3, 4)
    ep, _ = export(CloneMemoryFormat(), (x,))
    assert prepare_program(ep).source == PREPARED_BY_EXPORTER
    assert prepare_program(ep) is prepare_program(ep)  # cached per program


def test_onnx_program_carries_its_prepared_program():
    """Passing what torch.onnx.export returns skips the preparation and pairs the same."""
    import warnings

    x = torch.randn(2, 5, 16)
    model = Attention().eval()
    ep = torch.export.export(model, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(ep, (x,), dynamo=True, verbose=False)
    from onnx_sbs_nb.align.run import AlignedRun

    run = AlignedRun(ep, prog, (x,))
    assert run.prepared.source == "onnx_program"
    a = [(r.ep_name, r.onnx_name, r.status) for r in run]
    b = [(r.ep_name, r.onnx_name, r.status) for r in run_aligned(ep, prog.model_proto, (x,))]
    assert a == b


def test_tiny_llama_own_errors_pass():
    ep, onx, args = tiny_llama()
    recs = list(run_aligned(ep, onx, args, own_error=True))
    reruns = [r for r in recs if r.err_abs2 is not None]
    assert len(reruns) >= 60
    assert all(r.passed2 for r in reruns)


def test_bfloat16_model_falls_back_to_torch_kernels():
    """onnxruntime has no CPU bfloat16 kernels: those nodes run in the torch evaluator."""
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    ep, onx = export(MLP().to(torch.bfloat16), (x,))
    recs = list(run_aligned(ep, onx, (x,)))
    paired = _check_faithful(recs)
    nodes = [r for r in paired if r.kind in ("node", "output")]
    assert nodes and all(r.ep_shape_type.startswith("bfloat16") for r in nodes)
    assert any(r.comment and "torch evaluator" in r.comment for r in nodes)
