"""TorchOnnxEvaluator core: API, feeds, kernels by opset, subgraphs, functions, memory."""

from __future__ import annotations

import gc
import os
import pathlib
import subprocess
import sys
import weakref

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as onh

from onnx_sbs_nb.evaluator import supported_ops as supported_ops_pkg
from onnx_sbs_nb.evaluator.attributes import UnknownAttributeError
from onnx_sbs_nb.evaluator.compiled import MissingKernelError, NodeError
from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator, compile_node, supported_ops

F = TP.FLOAT


def _vi(name, elem=F, shape=None):
    return oh.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, inits=(), opset=18, functions=(), extra_opsets=()):
    g = oh.make_graph(nodes, "g", inputs, outputs, list(inits))
    return oh.make_model(
        g,
        opset_imports=[oh.make_opsetid("", opset), *extra_opsets],
        functions=list(functions),
        ir_version=10,
    )


def _run1(nodes, feeds, opset=18, inits=(), outputs=("y",)):
    m = _model(nodes, [_vi(k) for k in feeds], [_vi(o) for o in outputs], inits, opset)
    return TorchOnnxEvaluator(m).run(None, feeds)


@pytest.fixture
def small_model():
    w = onh.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    nodes = [
        oh.make_node("Add", ["x", "x"], ["t"]),
        oh.make_node("MatMul", ["t", "w"], ["m"]),
        oh.make_node("Shape", ["m"], ["s"]),
        oh.make_node("Relu", ["m"], ["y"]),
    ]
    return _model(nodes, [_vi("x", F, ["N", 4])], [_vi("y", F, ["N", 3]), _vi("s", TP.INT64)], [w])


# -- API ----------------------------------------------------------------------------------


def test_api_like_onnxruntime(small_model, tmp_path):
    ev = TorchOnnxEvaluator(small_model)
    (inp,) = ev.get_inputs()
    assert (inp.name, inp.type, inp.shape) == ("x", "tensor(float)", ["N", 4])
    assert [o.name for o in ev.get_outputs()] == ["y", "s"]
    x = np.random.randn(2, 4).astype(np.float32)
    y, s = ev.run(None, {"x": x})
    assert isinstance(y, np.ndarray) and isinstance(s, np.ndarray)
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    np.testing.assert_allclose(y, np.maximum((x + x) @ w, 0), rtol=1e-6)
    assert s.tolist() == [2, 3]
    yt, st = ev.run(None, {"x": torch.from_numpy(x)})
    assert isinstance(yt, torch.Tensor) and isinstance(st, torch.Tensor)
    (only_s,) = ev.run(["s"], {"x": torch.from_numpy(x)})
    assert only_s.tolist() == [2, 3]
    path = tmp_path / "m.onnx"
    onnx.save(small_model, str(path))
    (y2, _) = TorchOnnxEvaluator(str(path)).run(None, {"x": x})
    np.testing.assert_array_equal(y, y2)


def test_bad_feeds_are_named(small_model):
    ev = TorchOnnxEvaluator(small_model)
    with pytest.raises(KeyError, match="missing feed 'x'"):
        ev.run(None, {})
    with pytest.raises(KeyError, match="unknown feeds"):
        ev.run(None, {"x": np.zeros((1, 4), np.float32), "z": np.zeros(1)})
    with pytest.raises(ValueError, match="not a value of the model"):
        ev.run(["nope"], {"x": np.zeros((1, 4), np.float32)})


def test_torch_feeds_not_copied():
    m = _model([oh.make_node("Identity", ["x"], ["y"])], [_vi("x")], [_vi("y")])
    x = torch.randn(3)
    (y,) = TorchOnnxEvaluator(m).run(None, {"x": x})
    assert y.data_ptr() == x.data_ptr()


def test_results_are_ordinary_tensors(small_model):
    # The run uses inference mode; what the caller gets back must not carry its limits.
    x = torch.randn(2, 4, requires_grad=True)
    y, s = TorchOnnxEvaluator(small_model).run(None, {"x": x})
    assert not y.is_inference() and not s.is_inference()
    assert not y.requires_grad
    y.add_(1)  # in place, outside inference mode
    s.mul_(2)
    y.requires_grad_()
    (y * 2).sum().backward()
    assert y.grad is not None


def test_second_run_other_shapes_and_dtypes():
    nodes = [
        oh.make_node("Mul", ["x", "x"], ["t"]),
        oh.make_node("ReduceSum", ["t"], ["y"], keepdims=0),
    ]
    m = _model(nodes, [_vi("x")], [_vi("y")])
    ev = TorchOnnxEvaluator(m)
    (a,) = ev.run(None, {"x": torch.ones(2, 3)})
    (b,) = ev.run(None, {"x": torch.ones(5, dtype=torch.float64)})
    (c,) = ev.run(None, {"x": torch.arange(4, dtype=torch.int32)})
    assert a.item() == 6 and b.dtype == torch.float64 and b.item() == 5
    assert c.dtype == torch.int32 and c.item() == 14


def test_graph_node_and_function_models():
    node = oh.make_node("Sub", ["a", "b"], ["c"])
    (c,) = TorchOnnxEvaluator(node, opsets={"": 18}).run(
        None, {"a": torch.tensor([3.0]), "b": torch.tensor([1.0])}
    )
    assert c.tolist() == [2.0]
    g = oh.make_graph([node], "g", [_vi("a"), _vi("b")], [_vi("c")])
    (c,) = TorchOnnxEvaluator(g, opsets=18).run(
        None, {"a": torch.tensor([3.0]), "b": torch.tensor([1.0])}
    )
    assert c.tolist() == [2.0]
    f = oh.make_function("local", "f", ["a", "b"], ["c"], [node], [oh.make_opsetid("", 18)])
    (c,) = TorchOnnxEvaluator(f).run(None, {"a": torch.tensor([3.0]), "b": torch.tensor([1.0])})
    assert c.tolist() == [2.0]
    with pytest.raises(ValueError, match="opsets"):
        TorchOnnxEvaluator(node)


# -- kernels: lookup, custom, missing ---------------------------------------------------------


def test_custom_kernels_override_and_extend():
    nodes = [
        oh.make_node("Add", ["x", "x"], ["t"]),
        oh.make_node("Twice", ["t"], ["y"], domain="my.domain", factor=3),
    ]
    m = _model(nodes, [_vi("x")], [_vi("y")], extra_opsets=[oh.make_opsetid("my.domain", 1)])
    with pytest.raises(MissingKernelError) as err:
        TorchOnnxEvaluator(m)
    msg = str(err.value)
    assert "'Twice'" in msg and "my.domain" in msg and "opset 1" in msg
    assert "supported_ops()" in msg

    def twice(x, factor=2):
        return x * factor

    def sub_instead_of_add(a, b):
        return a - b

    ev = TorchOnnxEvaluator(
        m,
        custom_kernels={("my.domain", "Twice"): twice, ("", "Add"): sub_instead_of_add},
    )
    (y,) = ev.run(None, {"x": torch.tensor([1.0, 2.0])})
    assert y.tolist() == [0.0, 0.0]
    ev = TorchOnnxEvaluator(m, custom_kernels={("my.domain", "Twice"): twice})
    (y,) = ev.run(None, {"x": torch.tensor([1.0, 2.0])})
    assert y.tolist() == [6.0, 12.0]


def test_supported_ops_listing():
    ops = supported_ops()
    assert ops == supported_ops_pkg()
    assert ("", "Add", 7) in ops and ("", "Split", 13) in ops
    assert all(isinstance(v, int) for _, _, v in ops)


