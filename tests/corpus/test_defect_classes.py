"""One small case per issue-10 defect class that the zoo does not already show.

Classes 1 (Resize with sizes), 3 (folded BatchNorm) and 4 (blame inside a lowering) fail
in the zoo and the real-bug tests (tests/corpus/known.py); the cases below cover 2, 5, 6,
7, 8 and 9 with models built here.  Those failing today are xfail(strict=True); the
others guard what already works.
"""

from __future__ import annotations

import warnings

import onnx
import pytest
import torch
from onnx import helper

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.run import AlignedRun, SbsInputError
from onnx_sbs_nb.records import RECORD_FIELDS
from tests.corpus.faults import copy_model, set_attribute, swap_op
from tests.corpus.naming import named_correctly

pytestmark = pytest.mark.corpus


def _export(model, args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model.eval(), args)
        onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return ep, onx, args


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)
        self.norm = torch.nn.LayerNorm(8)

    def forward(self, x):
        return self.norm(torch.relu(self.fc(x)) + x)


class Deep(torch.nn.Module):
    """Four blocks in sequence: room for two independent faults."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(4))

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return torch.softmax(x, dim=-1)


@pytest.fixture(scope="module")
def deep():
    torch.manual_seed(0)
    return _export(Deep(), (torch.randn(3, 8),))


def _nodes(onx, op):
    return [n for n in onx.graph.node if n.op_type == op]


# --------------------------------------------------------------- class 5: own errors go on


def test_second_independent_fault_keeps_its_own_error(deep):
    """Class 5 after a node that computed a wrong value: passes today (a guard)."""
    ep, onx, args = deep
    relus, adds = _nodes(onx, "Relu"), _nodes(onx, "Add")
    first, second = relus[0].name, adds[-1].name
    bad = swap_op(second, "Sub")(swap_op(first, "Sigmoid")(onx))
    records = list(run_aligned(ep, bad, args, rerun_with_torch_inputs=True))
    by_node = {
        bad.graph.node[r.onnx_id_node].name: r for r in records if (r.onnx_id_node or -1) >= 0
    }
    assert by_node[first].passed2 is False
    assert by_node[second].passed2 is False, (by_node[second].err_abs, by_node[second].comment)


def test_fault_after_an_erroring_node_keeps_its_own_error(deep):
    ep, onx, args = deep
    norms, adds = _nodes(onx, "LayerNormalization"), _nodes(onx, "Add")
    # an axis out of range: onnxruntime cannot run that node; the run must go on
    broken, second = norms[0].name, adds[-1].name
    bad = swap_op(second, "Sub")(set_attribute(broken, "axis", 7)(onx))
    records = list(run_aligned(ep, bad, args, rerun_with_torch_inputs=True))
    by_node = {
        bad.graph.node[r.onnx_id_node].name: r for r in records if (r.onnx_id_node or -1) >= 0
    }
    assert by_node[broken].status == "error"
    assert by_node[second].passed2 is False, (by_node[second].err_abs, by_node[second].error)


# ------------------------------------------------- class 6: a wrong model never passes


def _identity_model(onx: onnx.ModelProto) -> onnx.ModelProto:
    """A model with the same input whose output is that input: it computes nothing."""
    m = copy_model(onx)
    inp = m.graph.input[0]
    del m.graph.node[:]
    del m.graph.initializer[:]
    del m.graph.value_info[:]
    del m.graph.output[:]
    m.graph.output.extend([inp])
    return m


def test_model_that_returns_its_input_never_passes(deep):
    ep, onx, args = deep
    bad = _identity_model(onx)
    try:
        records = list(run_aligned(ep, bad, args))
    except SbsInputError as e:  # an unrelated model may be rejected early, saying so
        assert "input" in str(e)
        return
    assert summarize(records).verdict != "pass"


def test_unpaired_program_output_fails_the_verdict(deep):
    """The last node's output renamed: the program output pairs with nothing by name."""
    ep, onx, args = deep
    m = copy_model(onx)
    old = m.graph.output[0].name
    last = next(n for n in m.graph.node if old in n.output)
    last.op_type = "Identity"  # and it no longer computes the softmax
    del last.attribute[:]
    records = list(run_aligned(ep, m, args))
    assert summarize(records).verdict != "pass"


