"""The TorchScript tier's rewrites for one input signature that change which aten calls
run but not one bit of their values (evaluator/fixed.py's squares, fused.py, layout.py).
Every case checks the results bit for bit against the kernels, over special values too."""

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


def _model(nodes, inputs, outputs, inits=(), dtype=TP.FLOAT) -> onnx.ModelProto:
    vi = oh.make_tensor_value_info
    g = oh.make_graph(
        nodes, "g", [vi(i, dtype, None) for i in inputs], [vi(o, dtype, None) for o in outputs]
    )
    g.initializer.extend(inits)
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def _const(name, value, dtype=np.float32) -> onnx.TensorProto:
    return onh.from_array(np.asarray(value, dtype=dtype), name)


@pytest.fixture(autouse=True)
def _jit_at_once(monkeypatch):
    monkeypatch.setattr(compiled, "JIT_AFTER", 1)


def _special(*shape, dtype=torch.float32) -> torch.Tensor:
    """Random values with NaN, infinities, -0.0, huge and tiny values among them."""
    x = torch.randn(*shape, dtype=dtype)
    flat = x.view(-1)
    specials = [float("nan"), float("inf"), -float("inf"), -0.0, 1e30, -1e-30, 3e-39]
    for i, v in enumerate(specials):
        if i * 5 < flat.numel():
            flat[i * 5] = v
    return x


def _source(model, feeds: dict, runs: int = 3) -> str:
    """The signature code of the plan after its move to TorchScript, each run's outputs
    checked bit for bit against the kernels'."""
    ev = TorchOnnxEvaluator(model)
    plan = ev._plans[tuple(ev.output_names)]
    with torch.inference_mode():
        expected = plan.slow([feeds[n].clone() for n in plan.input_names], ())
    for _ in range(runs):
        got = ev.run(None, feeds)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
            bits = torch.int64 if g.dtype == torch.float64 else torch.int32
            assert torch.equal(g.view(bits), e.view(bits))
    assert plan.fast.__name__ == "run_scripted"
    return plan.fast.signature_source


@pytest.mark.parametrize("dtype", [TP.FLOAT, TP.DOUBLE])
def test_square_is_one_product(dtype):
    torch_dtype = torch.float32 if dtype == TP.FLOAT else torch.float64
    nodes = [oh.make_node("Pow", ["x", "two"], ["t"]), oh.make_node("Add", ["t", "x"], ["y"])]
    m = _model(nodes, ["x"], ["y"], [_const("two", 2, np.int64)], dtype)
    source = _source(m, {"x": _special(4, 8, dtype=torch_dtype)})
    assert "torch.mul(s1, s1)" in source and "pow" not in source, source


def test_other_exponents_keep_pow():
    nodes = [oh.make_node("Pow", ["x", "e"], ["y"])]
    m = _model(nodes, ["x"], ["y"], [_const("e", 3.0)])
    assert "torch.pow(" in _source(m, {"x": _special(4, 8)})


def _rms(read_mean_again: bool = False) -> onnx.ModelProto:
    nodes = [
        oh.make_node("Pow", ["x", "two"], ["sq"]),
        oh.make_node("ReduceMean", ["sq", "axes"], ["m"], keepdims=1),
        oh.make_node("Add", ["m", "eps"], ["v"]),
        oh.make_node("Sqrt", ["v"], ["r"]),
        oh.make_node("Div", ["x", "r"], ["y"]),
    ]
    outputs = ["y", "m"] if read_mean_again else ["y"]
    inits = [
        _const("two", 2.0),
        _const("eps", 1e-6),
        onh.from_array(np.array([-1], dtype=np.int64), "axes"),
    ]
    return _model(nodes, ["x"], outputs, inits)


def test_mean_then_add_is_sum_then_addcdiv():
    source = _source(_rms(), {"x": _special(2, 8, 24)})
    assert "torch.sum(" in source and "torch.addcdiv(c" in source, source
    assert "torch.mean(" not in source


def test_mean_read_again_keeps_its_division():
    source = _source(_rms(read_mean_again=True), {"x": _special(2, 8, 24)})
    assert "addcdiv" not in source and "torch.mean(" in source, source


def _rope_scores(transposed_key: bool) -> onnx.ModelProto:
    """q: [2, 8, 4, 16] -> [2, 4, 8, 16] (a permuted view) times a table, then q @ k."""
    nodes = [
        oh.make_node("Transpose", ["q"], ["qt"], perm=[0, 2, 1, 3]),
        oh.make_node("Mul", ["qt", "cos"], ["qc"]),
        oh.make_node("Mul", ["qc", "scale"], ["qs"]),
    ]
    if transposed_key:
        # the product's layout reaches a MatMul that reads it as a transposed operand
        # (k: [2, 4, 8, 16]; its last two axes swapped stay a view in the batched MatMul)
        nodes.append(oh.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
        nodes.append(oh.make_node("Mul", ["kt", "scale"], ["ks"]))
        nodes.append(oh.make_node("MatMul", ["qs", "ks"], ["y"]))
    else:
        nodes.append(oh.make_node("MatMul", ["qs", "k"], ["y"]))
    inits = [_const("cos", np.random.randn(1, 1, 8, 16)), _const("scale", 0.5)]
    return _model(nodes, ["q", "k"], ["y"], inits)


def test_product_on_a_permuted_view_is_written_contiguous():
    feeds = {"q": _special(2, 8, 4, 16), "k": torch.randn(2, 4, 16, 8)}
    source = _source(_rope_scores(False), feeds)
    assert "out=torch.empty([2, 4, 8, 16], dtype=torch.float32)" in source, source


def test_layout_read_by_a_matmul_as_it_is_stays():
    feeds = {"q": _special(2, 8, 4, 16), "k": torch.randn(2, 4, 8, 16)}
    source = _source(_rope_scores(True), feeds)
    # q's product is still rewritten (its MatMul copied it); k's is not (read transposed)
    assert source.count("out=torch.empty(") == 1, source
    assert "out=torch.empty([2, 4, 8, 16]" in source


def test_no_rewrite_when_no_copy_goes_away():
    nodes = [
        oh.make_node("Transpose", ["x"], ["xt"], perm=[1, 0]),
        oh.make_node("Mul", ["xt", "w"], ["y"]),
    ]
    m = _model(nodes, ["x"], ["y"], [_const("w", np.random.randn(4, 3))])
    source = _source(m, {"x": _special(3, 4)})
    assert "out=" not in source, source