def test_kernel_failure_names_the_node():
    nodes = [oh.make_node("Reshape", ["x", "s"], ["y"], name="bad_reshape")]
    m = _model(nodes, [_vi("x"), _vi("s", TP.INT64)], [_vi("y")])
    with pytest.raises(NodeError, match="bad_reshape.*Reshape"):
        TorchOnnxEvaluator(m).run(None, {"x": torch.ones(6), "s": torch.tensor([4, 4])})


# -- attributes: checked when the evaluator is built ------------------------------------------


def test_unknown_attribute_rejected_at_construction_naming_node_op_and_attribute():
    # the prior art's custom-kernel test carries Add(axis=-1, epsilon=...) at opset 17
    nodes = [oh.make_node("Add", ["x", "x"], ["y"], name="add_eps", axis=-1, epsilon=1e-6)]
    m = _model(nodes, [_vi("x")], [_vi("y")], opset=17)
    with pytest.raises(UnknownAttributeError) as err:
        TorchOnnxEvaluator(m)  # not a TypeError at the first run
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert "'add_eps'" in msg and "ai.onnx::Add" in msg and "opset 17" in msg
    assert "['axis', 'epsilon']" in msg and "attributes are none" in msg
    # the attributes the op accepts are listed
    nodes = [oh.make_node("LeakyRelu", ["x"], ["y"], name="lr", alhpa=0.2)]
    with pytest.raises(UnknownAttributeError, match=r"'lr'.*\['alhpa'\].*\['alpha'\]"):
        TorchOnnxEvaluator(_model(nodes, [_vi("x")], [_vi("y")]))
    # compile_node (the engine's per-node path) checks the same way
    with pytest.raises(UnknownAttributeError, match="'add_eps'.*axis"):
        compile_node(m.graph.node[0], {"": 17})


def test_unknown_attribute_in_subgraph_or_function_body_rejected_at_construction():
    then_g = oh.make_graph(
        [oh.make_node("Neg", ["x"], ["r"], name="in_then", alpha=1.0)], "t", [], [_vi("r")]
    )
    else_g = oh.make_graph([oh.make_node("Abs", ["x"], ["r"])], "e", [], [_vi("r")])
    nodes = [
        oh.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
        oh.make_node("Cast", ["s"], ["c"], to=TP.BOOL),
        oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    with pytest.raises(UnknownAttributeError, match=r"'in_then'.*Neg.*\['alpha'\]"):
        TorchOnnxEvaluator(_model(nodes, [_vi("x")], [_vi("y")]))
    body = [oh.make_node("Relu", ["a"], ["b"], name="in_body", slope=0.1)]
    f = oh.make_function("local", "F", ["a"], ["b"], body, [oh.make_opsetid("", 18)])
    nodes = [oh.make_node("F", ["x"], ["y"], domain="local")]
    m = _model(
        nodes, [_vi("x")], [_vi("y")], functions=[f], extra_opsets=[oh.make_opsetid("local", 1)]
    )
    with pytest.raises(UnknownAttributeError, match=r"'in_body'.*Relu.*\['slope'\]"):
        TorchOnnxEvaluator(m)


def test_valid_attributes_accepted_whoever_reads_them():
    x = torch.tensor([1.0, -2.0])
    # valid at their opset: legacy broadcasting, a memory hint, an attribute a later opset
    # added that the kernel (serving both) implements
    (y,) = _run1([oh.make_node("Add", ["x", "x"], ["y"], broadcast=1, axis=0)], {"x": x}, opset=6)
    assert y.tolist() == [2.0, -4.0]
    (y,) = _run1([oh.make_node("Relu", ["x"], ["y"], consumed_inputs=[0])], {"x": x}, opset=5)
    assert y.tolist() == [1.0, 0.0]
    node = oh.make_node("ArgMax", ["x"], ["y"], keepdims=0, select_last_index=0)
    m = _model([node], [_vi("x")], [_vi("y", TP.INT64)], opset=11)
    assert TorchOnnxEvaluator(m).run(None, {"x": x})[0].item() == 0
    # a local function call may carry attributes its function does not declare (as in
    # onnxruntime): the function reads those it declares
    f = oh.make_function(
        "local", "F", ["a"], ["b"], [oh.make_node("Neg", ["a"], ["b"])], [oh.make_opsetid("", 18)]
    )
    nodes = [oh.make_node("F", ["x"], ["y"], domain="local", unused=1)]
    m = _model(
        nodes, [_vi("x")], [_vi("y")], functions=[f], extra_opsets=[oh.make_opsetid("local", 1)]
    )
    assert TorchOnnxEvaluator(m).run(None, {"x": x})[0].tolist() == [-1.0, 2.0]


def test_valid_attribute_a_builtin_kernel_does_not_take_is_dropped_with_a_warning(monkeypatch):
    """An attribute the spec defines (at the model's opset) that the kernel does not
    implement is not an error of the model: the node runs without it, and says so."""
    from onnx_sbs_nb.evaluator import registry

    def celu_without_alpha(x):
        return torch.nn.functional.celu(x)

    entry = registry.get_kernel("", "Celu", 12)
    monkeypatch.setitem(
        registry._REGISTRY, ("", "Celu"), [type(entry)("", "Celu", 12, celu_without_alpha)]
    )
    node = oh.make_node("Celu", ["x"], ["y"], name="celu", alpha=2.0)
    with pytest.warns(UserWarning, match=r"'celu'.*Celu.*\['alpha'\].*may differ"):
        ev = TorchOnnxEvaluator(_model([node], [_vi("x")], [_vi("y")]))
    x = torch.tensor([-1.0, 1.0])
    torch.testing.assert_close(ev.run(None, {"x": x})[0], torch.nn.functional.celu(x))


def test_custom_kernels_accept_what_their_signature_takes():
    node = oh.make_node("Gelu", ["x"], ["y"], name="g", approximate="tanh")
    m = _model([node], [_vi("x")], [_vi("y")], opset=20)
    x = torch.tensor([1.0])

    def gelu_plain(x):
        return x

    with pytest.raises(UnknownAttributeError, match=r"'g'.*\['approximate'\].*custom kernel"):
        TorchOnnxEvaluator(m, custom_kernels={("", "Gelu"): gelu_plain})

    def gelu_any(x, **attrs):
        return x * 2

    bogus = oh.make_node("Gelu", ["x"], ["y"], approximate="tanh", not_in_the_spec=1)
    m2 = _model([bogus], [_vi("x")], [_vi("y")], opset=20)
    assert TorchOnnxEvaluator(m2, custom_kernels={("", "Gelu"): gelu_any}).run(None, {"x": x})[
        0
    ].tolist() == [2.0]

    def gelu_named(x, approximate="none", extra=0):
        return x * 3

    node = oh.make_node("Gelu", ["x"], ["y"], approximate="tanh", extra=1)
    m3 = _model([node], [_vi("x")], [_vi("y")], opset=20)
    ev = TorchOnnxEvaluator(m3, custom_kernels={("", "Gelu"): gelu_named})
    assert ev.run(None, {"x": x})[0].tolist() == [3.0]


# -- semantics of older opsets ---------------------------------------------------------------


def test_split_forms():
    x = torch.arange(6.0)
    old = _run1(
        [oh.make_node("Split", ["x"], ["a", "b"], axis=0, split=[2, 4])],
        {"x": x},
        opset=11,
        outputs=("a", "b"),
    )
    assert [t.tolist() for t in old] == [[0, 1], [2, 3, 4, 5]]
    new = _run1(
        [oh.make_node("Split", ["x", "sp"], ["a", "b"])],
        {"x": x},
        opset=13,
        outputs=("a", "b"),
        inits=[onh.from_array(np.array([4, 2], dtype=np.int64), "sp")],
    )
    assert [t.tolist() for t in new] == [[0, 1, 2, 3], [4, 5]]
    even = _run1(
        [oh.make_node("Split", ["x"], ["a", "b", "c"])], {"x": x}, 13, outputs=("a", "b", "c")
    )
    assert [len(t) for t in even] == [2, 2, 2]
    uneven = _run1(
        [oh.make_node("Split", ["x"], ["a", "b", "c", "d"], num_outputs=4)],
        {"x": torch.arange(7.0)},
        opset=18,
        outputs=("a", "b", "c", "d"),
    )
    assert [len(t) for t in uneven] == [2, 2, 2, 1]


def test_squeeze_unsqueeze_forms():
    x = torch.ones(1, 3, 1)
    (y,) = _run1([oh.make_node("Squeeze", ["x"], ["y"], axes=[0])], {"x": x}, opset=11)
    assert tuple(y.shape) == (3, 1)
    axes = onh.from_array(np.array([-1], dtype=np.int64), "ax")
    (y,) = _run1([oh.make_node("Squeeze", ["x", "ax"], ["y"])], {"x": x}, opset=13, inits=[axes])
    assert tuple(y.shape) == (1, 3)
    (y,) = _run1([oh.make_node("Squeeze", ["x"], ["y"])], {"x": x}, opset=13)
    assert tuple(y.shape) == (3,)
    (y,) = _run1([oh.make_node("Unsqueeze", ["x"], ["y"], axes=[0, 4])], {"x": x}, opset=11)
    assert tuple(y.shape) == (1, 1, 3, 1, 1)
    (y,) = _run1([oh.make_node("Unsqueeze", ["x", "ax"], ["y"])], {"x": x}, opset=13, inits=[axes])
    assert tuple(y.shape) == (1, 3, 1, 1)


def test_reduce_forms():
    x = torch.arange(6.0).reshape(2, 3)
    (y,) = _run1([oh.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)], {"x": x}, 11)
    assert y.tolist() == [3.0, 12.0]
    ax = onh.from_array(np.array([0], dtype=np.int64), "ax")
    (y,) = _run1([oh.make_node("ReduceSum", ["x", "ax"], ["y"])], {"x": x}, 13, [ax])
    assert y.tolist() == [[3.0, 5.0, 7.0]]
    (y,) = _run1([oh.make_node("ReduceMean", ["x"], ["y"], axes=[0])], {"x": x}, 13)
    assert y.tolist() == [[1.5, 2.5, 3.5]]
    (y,) = _run1([oh.make_node("ReduceMean", ["x", "ax"], ["y"], keepdims=0)], {"x": x}, 18, [ax])
    assert y.tolist() == [1.5, 2.5, 3.5]
    (y,) = _run1([oh.make_node("ReduceMax", ["x"], ["y"], noop_with_empty_axes=1)], {"x": x}, 18)
    assert torch.equal(y, x)
    (y,) = _run1([oh.make_node("ReduceMax", ["x"], ["y"], keepdims=0)], {"x": x}, 18)
    assert y.item() == 5.0


