"""named_correctly (tests/corpus/naming.py) on hand-made summaries: what it accepts and
what it rejects, with today's first_own_failure and with the coming summary.culprit."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from onnx_sbs_nb.records import Record
from tests.corpus.naming import named_correctly, what_summary_names

FX = "pkg.torch.onnx.fx_node"


def _node(op, inputs, outputs, name, fx):
    n = helper.make_node(op, inputs, outputs, name=name)
    if fx:
        n.metadata_props.add(key=FX, value=f"%{fx} : [num_users=1] = call_function[...]")
    return n


@pytest.fixture(scope="module")
def model():
    # a lowering of two nodes for fx "gelu" (Mul, Erf), then an Add for fx "add", and a
    # Cast the optimizer added (no metadata)
    nodes = [
        _node("MatMul", ["x", "w"], ["linear"], "node_linear", "linear"),
        _node("Mul", ["linear", "c"], ["t"], "node_Mul_1", "gelu"),
        _node("Erf", ["t"], ["gelu"], "node_gelu", "gelu"),
        _node("Add", ["gelu", "linear"], ["add"], "node_add", "add"),
        _node("Cast", ["add"], ["out"], "node_Cast_9", None),
    ]
    inits = [
        numpy_helper.from_array(np.ones((2, 2), np.float32), "fc.weight"),
        numpy_helper.from_array(np.ones((1,), np.float32), "c"),
    ]
    nodes[0].input[1] = "fc.weight"
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 2])],
        [helper.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [2, 2])],
        inits,
    )
    return helper.make_model(graph)


def _record_summary(onnx_id_node, onnx_name, ep_name, kind="node"):
    rec = Record(onnx_id_node=onnx_id_node, onnx_name=onnx_name, ep_name=ep_name, kind=kind)
    return SimpleNamespace(first_own_failure=rec, first_own_failure_rule="rerun")


def test_first_own_failure_on_the_injected_node(model):
    assert named_correctly(_record_summary(3, "add", "add"), model, "node_add")
    assert not named_correctly(_record_summary(3, "add", "add"), model, "node_linear")


def test_a_node_of_the_same_lowering_counts(model):
    # the Mul inside gelu's lowering was injected; the summary names the Erf (same fx node)
    assert named_correctly(_record_summary(2, "gelu", "gelu"), model, "node_Mul_1")
    # a node outside the lowering does not
    assert not named_correctly(_record_summary(3, "add", "add"), model, "node_Mul_1")


def test_a_node_without_metadata_does_not_count(model):
    assert not named_correctly(_record_summary(4, "out", "add_1"), model, "node_add")


def test_weight_faults(model):
    weight = _record_summary(-1, "fc.weight", "p_fc_weight", kind="weight")
    assert named_correctly(weight, model, "fc.weight")
    # its consumer counts too
    assert named_correctly(_record_summary(0, "linear", "linear"), model, "fc.weight")
    assert not named_correctly(_record_summary(3, "add", "add"), model, "fc.weight")


def test_nothing_named(model):
    s = SimpleNamespace(first_own_failure=None, culprit=None)
    assert what_summary_names(s, model) is None
    assert not named_correctly(s, model, "node_add")


def test_culprit_is_preferred_dict_or_object(model):
    rec_says_add = _record_summary(3, "add", "add")
    culprit = {"onnx_node": "node_gelu", "onnx_nodes": ["node_Mul_1", "node_gelu"],
               "ep_name": "gelu", "rule": "rerun"}  # fmt: skip
    s = SimpleNamespace(**vars(rec_says_add), culprit=culprit)
    assert named_correctly(s, model, "node_Mul_1")
    assert not named_correctly(s, model, "node_add")  # the culprit wins over the record
    s.culprit = SimpleNamespace(**culprit)
    assert named_correctly(s, model, "node_gelu")
    # a weight culprit that only gives the fx placeholder
    s.culprit = {"onnx_node": None, "onnx_nodes": [], "ep_name": "p_fc_weight"}
    assert named_correctly(s, model, "fc.weight")
    assert not named_correctly(s, model, "node_add")
