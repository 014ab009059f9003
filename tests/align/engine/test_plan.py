"""The plan and the pairing are pure: tested on hand-built graphs, without running anything."""

from __future__ import annotations

import onnx
import onnx.helper as oh
import torch

from onnx_sbs_nb.align.engine.plan import CAND, REF, build_plan
from onnx_sbs_nb.align.pairing.names import pair_values
from onnx_sbs_nb.align.pairing.rules import PAIRED_BY_METADATA, PAIRED_BY_NAME


def _fx_graph():
    g = torch.fx.Graph()
    x = g.placeholder("x")
    x.meta["val"] = torch.empty(2, 3)
    a = g.call_function(torch.ops.aten.abs.default, (x,))
    a.name = "abs_1"
    a.meta["val"] = torch.empty(2, 3)
    e = g.call_function(torch.ops.aten.exp.default, (a,))
    e.name = "exp"
    e.meta["val"] = torch.empty(2, 3)
    n = g.call_function(torch.ops.aten.neg.default, (e,))
    n.name = "neg"
    n.meta["val"] = torch.empty(2, 3)
    g.output((n,))
    return g


def _onnx_model(metadata_for_neg=True):
    t = onnx.TensorProto.FLOAT
    neg = oh.make_node("Neg", ["exp"], ["renamed"])
    if metadata_for_neg:
        p = neg.metadata_props.add()
        p.key, p.value = "pkg.torch.onnx.fx_node", "%neg : [num_users=1] = call_function[...]"
    nodes = [
        oh.make_node("Abs", ["x"], ["abs_1"]),
        oh.make_node("Exp", ["abs_1"], ["exp"]),
        neg,
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", t, [2, 3])],
        [oh.make_tensor_value_info("renamed", t, [2, 3])],
        value_info=[oh.make_tensor_value_info(n, t, [2, 3]) for n in ("abs_1", "exp")],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_pairing_rules():
    pairing = pair_values(_fx_graph(), _onnx_model(), {}, ["x"])
    assert pairing.by_onnx["abs_1"].rule == PAIRED_BY_NAME
    assert pairing.by_onnx["renamed"].fx_name == "neg"
    assert pairing.by_onnx["renamed"].rule == PAIRED_BY_METADATA
    assert pairing.by_onnx["renamed"].kind == "output"
    assert pairing.by_onnx["x"].kind == "input"


def test_outputs_pair_by_position_without_metadata():
    pairing = pair_values(_fx_graph(), _onnx_model(False), {}, ["x"])
    assert pairing.by_onnx["renamed"].fx_name == "neg"
    assert pairing.by_onnx["renamed"].rule == "position"


def test_type_mismatch_never_pairs():
    g = _fx_graph()
    for n in g.nodes:
        if n.name == "exp":
            n.meta["val"] = torch.empty(2, 3, dtype=torch.float16)
    pairing = pair_values(g, _onnx_model(), {}, ["x"])
    assert "exp" not in pairing.by_onnx


def test_schedule_orders_and_frees():
    g = _fx_graph()
    model = _onnx_model()
    pairing = pair_values(g, model, {}, ["x"])
    plan = build_plan(g, model, pairing, lambda n: [], needs_torch_inputs=False)
    kinds = [(side, idx) for side, idx in plan.steps]
    # the placeholder first, then each ONNX node right after the fx node it pairs with
    assert kinds == [(REF, 0), (REF, 1), (CAND, 0), (REF, 2), (CAND, 1), (REF, 3), (CAND, 2)]
    # every comparison happens at the step where the later of the two values appears
    compared = {name: s for s, names in plan.compare_at.items() for name in names}
    assert compared == {"x": 0, "abs_1": 2, "exp": 4, "renamed": 6}
    # abs_1 (fx) is last used by exp (fx, step 3); on the ONNX side by Exp (step 4)
    freed_fx = {name: s for s, names in plan.free_ref_at.items() for name in names}
    freed_onnx = {name: s for s, names in plan.free_cand_at.items() for name in names}
    assert freed_fx["abs_1"] == 3 and freed_onnx["abs_1"] == 4
    assert freed_fx["neg"] == 6 and freed_onnx["renamed"] == 6


def test_rerun_waits_for_torch_inputs():
    g = _fx_graph()
    model = _onnx_model()
    pairing = pair_values(g, model, {}, ["x"])
    plan = build_plan(g, model, pairing, lambda n: [], needs_torch_inputs=True)
    freed_fx = {name: s for s, names in plan.free_ref_at.items() for name in names}
    # the torch value of exp feeds the rerun of Neg (step 6): kept until then
    assert freed_fx["exp"] == 6


class _Deep(torch.nn.Module):
    def __init__(self, layers: int = 12):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(layers))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def test_weights_are_never_all_copied_at_once():
    """Weights are compared up front (their records come first, as the prior art lists
    them), but the copy made to compare each goes right after: a large model's weights
    are never all converted at once."""
    from onnx_sbs_nb.align.run import AlignedRun

    torch.manual_seed(0)
    x = torch.randn(2, 16)
    ep = torch.export.export(_Deep().eval(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    assert len(onx.graph.initializer) >= 24
    run = AlignedRun(ep, onx, (x,), runner="onnxruntime")
    live, kinds = [], []
    for rec in run:
        live.append(len(run.candidate._init_cache))
        kinds.append(rec.kind)
    weights = [k for k, rec in enumerate(run.records) if rec.kind == "weight"]
    assert len(weights) >= 24 and all(run.records[k].err_abs is not None for k in weights)
    first_node = kinds.index("node")
    assert max(weights) < first_node, kinds  # every weight before any node
    assert max(live) <= 4, live


def test_declared_types_and_shapes_in_one_reading():
    from onnx import numpy_helper

    from onnx_sbs_nb.align.pairing.values import onnx_value_shapes, onnx_value_types

    t = onnx.TensorProto
    graph = oh.make_graph(
        [oh.make_node("Relu", ["x"], ["y"])],
        "g",
        [oh.make_tensor_value_info("x", t.FLOAT, ["batch", 3])],
        [oh.make_tensor_value_info("y", t.FLOAT, None)],  # typed, no shape: rank unknown
        initializer=[numpy_helper.from_array(__import__("numpy").zeros((2, 5), "int64"), "w")],
        value_info=[
            oh.make_tensor_value_info("s", t.FLOAT16, []),  # a scalar: rank 0
            oh.make_tensor_value_info("u", t.UNDEFINED, [4]),  # a shape, no element type
            oh.make_value_info(
                "q", oh.make_sequence_type_proto(oh.make_tensor_type_proto(1, None))
            ),
        ],
    )
    model = oh.make_model(graph)
    assert onnx_value_types(model) == {
        "x": (t.FLOAT, 2),
        "y": (t.FLOAT, None),
        "s": (t.FLOAT16, 0),
        "w": (t.INT64, 2),
    }
    assert onnx_value_shapes(model) == {"x": (None, 3), "s": (), "u": (4,), "w": (2, 5)}