def test_clip_pad_slice_forms():
    x = torch.tensor([-2.0, 0.5, 3.0])
    (y,) = _run1([oh.make_node("Clip", ["x"], ["y"], min=-1.0, max=1.0)], {"x": x}, opset=6)
    assert y.tolist() == [-1.0, 0.5, 1.0]
    lo = onh.from_array(np.array(0.0, dtype=np.float32), "lo")
    (y,) = _run1([oh.make_node("Clip", ["x", "lo"], ["y"])], {"x": x}, 13, [lo])
    assert y.tolist() == [0.0, 0.5, 3.0]
    v = torch.tensor([1.0, 2.0, 3.0])
    (y,) = _run1(
        [oh.make_node("Pad", ["x"], ["y"], pads=[2, 1], mode="reflect")], {"x": v}, opset=2
    )
    assert y.tolist() == [3.0, 2.0, 1.0, 2.0, 3.0, 2.0]
    pads = onh.from_array(np.array([1, 2], dtype=np.int64), "p")
    cv = onh.from_array(np.array(9.0, dtype=np.float32), "cv")
    (y,) = _run1([oh.make_node("Pad", ["x", "p", "cv"], ["y"])], {"x": v}, 13, [pads, cv])
    assert y.tolist() == [9.0, 1.0, 2.0, 3.0, 9.0, 9.0]
    (y,) = _run1([oh.make_node("Pad", ["x", "p"], ["y"], mode="edge")], {"x": v}, 13, [pads])
    assert y.tolist() == [1.0, 1.0, 2.0, 3.0, 3.0, 3.0]
    (y,) = _run1([oh.make_node("Pad", ["x", "p"], ["y"], mode="wrap")], {"x": v}, 19, [pads])
    assert y.tolist() == [3.0, 1.0, 2.0, 3.0, 1.0, 2.0]
    x = torch.arange(10.0)
    (y,) = _run1(
        [oh.make_node("Slice", ["x"], ["y"], starts=[1], ends=[-1], axes=[0])], {"x": x}, 9
    )
    assert y.tolist() == list(range(1, 9))
    inits = [
        onh.from_array(np.array([-1], dtype=np.int64), "s"),
        onh.from_array(np.array([-(2**63)], dtype=np.int64), "e"),
        onh.from_array(np.array([-3], dtype=np.int64), "st"),
    ]
    (y,) = _run1([oh.make_node("Slice", ["x", "s", "e", "", "st"], ["y"])], {"x": x}, 13, inits)
    assert y.tolist() == [9.0, 6.0, 3.0, 0.0]