# ---------------------------------------------------- class 7: actions hit their node


def test_actions_hit_the_node_of_the_record_when_names_collide(deep):
    ep, onx, args = deep
    m = copy_model(onx)
    relu = _nodes(m, "Relu")[0]
    value = relu.output[0]
    # an earlier node takes, as its node name, the name of the Relu's output value
    producer_of_input = next(n for n in m.graph.node if relu.input[0] in n.output)
    producer_of_input.name = value
    run = AlignedRun(ep, m, args, rerun_with_torch_inputs=True)
    records = list(run)
    rec = next(r for r in records if r.onnx_name == value)
    # by identity (the record, or its node position): always the Relu
    for node in (rec, rec.onnx_id_node):
        detail = run.actions.node_detail(node)
        assert detail["onnx_id_node"] == rec.onnx_id_node and detail["op_type"] == "Relu"
        assert run.actions.rerun_in_torch(node)["op_type"] == "Relu"
    # by the colliding name: refused, naming both nodes, never the wrong one silently
    with pytest.raises(SbsInputError, match="names several ONNX nodes.*Relu"):
        run.actions.node_detail(value)


# -------------------------------------------------------- class 8: the user's own names


def test_records_carry_user_names_module_paths_and_source(deep):
    """Class 8 (fixed on main in 0e3eea3): a guard."""
    ep, onx, args = deep
    records = list(run_aligned(ep, onx, args))
    users = {r.ep_name: getattr(r, "ep_user_name", None) for r in records}
    assert any(users.values()), "no record has ep_user_name"
    modules = [getattr(r, "ep_module", None) or "" for r in records]
    assert any("blocks.2.fc" in m for m in modules), sorted(set(modules))[:10]
    sources = [getattr(r, "ep_source", None) or "" for r in records]
    assert any("test_defect_classes.py" in s for s in sources)


# ------------------------------------------- class 9: the prior art's own expectations


def test_evaluator_rejects_unknown_attribute_when_built():
    """Class 9 (fixed on main in af7ca03): a guard."""
    from onnx_sbs_nb import TorchOnnxEvaluator

    node = helper.make_node("Relu", ["x"], ["y"], name="my_relu", foo=3)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    with pytest.raises(Exception) as info:
        TorchOnnxEvaluator(model)
    text = str(info.value)
    assert "my_relu" in text and "Relu" in text and "foo" in text


def test_record_has_err_dev2():
    """Class 9, second half (fixed on main in 0e3eea3): a guard."""
    assert "err_dev2" in RECORD_FIELDS


# ------------------------------------------ class 2: a pairing is proven by its shape


class PermuteChain(torch.nn.Module):
    """Transposes the exporter's optimizer merges: intermediate axes orders vanish."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(5, 5)

    def forward(self, x):  # x: (2, 3, 4, 5)
        y = self.fc(x).permute(0, 2, 1, 3)  # (2, 4, 3, 5)
        z = y.transpose(1, 3)  # (2, 5, 3, 4)
        w = z.permute(0, 3, 2, 1) * 2  # (2, 4, 3, 5)
        return torch.tanh(w).transpose(2, 3).reshape(2, 4, 15)


@pytest.fixture(scope="module")
def permute_chain():
    torch.manual_seed(0)
    return _export(PermuteChain(), (torch.randn(2, 3, 4, 5),))


def test_pairs_have_matching_shapes_and_faults_are_named(permute_chain):
    """Every pair of a faithful run has equal shapes; a fault after the merged Transposes
    is named (a wrongly paired value would be fed as a torch input to the reruns)."""
    ep, onx, args = permute_chain
    records = list(run_aligned(ep, onx, args, rerun_with_torch_inputs=True))
    mismatched = [
        (r.ep_name, r.onnx_name, r.ep_shape_type, r.onnx_shape_type)
        for r in records
        if r.ep_shape_type and r.onnx_shape_type and r.ep_shape_type != r.onnx_shape_type
    ]
    assert not mismatched
    assert summarize(records).verdict == "pass"
    tanh = _nodes(onx, "Tanh")[0].name
    bad = swap_op(tanh, "Sigmoid")(onx)
    s = summarize(run_aligned(ep, bad, args, rerun_with_torch_inputs=True), node_inputs=bad)
    assert named_correctly(s, bad, tanh), s.to_text()
