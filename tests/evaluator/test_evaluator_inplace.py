"""The TorchScript tier's code for one input signature (evaluator/inplace.py, fixed.py):
steps writing into dying values, the fused NaN guard, forms without run-time checks. Every case checks the
results bit for bit against the kernels, and that what must not be overwritten (feeds,
constants, outputs, views still read) keeps its values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as onh

from onnx_sbs_nb.evaluator import compiled
from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator


def _vi(name, shape=None):
    return oh.make_tensor_value_info(name, TP.FLOAT, shape)


def _model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = oh.make_graph(nodes, "g", [_vi(i) for i in inputs], [_vi(o) for o in outputs], inits)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def _init(name, value) -> onnx.TensorProto:
    return onh.from_array(np.asarray(value, dtype=np.float32), name)


@pytest.fixture(autouse=True)
def _jit_at_once(monkeypatch):
    monkeypatch.setattr(compiled, "JIT_AFTER", 1)


def _scripted_runs(model, feeds: dict, runs: int = 3):
    """The plan after its move to TorchScript, and each run's outputs checked bit for bit
    against the kernels' (feeds compared with copies taken before)."""
    ev = TorchOnnxEvaluator(model)
    plan = ev._plans[tuple(ev.output_names)]
    before = {k: v.clone() for k, v in feeds.items()}
    with torch.inference_mode():
        expected = plan.slow([before[n] for n in plan.input_names], ())
    for _ in range(runs):
        got = ev.run(None, feeds)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape
            assert torch.equal(g.view(torch.int32), e.view(torch.int32))
        assert all(torch.equal(feeds[k], before[k]) for k in feeds)
    assert plan.fast.__name__ == "run_scripted"
    return plan, got


def test_dying_value_is_overwritten():
    nodes = [
        oh.make_node("Add", ["x", "x"], ["t"]),
        oh.make_node("Mul", ["t", "x"], ["u"]),
        oh.make_node("Neg", ["u"], ["y"]),
    ]
    plan, _ = _scripted_runs(_model(nodes, ["x"], ["y"]), {"x": torch.randn(3, 4)})
    source = plan.fast.signature_source
    assert ".mul_(" in source and ".neg_()" in source, source
    assert "x.add_" not in source and "s1.add_" not in source  # the feed is never written


def test_commutative_op_writes_into_its_second_input():
    # Mul(w, t): the constant comes first, t dies there
    nodes = [oh.make_node("Exp", ["x"], ["t"]), oh.make_node("Mul", ["w", "t"], ["y"])]
    m = _model(nodes, ["x"], ["y"], [_init("w", np.full((3, 4), 1.5))])
    plan, _ = _scripted_runs(m, {"x": torch.randn(3, 4)})
    assert ".mul_(c" in plan.fast.signature_source, plan.fast.signature_source


def test_a_view_still_read_keeps_its_base():
    # v is a view of t read after t's last use by Mul: writing t in place would change v
    nodes = [
        oh.make_node("Add", ["x", "x"], ["t"]),
        oh.make_node("Reshape", ["t", "shape"], ["v"]),
        oh.make_node("Mul", ["t", "two"], ["u"]),
        oh.make_node("Reshape", ["u", "shape"], ["u2"]),
        oh.make_node("Add", ["v", "u2"], ["y"]),
    ]
    inits = [onh.from_array(np.array([12], dtype=np.int64), "shape"), _init("two", 2.0)]
    plan, (y,) = _scripted_runs(_model(nodes, ["x"], ["y"], inits), {"x": torch.ones(3, 4)})
    assert torch.equal(y, torch.full((12,), 6.0))
    assert ".mul_(" not in plan.fast.signature_source