def test_softmax_axis_semantics_before_13():
    x = torch.randn(2, 3, 4)
    (old,) = _run1([oh.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": x}, opset=11)
    (new,) = _run1([oh.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": x}, opset=13)
    # opset 11 normalises over the flattened [3*4] block, opset 13 over axis 1 only
    torch.testing.assert_close(old, torch.softmax(x.reshape(2, 12), 1).reshape(2, 3, 4))
    torch.testing.assert_close(new, torch.softmax(x, 1))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("stash_type", [None, 1, 11])
def test_range_27_computes_low_precision_ranges_in_its_stash_type(dtype, stash_type):
    from onnx.reference import ReferenceEvaluator

    from onnx_sbs_nb.convert import to_numpy

    elem = TP.FLOAT16 if dtype == torch.float16 else TP.BFLOAT16
    attrs = {} if stash_type is None else {"stash_type": stash_type}
    node = oh.make_node("Range", ["a", "b", "c"], ["y"], **attrs)
    m = _model([node], [_vi(n, elem, []) for n in "abc"], [_vi("y", elem)], opset=27)
    feeds = {"a": 0.1, "b": 30.0, "c": 0.1}
    feeds = {k: torch.tensor(v, dtype=dtype) for k, v in feeds.items()}
    (got,) = TorchOnnxEvaluator(m).run(None, feeds)
    (expected,) = ReferenceEvaluator(m).run(None, {k: to_numpy(v) for k, v in feeds.items()})
    assert got.dtype == dtype
    assert got.float().tolist() == torch.from_numpy(expected.astype(np.float32)).tolist()


def test_integer_semantics():
    a = torch.tensor([-7, 7, -7, 7], dtype=torch.int64)
    b = torch.tensor([2, -2, -2, 2], dtype=torch.int64)
    (d,) = _run1([oh.make_node("Div", ["a", "b"], ["y"])], {"a": a, "b": b})
    assert d.tolist() == [-3, -3, 3, 3]
    (m,) = _run1([oh.make_node("Mod", ["a", "b"], ["y"])], {"a": a, "b": b})
    assert m.tolist() == [1, -1, -1, 1]
    (m,) = _run1([oh.make_node("Mod", ["a", "b"], ["y"], fmod=1)], {"a": a, "b": b})
    assert m.tolist() == [-1, 1, -1, 1]
    (r,) = _run1([oh.make_node("Round", ["x"], ["y"])], {"x": torch.tensor([0.5, 1.5, 2.5])})
    assert r.tolist() == [0.0, 2.0, 2.0]
    x = torch.tensor([1000.0, -1000.0, float("inf")])
    f8 = TP.FLOAT8E4M3FN
    (sat,) = _run1([oh.make_node("Cast", ["x"], ["y"], to=f8)], {"x": x}, opset=19)
    assert sat.float().tolist() == [448.0, -448.0, 448.0]
    (nosat,) = _run1([oh.make_node("Cast", ["x"], ["y"], to=f8, saturate=0)], {"x": x}, 19)
    assert torch.isnan(nosat.float()).all()
    (p,) = _run1(
        [oh.make_node("Pow", ["a", "e"], ["y"])],
        {"a": torch.tensor([2, 3], dtype=torch.int32), "e": torch.tensor([2.0, 0.5])},
    )
    assert p.dtype == torch.int32 and p.tolist() == [4, 1]


# -- subgraphs and functions -----------------------------------------------------------------


def _const(name, value, dtype=np.float32):
    return oh.make_node(
        "Constant", [], [name], value=onh.from_array(np.array(value, dtype=dtype), name + "_v")
    )


def test_nested_loop_if_scan_with_outer_scope():
    # Loop 3 times: acc = acc + (iter is even ? bias : -bias), where bias lives two scopes out;
    # the scan output stacks acc at each iteration.
    then_g = oh.make_graph([oh.make_node("Identity", ["bias"], ["r"])], "then", [], [_vi("r")])
    else_g = oh.make_graph([oh.make_node("Neg", ["bias"], ["r"])], "else", [], [_vi("r")])
    body = oh.make_graph(
        [
            _const("two", 2, np.int64),
            oh.make_node("Mod", ["i", "two"], ["m"]),
            _const("zero", 0, np.int64),
            oh.make_node("Equal", ["m", "zero"], ["even"]),
            oh.make_node("If", ["even"], ["delta"], then_branch=then_g, else_branch=else_g),
            oh.make_node("Add", ["acc", "delta"], ["acc2"]),
            oh.make_node("Identity", ["cond"], ["cond2"]),
            oh.make_node("Identity", ["acc2"], ["scan_out"]),
        ],
        "body",
        [_vi("i", TP.INT64, []), _vi("cond", TP.BOOL, []), _vi("acc")],
        [_vi("cond2", TP.BOOL, []), _vi("acc2"), _vi("scan_out")],
    )
    nodes = [
        _const("n", 3, np.int64),
        _const("true", True, np.bool_),
        oh.make_node("Loop", ["n", "true", "x"], ["final", "stacked"], body=body),
    ]
    m = _model(nodes, [_vi("x"), _vi("bias")], [_vi("final"), _vi("stacked")])
    x, bias = torch.zeros(2), torch.tensor([1.0, 10.0])
    final, stacked = TorchOnnxEvaluator(m).run(None, {"x": x, "bias": bias})
    assert final.tolist() == [1.0, 10.0]
    assert stacked.tolist() == [[1.0, 10.0], [0.0, 0.0], [1.0, 10.0]]  # stacked, not concat

    # Scan: running sum over rows plus an outer-scope offset
    sbody = oh.make_graph(
        [
            oh.make_node("Add", ["s", "row"], ["s2"]),
            oh.make_node("Add", ["s2", "offset"], ["out"]),
        ],
        "sbody",
        [_vi("s"), _vi("row")],
        [_vi("s2"), _vi("out")],
    )
    nodes = [
        oh.make_node("Scan", ["init", "rows"], ["last", "outs"], body=sbody, num_scan_inputs=1)
    ]
    m = _model(nodes, [_vi("init"), _vi("rows"), _vi("offset")], [_vi("last"), _vi("outs")])
    rows = torch.arange(6.0).reshape(3, 2)
    last, outs = TorchOnnxEvaluator(m).run(
        None, {"init": torch.zeros(2), "rows": rows, "offset": torch.tensor(100.0)}
    )
    assert last.tolist() == [6.0, 9.0]
    assert outs.tolist() == [[100.0, 101.0], [102.0, 104.0], [106.0, 109.0]]


def _attr_ref(name, ref, attr_type):
    att = onnx.AttributeProto()
    att.name, att.ref_attr_name, att.type = name, ref, attr_type
    return att


def test_local_functions_with_attribute_refs_and_nesting():
    # inner(x) = x * alpha (alpha refers to the caller's attribute)
    alpha_const = oh.make_node("Constant", [], ["a"])
    alpha_const.attribute.append(_attr_ref("value_float", "alpha", onnx.AttributeProto.FLOAT))
    inner = oh.make_function(
        "local",
        "Scale",
        ["x"],
        ["y"],
        [alpha_const, oh.make_node("Mul", ["x", "a"], ["y"])],
        [oh.make_opsetid("", 18)],
        attributes=["alpha"],
    )
    # outer(x) = Scale<alpha=beta>(x) + 1 with its own default beta=2
    call = oh.make_node("Scale", ["x"], ["s"], domain="local")
    call.attribute.append(_attr_ref("alpha", "beta", onnx.AttributeProto.FLOAT))
    outer = oh.make_function(
        "local",
        "Outer",
        ["x"],
        ["y"],
        [call, _const("one", 1.0), oh.make_node("Add", ["s", "one"], ["y"])],
        [oh.make_opsetid("", 18), oh.make_opsetid("local", 1)],
        attribute_protos=[oh.make_attribute("beta", 2.0)],
    )
    nodes = [
        oh.make_node("Outer", ["x"], ["y1"], domain="local", beta=5.0),
        oh.make_node("Outer", ["x"], ["y2"], domain="local"),
    ]
    m = _model(
        nodes,
        [_vi("x")],
        [_vi("y1"), _vi("y2")],
        functions=[inner, outer],
        extra_opsets=[oh.make_opsetid("local", 1)],
    )
    y1, y2 = TorchOnnxEvaluator(m).run(None, {"x": torch.tensor([1.0, 2.0])})
    assert y1.tolist() == [6.0, 11.0]
    assert y2.tolist() == [3.0, 5.0]
    # compile_node on a function call gives the same result
    f = compile_node(
        nodes[0], {"": 18, "local": 1}, {("local", "Scale"): inner, ("local", "Outer"): outer}
    )
    assert f([torch.tensor([1.0, 2.0])])[0].tolist() == [6.0, 11.0]


def test_function_uses_its_own_opset():
    # ReduceSum with an axes attribute is only valid before opset 13: the function says 11
    body = [oh.make_node("ReduceSum", ["x"], ["y"], axes=[0], keepdims=0)]
    f = oh.make_function("local", "Old", ["x"], ["y"], body, [oh.make_opsetid("", 11)])
    m = _model(
        [oh.make_node("Old", ["x"], ["y"], domain="local")],
        [_vi("x")],
        [_vi("y")],
        opset=18,
        functions=[f],
        extra_opsets=[oh.make_opsetid("local", 1)],
    )
    (y,) = TorchOnnxEvaluator(m).run(None, {"x": torch.ones(3, 2)})
    assert y.tolist() == [3.0, 3.0]


# -- memory ----------------------------------------------------------------------------------


def _add_chain(n: int, last: str) -> list[onnx.NodeProto]:
    """n Adds, each of the previous result and x; the last one writes ``last``."""
    return [
        oh.make_node("Add", ["x" if i == 0 else f"t{i - 1}", "x"], [f"t{i}" if i < n - 1 else last])
        for i in range(n)
    ]


def test_intermediates_released_after_last_use():
    n = 30
    nodes = [*_add_chain(n, f"t{n - 1}"), oh.make_node("Identity", [f"t{n - 1}"], ["y"])]
    m = _model(nodes, [_vi("x")], [_vi("y")])
    ev = TorchOnnxEvaluator(m)
    live: list[int] = []
    ev.run(None, {"x": torch.ones(4)}, hook=lambda k, node, values: live.append(len(values)))
    # at any time: x and the last intermediate (the chain never holds more)
    assert max(live) <= 2, live

    refs: list[weakref.ref] = []

    def tracking_add(a, b):
        out = a + b
        refs.append(weakref.ref(out))
        return out

    ev = TorchOnnxEvaluator(m, custom_kernels={("", "Add"): tracking_add})
    (y,) = ev.run(None, {"x": torch.ones(4)})
    gc.collect()
    alive = [r for r in refs if r() is not None]
    # nothing a kernel made survives the run: the output handed back is an ordinary copy
    assert not alive and not y.is_inference()
    assert y.tolist() == [31.0] * 4


def _peak_mb_of_a_chain(tier: str) -> float:
    """Peak resident memory (MB above the start) of a run of 30 chained Adds on a 16 MB
    tensor, run by ``tier``: "kernels", "inline" or "torchscript" (Linux)."""
    from benchmarks.common import PeakRss
    from onnx_sbs_nb.evaluator.compiled import JIT_AFTER

    model = _model(_add_chain(30, "y"), [_vi("x")], [_vi("y")])
    ev = TorchOnnxEvaluator(model, jit=tier == "torchscript")
    plan = ev._plans[("y",)]
    for _ in range(JIT_AFTER + 3):
        ev.run(None, {"x": torch.ones(4)})
    if tier == "kernels":
        plan.fast = plan.slow
    expected = {"kernels": plan.slow, "inline": plan.inline}.get(tier)
    assert plan.fast is expected if expected else plan.fast.__name__ == "run_scripted"
    x = torch.ones(4_000_000)
    with PeakRss() as peak:
        ev.run(None, {"x": x})
    return peak.increase / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="Linux memory stats")
@pytest.mark.parametrize("tier", ["kernels", "inline", "torchscript"])
def test_each_tier_frees_values_after_their_last_use(tier):
    """A chain of 30 Adds on a 16 MB tensor peaks at a few values, not 30, whichever code
    runs it. In a fresh process with a fixed mmap threshold, so that freed blocks leave
    the resident set (glibc keeps them otherwise, and earlier tests would hide a leak)."""
    code = f"from tests.evaluator.test_evaluator_core import _peak_mb_of_a_chain as f; print(f({tier!r}))"
    root = pathlib.Path(__file__).resolve().parents[2]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    peak = float(out.stdout.split()[-1])
    assert peak < 5 * 16, f"{peak:.0f} MB for 16 MB values"


def test_outer_scope_values_not_kept_after_run():
    refs: list[weakref.ref] = []

    def tracking_neg(x):
        out = -x
        refs.append(weakref.ref(out))
        return out

    then_g = oh.make_graph([oh.make_node("Add", ["n", "n"], ["r"])], "t", [], [_vi("r")])
    else_g = oh.make_graph([oh.make_node("Sub", ["n", "n"], ["r"])], "e", [], [_vi("r")])
    nodes = [
        oh.make_node("Neg", ["x"], ["n"]),
        oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
    ]
    m = _model(nodes, [_vi("x"), _vi("c", TP.BOOL)], [_vi("y")])
    ev = TorchOnnxEvaluator(m, custom_kernels={("", "Neg"): tracking_neg})
    (y,) = ev.run(None, {"x": torch.ones(3), "c": torch.tensor(True)})
    gc.collect()
    assert y.tolist() == [-2.0] * 3
    assert refs and refs[0]() is None  # the If's context released the outer value


def test_unused_outputs_released():
    seen: list[weakref.ref] = []

    def split_spy(x, axis=0, num_outputs=None, split=None):
        parts = torch.split(x.clone(), 2, dim=axis)
        seen.extend(weakref.ref(p) for p in parts)
        return tuple(parts)

    m = _model(
        [oh.make_node("Split", ["x"], ["a", "b"]), oh.make_node("Neg", ["a"], ["y"])],
        [_vi("x")],
        [_vi("y")],
    )
    ev = TorchOnnxEvaluator(m, custom_kernels={("", "Split"): split_spy})
    live: list[int] = []
    ev.run(None, {"x": torch.ones(4)}, hook=lambda k, n, v: live.append(len(v)))
    assert live == [1, 1]  # 'b' is dropped right away, 'a' after Neg


# -- compile_node ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "inputs"),
    [
        (oh.make_node("Softmax", ["x"], ["y"], axis=1), [torch.randn(2, 3, 4)]),
        (oh.make_node("Split", ["x"], ["a", "b"], axis=1), [torch.randn(2, 4)]),
        (
            oh.make_node("Gather", ["x", "i"], ["y"], axis=1),
            [torch.randn(3, 4), torch.tensor([[0, -1]])],
        ),
        (oh.make_node("Clip", ["x", "", "hi"], ["y"]), [torch.randn(5), torch.tensor(0.1)]),
        (oh.make_node("Cast", ["x"], ["y"], to=TP.FLOAT16), [torch.randn(5)]),
    ],
)
@pytest.mark.parametrize("opset", [11, 18])
def test_compile_node_identical_to_graph(node, inputs, opset):
    names = [n for n in node.input if n]
    feeds = dict(zip(names, [t for t in inputs]))
    m = _model([node], [_vi(n) for n in names], [_vi(o) for o in node.output], opset=opset)
    expected = TorchOnnxEvaluator(m).run(None, feeds)
    args = []
    it = iter(inputs)
    for n in node.input:
        args.append(next(it) if n else None)
    got = compile_node(node, {"": opset})(args)
    assert len(got) == len(expected)
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype and torch.equal(e, g)


def test_compile_node_with_subgraph_reading_outer_values():
    then_g = oh.make_graph([oh.make_node("Add", ["a", "b"], ["r"])], "t", [], [_vi("r")])
    else_g = oh.make_graph([oh.make_node("Sub", ["a", "b"], ["r"])], "e", [], [_vi("r")])
    node = oh.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    f = compile_node(node, {"": 18})
    assert f.outer_names == ["a", "b"]
    a, b = torch.tensor([5.0]), torch.tensor([2.0])
    assert f([torch.tensor(True), a, b])[0].tolist() == [7.0]
    assert f([torch.tensor(False), a, b])[0].tolist() == [3.0]


# -- sequences / optional ---------------------------------------------------------------------


def test_sequence_ops():
    nodes = [
        oh.make_node("SplitToSequence", ["x"], ["seq"], axis=0, keepdims=0),
        oh.make_node("SequenceLength", ["seq"], ["n"]),
        _const("pos", -1, np.int64),
        oh.make_node("SequenceErase", ["seq", "pos"], ["seq2"]),
        oh.make_node("ConcatFromSequence", ["seq2"], ["y"], axis=0, new_axis=1),
    ]
    m = _model(nodes, [_vi("x")], [_vi("n", TP.INT64), _vi("y")])
    n, y = TorchOnnxEvaluator(m).run(None, {"x": torch.arange(6.0).reshape(3, 2)})
    assert n.item() == 3 and y.tolist() == [[0.0, 1.0], [2.0, 3.0]]


# -- CUDA --------------------------------------------------------------------------------------

# r = x.reshape(x.shape[0], -1), the shape computed by shape arithmetic ("shape")
_FLATTEN_NODES = [
    oh.make_node("Shape", ["x"], ["s"]),
    oh.make_node("Gather", ["s", "zero"], ["n"], axis=0),
    oh.make_node("Unsqueeze", ["n", "zero1"], ["n1"]),
    oh.make_node("Concat", ["n1", "minus1"], ["shape"], axis=0),
    oh.make_node("Reshape", ["x", "shape"], ["r"]),
]
_FLATTEN_INITS = [
    onh.from_array(np.array(0, dtype=np.int64), "zero"),
    onh.from_array(np.array([0], dtype=np.int64), "zero1"),
    onh.from_array(np.array([-1], dtype=np.int64), "minus1"),
]

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.cuda
def test_cuda_weights_on_device_shapes_on_host(small_model):
    nodes = [
        *_FLATTEN_NODES,
        oh.make_node("MatMul", ["r", "w"], ["y"]),
    ]
    inits = [
        *_FLATTEN_INITS,
        onh.from_array(np.random.randn(12, 3).astype(np.float32), "w"),
    ]
    m = _model(nodes, [_vi("x")], [_vi("y"), _vi("shape", TP.INT64)], inits)
    ev = TorchOnnxEvaluator(m, providers=["CUDAExecutionProvider"])
    x = torch.randn(2, 3, 4, device="cuda")
    plan = next(iter(ev._plans.values()))
    assert plan.placement["shape"] == "h" and plan.placement["y"] == "d"
    y, shape = ev.run(None, {"x": x})
    assert y.device.type == "cuda" and shape.device.type == "cuda"  # results on the device
    w = torch.from_numpy(onh.to_array(inits[-1])).cuda()
    torch.testing.assert_close(y, x.reshape(2, -1) @ w)


def test_placement_analysis_keeps_shapes_on_host():
    """The accelerator placement (exercised on CPU): shape arithmetic is marked host,
    data device; small constants used as data get a device twin; results are unchanged."""
    from onnx_sbs_nb.evaluator.compiler import Compiler

    nodes = [
        *_FLATTEN_NODES,
        oh.make_node("Add", ["r", "minus1f"], ["a"]),
        oh.make_node("Cast", ["n1"], ["nf"], to=TP.FLOAT),
        oh.make_node("Mul", ["a", "nf"], ["y"]),
    ]
    inits = [
        *_FLATTEN_INITS,
        onh.from_array(np.array([-1.0], dtype=np.float32), "minus1f"),
    ]
    m = _model(nodes, [_vi("x")], [_vi("y"), _vi("shape", TP.INT64)], inits)
    compiler = Compiler({"": 18}, device=torch.device("cpu"), manage_placement=True)
    cg = compiler.compile_graph(m.graph, top_level=True)
    state = cg.placement
    assert [state[n] for n in ("s", "n", "n1", "shape", "nf")] == ["h"] * 5
    assert [state[n] for n in ("r", "a", "y")] == ["d"] * 3
    x = torch.randn(2, 3, 4)
    y, shape = cg.execute([x])
    torch.testing.assert_close(y, (x.reshape(2, -1) - 1) * 2)
    assert shape.tolist() == [2, -1]


def test_an_op_declares_its_placement_facts_in_its_registration():
    """Adding an op is one kernel module: ``@op`` declares which inputs are read on the
    host and where the outputs live, and the compiler's placement follows it."""
    from onnx_sbs_nb.evaluator import registry
    from onnx_sbs_nb.evaluator.compiler import Compiler

    domain = "test.placement.facts"
    seen = {}

    @registry.op("ScaleBy", domain=domain, host_inputs=(1,), placement="follow")
    def scale_by(x, k):
        seen["k"] = k
        return x * k.item()

    try:
        entry = registry.get_kernel(domain, "ScaleBy", 1)
        assert entry.host_inputs == {1} and entry.placement == "follow"
        nodes = [
            oh.make_node("Shape", ["x"], ["s"]),
            oh.make_node("ScaleBy", ["s", "two"], ["s2"], domain=domain),  # host inputs
            oh.make_node("ScaleBy", ["x", "k"], ["y"], domain=domain),  # data input
        ]
        inits = [
            onh.from_array(np.array(2, dtype=np.int64), "two"),
            onh.from_array(np.array(3.0, dtype=np.float32), "k"),
        ]
        m = _model(
            nodes,
            [_vi("x")],
            [_vi("y"), _vi("s2", TP.INT64)],
            inits,
            extra_opsets=[oh.make_opsetid(domain, 1)],
        )
        opsets = {"": 18, domain: 1}
        compiler = Compiler(opsets, device=torch.device("cpu"), manage_placement=True)
        cg = compiler.compile_graph(m.graph, top_level=True)
        assert cg.placement["s2"] == "h" and cg.placement["y"] == "d"
        # the host input gets no device twin (a second slot holding the constant)
        k = compiler.graph_initializers(m.graph)["k"]
        assert sum(v is k for v in cg.template) == 1
        x = torch.randn(2, 3)
        y, s2 = cg.execute([x])
        assert seen["k"] is k
        torch.testing.assert_close(y, x * 3)
        assert s2.tolist() == [4, 6]
    finally:
        registry._REGISTRY.pop((domain, "ScaleBy"))
    # int inputs are host inputs; a placement outside the four is a registration error
    assert registry.get_kernel("", "Reshape", 18).host_inputs >= {1}
    with pytest.raises(ValueError, match="placement"):
        registry.op("Bad", domain=domain, placement="gpu")


def test_loop_without_iterations_keeps_scan_output_type():
    body = oh.make_graph(
        [
            oh.make_node("Identity", ["c"], ["c2"]),
            oh.make_node("Cast", ["i"], ["o"], to=TP.INT32),
        ],
        "b",
        [_vi("i", TP.INT64, []), _vi("c", TP.BOOL, [])],
        [_vi("c2", TP.BOOL, []), _vi("o", TP.INT32, [])],
    )
    m = _model(
        [oh.make_node("Loop", ["n", ""], ["s"], body=body)],
        [_vi("n", TP.INT64, [])],
        [_vi("s", TP.INT32)],
    )
    ev = TorchOnnxEvaluator(m)
    (empty,) = ev.run(None, {"n": torch.tensor(0)})
    (full,) = ev.run(None, {"n": torch.tensor(3)})
    assert empty.dtype == torch.int32 and empty.shape == (0,)
    assert full.tolist() == [0, 1, 2]


def test_generated_code_matches_interpreter_loop():
    """The straight-line code of a plan runs the same steps as the reference loop."""
    x = torch.randn(3, 4)
    nodes = [
        oh.make_node("Split", ["x"], ["a", "", "c"], axis=1, num_outputs=3),
        oh.make_node("Concat", ["c", "a", "k"], ["cat"], axis=1),
        oh.make_node("TopK", ["cat", "two"], ["v", "i"], axis=1),
        oh.make_node("Dropout", ["v"], ["y", ""]),
    ]
    inits = [
        onh.from_array(np.ones((3, 1), dtype=np.float32), "k"),
        onh.from_array(np.array([2], dtype=np.int64), "two"),
    ]
    m = _model(nodes, [_vi("x")], [_vi("y"), _vi("i", TP.INT64), _vi("k")], inits)
    plan = TorchOnnxEvaluator(m)._plans[("y", "i", "k")]
    fast, loop = plan.execute([x]), plan.execute_loop([x])
    assert len(fast) == len(loop) == 3
    for a, b in zip(fast, loop):
        assert torch.equal(a, b)
    only_constants = _model([], [], [_vi("k")], inits[:1])
    (k,) = TorchOnnxEvaluator(only_constants).run(None, {})
    assert k.shape == (3, 1)


def _inlined(plan) -> set[str]:
    return {plan.nodes[k].op_type for k in plan.inline.__globals__.get("_inlined", ())}


def test_inline_forms_fall_back_to_the_kernels():
    """An inline form meeting a case only its kernel handles (an integer base for Pow,
    integer MatMul) hands the run to the kernels: right results, and the plan keeps
    using the kernels from then on."""
    nodes = [
        oh.make_node("Pow", ["x", "two"], ["p"]),
        oh.make_node("MatMul", ["p", "w"], ["m"]),
        oh.make_node("Reshape", ["m", "shape"], ["y"]),
    ]
    inits = [
        onh.from_array(np.array(2.0, dtype=np.float32), "two"),
        onh.from_array(np.arange(6).reshape(3, 2), "w"),
        onh.from_array(np.array([-1], dtype=np.int64), "shape"),
    ]
    m = _model(nodes, [_vi("x", TP.INT64)], [_vi("y", TP.INT64)], inits)
    ev = TorchOnnxEvaluator(m)
    plan = ev._plans[("y",)]
    assert _inlined(plan) == {"Pow", "MatMul", "Reshape"}
    x = torch.arange(6).reshape(2, 3)
    (y,) = ev.run(None, {"x": x})
    assert torch.equal(
        y, ((x**2).double() @ torch.arange(6.0).reshape(3, 2).double()).long().reshape(-1)
    )
    assert plan.fast is plan.slow  # later runs go straight to the kernels
    (y2,) = ev.run(None, {"x": x})
    assert torch.equal(y, y2)


def test_torchscript_plan_hands_unusual_runs_back():
    """A plan run often moves to TorchScript; a run TorchScript cannot take (a dtype only
    the kernels handle, a feed that is not a tensor) goes back down the tiers and stays
    correct; ``jit=False`` never leaves the Python code."""
    from onnx_sbs_nb.evaluator.compiled import JIT_AFTER

    nodes = [oh.make_node("Add", ["x", "x"], ["t"]), oh.make_node("Mul", ["t", "x"], ["y"])]
    m = _model(nodes, [_vi("x", TP.UINT32)], [_vi("y", TP.UINT32)])
    ev = TorchOnnxEvaluator(m)
    plan = ev._plans[("y",)]
    x = torch.arange(4, dtype=torch.float32)
    for _ in range(JIT_AFTER + 1):
        (y,) = ev.run(None, {"x": x})
    assert plan.fast.__name__ == "run_scripted" and torch.equal(y, (x + x) * x)
    xu = torch.tensor([0, 1, 2, 3], dtype=torch.uint32)  # no CPU add kernel for uint32
    (yu,) = ev.run(None, {"x": xu})
    assert yu.dtype == torch.uint32 and yu.tolist() == [0, 2, 8, 18]
    assert plan.fast is plan.slow
    (y2,) = ev.run(None, {"x": x})
    assert torch.equal(y2, y)
    plain = TorchOnnxEvaluator(m, jit=False)
    for _ in range(JIT_AFTER + 1):
        plain.run(None, {"x": x})
    assert plain._plans[("y",)].fast is plain._plans[("y",)].inline


def test_inline_failure_names_the_node():
    nodes = [oh.make_node("Reshape", ["x", "s"], ["y"], name="bad_const_reshape")]
    inits = [onh.from_array(np.array([4, 4], dtype=np.int64), "s")]
    m = _model(nodes, [_vi("x")], [_vi("y")], inits)
    ev = TorchOnnxEvaluator(m)
    assert _inlined(ev._plans[("y",)]) == {"Reshape"}
    with pytest.raises(NodeError, match="bad_const_reshape.*Reshape"):
        ev.run(None, {"x": torch.ones(6)})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_cuda_request_without_gpu_is_a_clear_error(small_model):
    from onnx_sbs_nb.errors import DeviceUnavailableError

    with pytest.raises(DeviceUnavailableError, match="'cuda' was asked for but no CUDA device"):
        TorchOnnxEvaluator(small_model, providers=["CUDAExecutionProvider"])


def test_numpy_feeds_with_ml_dtypes_round_trip():
    import ml_dtypes

    m = _model(
        [oh.make_node("Mul", ["x", "x"], ["y"])],
        [_vi("x", TP.BFLOAT16)],
        [_vi("y", TP.BFLOAT16)],
    )
    x = np.array([1.5, -2.0, 3.0], dtype=ml_dtypes.bfloat16)
    (y,) = TorchOnnxEvaluator(m).run(None, {"x": x})
    assert y.dtype == ml_dtypes.bfloat16
    assert y.astype(np.float32).tolist() == [2.25, 4.0, 9.0]


def test_numpy_results_from_lazy_conjugate_views():
    """A kernel may return a lazy view (torch.conj, the imaginary part of one): numpy
    feeds still get numpy results."""
    m = _model([oh.make_node("Conj", ["x"], ["y"], domain="c")], [_vi("x")], [_vi("y")])
    m.opset_import.append(oh.make_opsetid("c", 1))
    x = np.array([1 + 2j, 3 - 1j], dtype=np.complex64)
    for kernel, expected in ((torch.conj, np.conj(x)), (lambda t: torch.conj(t).imag, -x.imag)):
        ev = TorchOnnxEvaluator(m, custom_kernels={("c", "Conj"): kernel})
        (y,) = ev.run(None, {"x": x})
        assert isinstance(y, np.ndarray)
        np.testing.assert_array_equal(y, expected)


@cuda
@pytest.mark.cuda
def test_cuda_feeds_without_device_run_where_they_are(small_model):
    ev = TorchOnnxEvaluator(small_model)  # no device: follows the feeds
    x = torch.randn(2, 4, device="cuda")
    y, s = ev.run(None, {"x": x})
    assert y.device.type == "cuda"
    (cpu_y, _) = ev.run(None, {"x": x.cpu()})
    torch.testing.assert_close(y.cpu(), cpu_y)


def test_benchmark_dispatch_section_runs(capsys):
    """The benchmark script stays runnable (its timings are printed, never asserted)."""
    from benchmarks.bench_evaluator import bench_dispatch

    bench_dispatch(repeat=2, n=20)
    out = capsys.readouterr().out
    assert "per-node dispatch" in out and "onnx_sbs_nb" in out and "onnxruntime" in out


@pytest.mark.slow
def test_benchmark_model_section_runs(capsys):
    """The model section of the benchmark runs end to end on a very small Llama, static
    and dynamic (every contender, the first-run line), without asserting on time."""
    from benchmarks.bench_evaluator import _llama, bench_model

    for dynamic in (False, True):
        times = bench_model("smoke", *_llama(32, 1, 4, dynamic=dynamic), 1, "cpu")
        assert isinstance(times["onnx_sbs_nb"], float)
        assert isinstance(times["ours, jit=False"], float)
        assert isinstance(times["onnxruntime"], float)
        assert "first run" in times["ours, first runs"]
    assert "TorchScript one-time" in capsys.readouterr().out


def test_opset_1_forms_of_cast_and_tile():
    cast = oh.make_node("Cast", ["x"], ["y"], to="INT32")  # a string before opset 6
    (y,) = TorchOnnxEvaluator(cast, opsets={"": 1}).run(None, {"x": torch.tensor([1.7, -2.2])})
    assert y.dtype == torch.int32 and y.tolist() == [1, -2]
    tile = oh.make_node("Tile", ["x", "t", "a"], ["y"])  # tiles and axis inputs before 6
    feeds = {"x": torch.tensor([[1, 2]]), "t": torch.tensor(3), "a": torch.tensor(1)}
    (y,) = TorchOnnxEvaluator(tile, opsets={"": 1}).run(None, feeds)
    assert y.tolist() == [[1, 2, 1, 2, 1, 2]]


def test_verbose_prints_one_line_per_node(small_model, capsys):
    TorchOnnxEvaluator(small_model, verbose=1).run(None, {"x": np.ones((2, 4), np.float32)})
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "TorchOnnxEvaluator" in ln]
    assert len(lines) == 4 and "MatMul" in lines[1] and "MiB" in lines[1]


def test_expand_broadcast_matches_torch():
    """Expand computes numpy's bidirectional broadcast itself (torch.broadcast_shapes costs
    ~20 us a call): same shapes as torch's, and the same refusals."""
    from onnx_sbs_nb.evaluator.inline import HELPERS

    def broadcast_shape(a, b):
        return list(HELPERS["_expand"](torch.empty(a), b).shape)

    rng = np.random.default_rng(0)
    for _ in range(300):
        a = tuple(int(d) for d in rng.choice([1, 2, 3], size=rng.integers(0, 4)))
        b = [int(d) for d in rng.choice([1, 2, 3], size=rng.integers(0, 4))]
        try:
            expected = list(torch.broadcast_shapes(a, tuple(b)))
        except RuntimeError:
            with pytest.raises(ValueError, match="do not broadcast"):
                broadcast_shape(a, b)
        else:
            assert broadcast_shape(a, b) == expected, (a, b)


def test_gathernd_negative_indices_without_batch_dims():
    data = torch.arange(12.0).reshape(3, 4)
    idx = torch.tensor([[[-1, 0]], [[0, -2]]])
    m = _model(
        [oh.make_node("GatherND", ["x", "i"], ["y"])],
        [_vi("x"), _vi("i", TP.INT64)],
        [_vi("y")],
    )
    (y,) = TorchOnnxEvaluator(m).run(None, {"x": data, "i": idx})
    assert y.shape == (2, 1) and y.tolist() == [[8.0], [2.0]]


def _shape_model():
    """y = Reshape(x, [Shape(x)[0] * Shape(x)[1]]) and z = ConstantOfShape(Shape(NonZero(x)))."""
    nodes = [
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("ReduceProd", ["s"], ["n"], keepdims=1),
        oh.make_node("Reshape", ["x", "n"], ["y"]),
        oh.make_node("NonZero", ["x"], ["nz"]),
        oh.make_node("Shape", ["nz"], ["snz"]),
        oh.make_node("ConstantOfShape", ["snz"], ["z"]),
    ]
    return _model(nodes, [_vi("x")], [_vi("y"), _vi("z")], opset=18)


def test_shape_derived_values_stop_at_data():
    from onnx_sbs_nb.evaluator.specialize import shape_derived

    m = _shape_model()
    derived = shape_derived(m.graph.node, ["x"], [])
    # the shape of x is known from the signature; NonZero's shape depends on x's values
    assert derived == {"s", "n"}


def test_shape_specialised_plans_give_the_generic_results():
    """From the second run with a signature, the shape-derived values are constants of a
    plan made for that signature; data-dependent shapes are still computed every run."""
    m = _shape_model()
    ev = TorchOnnxEvaluator(m)
    generic = ev._plans[("y", "z")]
    for x in [
        torch.tensor([[1.0, 0.0], [2.0, 3.0]]),
        torch.tensor([[0.0, 0.0], [2.0, 0.0]]),  # same shape, another number of non-zeros
        torch.tensor([[1.0, 1.0], [1.0, 1.0]]),
        torch.tensor([[5.0, 0.0, 1.0]]),
        torch.tensor([[5.0, 0.0, 1.0]]),
        torch.tensor([[0.0, 0.0, 1.0]]),
    ]:
        y, z = ev.run(None, {"x": x})
        with torch.inference_mode():
            ey, ez = generic.slow([x], ())
        assert torch.equal(y, ey) and torch.equal(z, ez)
        assert z.shape == (2, int((x != 0).sum()))
    plans = [p for seen in ev._specializer._seen.values() for p in seen.values()]
    specialised = [p for p in plans if not isinstance(p, str)]
    assert len(specialised) == 2  # one per shape seen twice
    assert all(n.op_type != "ReduceProd" for p in specialised for n in p.nodes)
    assert all(any(n.op_type == "NonZero" for n in p.nodes) for p in specialised)


def test_shape_specialisation_keeps_no_large_folded_values(monkeypatch):
    from onnx_sbs_nb.evaluator import specialize

    monkeypatch.setattr(specialize, "MAX_FOLDED_BYTES", 0)
    ev = TorchOnnxEvaluator(_shape_model())
    x = torch.tensor([[1.0, 0.0], [2.0, 3.0]])
    for _ in range(3):
        y, z = ev.run(None, {"x": x})
        assert y.tolist() == [1.0, 0.0, 2.0, 3.0] and z.shape == (2, 3)
    states = [p for seen in ev._specializer._seen.values() for p in seen.values()]
    assert states == [specialize._NO_GAIN]


def test_shape_analysis_stops_at_custom_kernels():
    """A custom kernel may compute anything: its outputs are never folded."""
    from onnx_sbs_nb.evaluator.specialize import shape_derived

    m = _shape_model()
    assert shape_derived(m.graph.node, ["x"], [], [("ai.onnx", "ReduceProd")]) == {"s"}

    def my_prod(s, keepdims=1):
        return torch.prod(s, 0, keepdim=bool(keepdims))

    ev = TorchOnnxEvaluator(m, custom_kernels={("", "ReduceProd"): my_prod})
    assert "n" not in ev._specializer.derived
    for _ in range(3):
        y, _ = ev.run(None, {"x": torch.ones(2, 2)})
        assert y.shape == (4,)


def test_op_index_names_the_module_of_every_kernel():
    from onnx_sbs_nb.evaluator.registry import op_index, supported_ops

    index = op_index()
    assert [(d, o, v) for d, o, v, _ in index] == supported_ops()
    assert all(w.startswith("onnx_sbs_nb.evaluator.kernels.") for *_, w in index), [
        w for *_, w in index if not w.startswith("onnx_sbs_nb.evaluator.kernels.")
    ][:5]
    assert any(o == "Erf" for _, o, _, _ in index)
