"""Pairing two ONNX models of one program: every pair proven by running both models."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

from onnx_sbs_nb.align.pairing.onnx_pairing import pair_onnx_models
from onnx_sbs_nb.align.pairing.optimized import optimize_model
from onnx_sbs_nb.align.pairing.rules import PAIRED_BY_METADATA, PAIRED_BY_NAME, PAIRED_BY_POSITION
from onnx_sbs_nb.align.pairing.values import TRANSFORM_CAST
from onnx_sbs_nb.align.source.fx_metadata import fx_name_from_metadata
from onnx_sbs_nb.records import KIND_INPUT, KIND_OUTPUT, KIND_WEIGHT

from ...models import Attention, export
from ...onnx_values import onnx_values
from ...quant_models import FloatMLP, exported


@functools.cache
def attention():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    ep, onx = export(Attention(), (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = torch.onnx.export(ep, (x,), dynamo=True, optimize=False).model_proto
    return onx, raw, {"x": x.numpy()}


def all_values(model: onnx.ModelProto, feeds) -> dict[str, np.ndarray]:
    values = {**feeds, **ReferenceEvaluator(model).run(None, feeds, intermediate=True)}
    for init in model.graph.initializer:
        values[init.name] = onnx.numpy_helper.to_array(init)
    return values


def assert_pairs_hold(pairing, ref_values, cand_values, atol=1e-5):
    """Each pair holds the same numbers in both models (both exports are faithful)."""
    for pair in pairing.by_onnx.values():
        want = ref_values[pair.fx_name]
        got = cand_values[pair.onnx_name]
        if pair.transform == TRANSFORM_CAST:
            got = got.astype(want.dtype)
        else:
            assert got.dtype == want.dtype, pair
        np.testing.assert_allclose(got, want, atol=atol, rtol=atol, err_msg=str(pair))


def n_values(model: onnx.ModelProto) -> int:
    g = model.graph
    names = [*(o for n in g.node for o in n.output if o), *(i.name for i in g.input)]
    return len({*names, *(i.name for i in g.initializer)})


def test_a_model_against_itself_pairs_everything_by_name():
    _, onx, _ = exported("linear")
    pairing = pair_onnx_models(onx, onx)
    assert len(pairing) == n_values(onx)
    assert {p.rule for p in pairing.by_onnx.values()} == {PAIRED_BY_NAME}
    assert all(p.onnx_name == p.fx_name and p.transform is None for p in pairing.by_onnx.values())
    kinds = {p.onnx_name: p.kind for p in pairing.by_onnx.values()}
    assert kinds["x"] == KIND_INPUT and kinds["dequantize_per_tensor_2"] == KIND_OUTPUT
    assert kinds["weight"] == KIND_WEIGHT


def test_a_changed_node_keeps_its_pair():
    _, onx, _ = exported("mlp")
    changed = onnx.ModelProto()
    changed.CopyFrom(onx)
    relu = next(n for n in changed.graph.node if n.op_type == "Relu")
    relu.op_type = "Sigmoid"
    pairing = pair_onnx_models(onx, changed)
    # the value is the same fx node's: it pairs, and the run will show it differs
    assert pairing.by_onnx[relu.output[0]].fx_name == relu.output[0]
    assert len(pairing) == len(pair_onnx_models(onx, onx))


def test_export_before_and_after_the_exporters_optimizer():
    onx, raw, feeds = attention()
    pairing = pair_onnx_models(onx, raw)
    # every value of the reference named after the fx node it computes finds its twin...
    fx_named = [o for n in onx.graph.node for o in n.output if o == fx_name_from_metadata(n)]
    assert len(fx_named) > 5 and all(v in pairing.by_fx for v in fx_named)
    # ...while exporter counters naming another computation in the other export do not
    assert_pairs_hold(pairing, all_values(onx, feeds), all_values(raw, feeds))
    unpaired = [
        v for v in (o for n in raw.graph.node for o in n.output) if v not in pairing.by_onnx
    ]
    assert unpaired  # the unoptimized export has values of its own (sequences, constants)


def test_onnxruntime_optimized_graph_pairs_but_its_internal_values():
    onx, _, feeds = attention()
    om = optimize_model(onx, "extended")
    pairing = pair_onnx_models(onx, om.model)
    named = [o for n in onx.graph.node for o in n.output if o]
    unpaired = {v for v in named if v not in pairing.by_fx}
    assert unpaired == set(om.internal)  # what the fusions made internal, nothing else
    assert_pairs_hold(
        pairing,
        all_values(onx, feeds),
        onnx_values(om.model, feeds, optimize=False, initializers=True),
    )


def test_float32_against_float16_pairs_through_a_cast():
    ep, onx, args = exported("mlp")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        half = FloatMLP().half().eval()
        args16 = (args[0].half(),)
        onx16 = torch.onnx.export(
            torch.export.export(half, args16), args16, dynamo=True
        ).model_proto
    pairing = pair_onnx_models(onx, onx16)
    assert len(pairing) == len(pair_onnx_models(onx, onx))
    assert {p.transform for p in pairing.by_onnx.values()} == {TRANSFORM_CAST}
    ref = all_values(onx, {"x": args[0].numpy()})
    cand = all_values(onx16, {"x": args16[0].numpy()})
    assert_pairs_hold(pairing, ref, cand, atol=2e-2)


def test_renamed_values_pair_by_metadata_and_position():
    _, onx, _ = exported("mlp")
    other = onnx.ModelProto()
    other.CopyFrom(onx)
    g = other.graph
    relu = next(n for n in g.node if n.op_type == "Relu")
    old = relu.output[0]
    renames = {old: "renamed_by_a_tool", g.input[0].name: "input_0"}
    for n in g.node:
        n.input[:] = [renames.get(i, i) for i in n.input]
        n.output[:] = [renames.get(o, o) for o in n.output]
    g.input[0].name = "input_0"
    pairing = pair_onnx_models(onx, other)
    p = pairing.by_onnx["renamed_by_a_tool"]
    assert (p.fx_name, p.rule) == (old, PAIRED_BY_METADATA)
    p = pairing.by_onnx["input_0"]
    assert (p.fx_name, p.rule, p.kind) == (onx.graph.input[0].name, PAIRED_BY_POSITION, KIND_INPUT)


def test_types_that_cannot_be_compared_do_not_pair():
    _, onx, _ = exported("linear")
    other = onnx.ModelProto()
    other.CopyFrom(onx)
    # an int value renamed onto a float one: same name, incompatible type
    for vi in other.graph.value_info:
        if vi.name == "linear":
            vi.type.tensor_type.elem_type = onnx.TensorProto.INT64
    pairing = pair_onnx_models(onx, other)
    assert "linear" not in pairing.by_onnx


@pytest.mark.parametrize("name", ["linear", "conv"])
def test_quantized_exports_against_their_optimized_graphs(name):
    _, onx, args = exported(name)
    om = optimize_model(onx, "all")
    pairing = pair_onnx_models(onx, om.model)
    named = {o for n in onx.graph.node for o in n.output if o}
    assert named - set(pairing.by_fx) == set(om.internal)
    assert pairing.by_onnx["quantize_per_tensor_2"].fx_name == "quantize_per_tensor_2"