def test_outputs_and_their_views_are_never_written():
    nodes = [
        oh.make_node("Add", ["x", "x"], ["t"]),
        oh.make_node("Reshape", ["t", "shape"], ["o"]),  # an output viewing t
        oh.make_node("Mul", ["t", "x"], ["y"]),
    ]
    inits = [onh.from_array(np.array([12], dtype=np.int64), "shape")]
    m = _model(nodes, ["x"], ["o", "y"], inits)
    plan, (o, y) = _scripted_runs(m, {"x": torch.ones(3, 4)})
    assert torch.equal(o, torch.full((12,), 2.0)) and torch.equal(y, torch.full((3, 4), 2.0))
    assert ".mul_(" not in plan.fast.signature_source


def test_broadcasting_step_keeps_its_smaller_input():
    # t is [3, 1], the product [3, 4]: it cannot hold the result
    nodes = [oh.make_node("Sqrt", ["x"], ["t"]), oh.make_node("Mul", ["t", "w"], ["y"])]
    m = _model(nodes, ["x"], ["y"], [_init("w", np.arange(12).reshape(3, 4))])
    plan, _ = _scripted_runs(m, {"x": torch.rand(3, 1)})
    assert ".mul_(" not in plan.fast.signature_source


def test_other_signatures_run_the_plain_code():
    nodes = [oh.make_node("Add", ["x", "x"], ["t"]), oh.make_node("Mul", ["t", "x"], ["y"])]
    ev = TorchOnnxEvaluator(_model(nodes, ["x"], ["y"]))
    plan = ev._plans[("y",)]
    for x in [torch.randn(3, 4), torch.randn(5), torch.randn(4, 3).t(), torch.randn(3, 4)]:
        for _ in range(2):
            (y,) = ev.run(None, {"x": x})
            assert torch.equal(y, (x + x) * x)
        assert plan.fast.__name__ == "run_scripted"
    assert plan.fast.signature_source is not None


def test_nan_guard_after_softmax_is_one_nan_to_num():
    nodes = [
        oh.make_node("Softmax", ["x"], ["p"], axis=-1),
        oh.make_node("Add", ["p", "bias"], ["q"]),
        oh.make_node("IsNaN", ["q"], ["m"]),
        oh.make_node("Where", ["m", "zero", "q"], ["y"]),
    ]
    bias = np.array([0.0, np.nan, np.inf, -np.inf], dtype=np.float32)
    m = _model(nodes, ["x"], ["y"], [_init("bias", bias), _init("zero", -0.0)])
    plan, (y,) = _scripted_runs(m, {"x": torch.randn(2, 4)})
    assert ".nan_to_num_(" in plan.fast.signature_source, plan.fast.signature_source
    assert torch.isinf(y[:, 2:]).all() and (y[:, 1] == 0).all()
    assert torch.signbit(y[:, 1]).all()  # the constant's -0.0, not 0.0


def test_nan_guard_whose_mask_is_read_again_is_left_alone():
    nodes = [
        oh.make_node("IsNaN", ["x"], ["m"]),
        oh.make_node("Where", ["m", "zero", "x"], ["y"]),
    ]
    m = _model(nodes, ["x"], ["y"], [_init("zero", 0.0)])
    m.graph.output.append(oh.make_tensor_value_info("m", TP.BOOL, None))
    ev = TorchOnnxEvaluator(m)
    x = torch.tensor([1.0, float("nan")])
    for _ in range(3):
        y, mask = ev.run(None, {"x": x})
    assert mask.tolist() == [False, True] and y.tolist() == [1.0, 0.0]
    assert "nan_to_num" not in (ev._plans[("y", "m")].fast.signature_source or "")


@pytest.mark.parametrize("op", ["Sigmoid", "Exp", "Tanh", "Erf", "Sqrt", "Reciprocal"])
def test_unary_in_place_gives_the_same_bits(op):
    # 67 elements: vectorised body and scalar tail, as out of place
    nodes = [oh.make_node("Add", ["x", "x"], ["t"]), oh.make_node(op, ["t"], ["y"])]
    plan, _ = _scripted_runs(_model(nodes, ["x"], ["y"]), {"x": torch.rand(67) * 3 + 0.1})
    assert "_()" in plan.fast.signature_source, plan.fast.signature_source
