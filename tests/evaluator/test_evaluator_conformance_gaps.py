"""Node-conformance gaps closed beyond the backend-suite baseline (tests/conformance)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator


def _dropout_model(seed: int) -> onnx.ModelProto:
    node = helper.make_node("Dropout", ["x", "r", "t"], ["y", "z"], seed=seed)
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 7, 3]),
            helper.make_tensor_value_info("r", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("t", TensorProto.BOOL, []),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 7, 3]),
            helper.make_tensor_value_info("z", TensorProto.BOOL, [2, 7, 3]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("seed,ratio", [(3, 0.3), (1234, 0.75)])
def test_a_seeded_training_dropout_draws_the_mask_of_the_onnx_reference(seed, ratio):
    # the spec leaves the draws free; with a seed the evaluator takes the reference's
    # (numpy's legacy generator), so other runtimes' expected values are reproduced
    model = _dropout_model(seed)
    x = np.random.default_rng(0).standard_normal((2, 7, 3)).astype(np.float32)
    r, t = np.array(ratio, dtype=np.float32), np.array(True)
    ref_y, ref_z = ReferenceEvaluator(model).run(None, {"x": x, "r": r, "t": t})
    ev = TorchOnnxEvaluator(model)
    got_y, got_z = ev.run(
        None, {"x": torch.from_numpy(x), "r": torch.tensor(ratio), "t": torch.tensor(True)}
    )
    np.testing.assert_array_equal(got_z.numpy(), ref_z)
    np.testing.assert_allclose(got_y.numpy(), ref_y, rtol=1e-6, atol=0)
    # the draws depend on the seed, not on the state of a global generator
    torch.manual_seed(99)
    np.random.seed(99)
    again = ev.run(
        None, {"x": torch.from_numpy(x), "r": torch.tensor(ratio), "t": torch.tensor(True)}
    )[1]
    np.testing.assert_array_equal(again.numpy(), ref_z)


def _ort(model: onnx.ModelProto, feeds: dict) -> list:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_string_tensors_flow_through_the_evaluator_as_numpy_arrays():
    # torch has no string dtype: string feeds stay numpy object arrays from the feed to
    # the kernels (StringConcat, Equal on strings) and back, as onnxruntime computes them
    s = TensorProto.STRING
    graph = helper.make_graph(
        [
            helper.make_node("StringConcat", ["a", "b"], ["c"]),
            helper.make_node("Equal", ["c", "d"], ["e"]),
        ],
        "g",
        [helper.make_tensor_value_info(n, s, [None, 3]) for n in "abd"],
        [
            helper.make_tensor_value_info("c", s, [None, 3]),
            helper.make_tensor_value_info("e", TensorProto.BOOL, [None, 3]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    feeds = {
        "a": np.array([["x", "é", ""], ["ab", "c", "d"]], dtype=object),
        "b": np.array([["y", "ü", "z"], ["", "c", "e"]], dtype=object),
        "d": np.array([["xy", "éü", "q"], ["ab", "cc", "de"]], dtype=object),
    }
    exp_c, exp_e = _ort(model, feeds)
    got_c, got_e = TorchOnnxEvaluator(model).run(None, feeds)
    assert isinstance(got_c, np.ndarray) and got_c.shape == exp_c.shape
    assert got_c.astype(str).tolist() == exp_c.astype(str).tolist()
    assert got_e.numpy().tolist() == exp_e.tolist()  # numeric results stay tensors


def test_a_string_tensor_attribute_reaches_the_kernel_as_a_numpy_array():
    # LabelEncoder-4's keys_tensor holds strings: the attribute is converted to a numpy
    # object array instead of refusing the model
    keys = helper.make_tensor("keys_tensor", TensorProto.STRING, [3], [b"a", b"b", b"c"])
    values = helper.make_tensor("values_tensor", TensorProto.INT64, [3], [7, 8, 9])
    default = helper.make_tensor("default_tensor", TensorProto.INT64, [1], [-5])
    node = helper.make_node(
        "LabelEncoder",
        ["x"],
        ["y"],
        domain="ai.onnx.ml",
        keys_tensor=keys,
        values_tensor=values,
        default_tensor=default,
    )
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [None])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [None])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ai.onnx.ml", 4)],
    )
    feeds = {"x": np.array(["c", "z", "a", "b", "a"], dtype=object)}
    (expected,) = _ort(model, feeds)
    (got,) = TorchOnnxEvaluator(model).run(None, feeds)
    assert got.numpy().tolist() == expected.tolist()


@pytest.mark.parametrize("placement", [False, True])
def test_string_constants_and_initializers_are_numpy_arrays(placement):
    # Constant value_string(s) and STRING initializers are kept on the host as numpy
    # object arrays (on_device and the host/device placement leave them as they are)
    s = TensorProto.STRING
    suffix = helper.make_tensor("suffix", s, [3], [b"-a", b"-b", b"-c"])
    nodes = [
        helper.make_node("Constant", [], ["sep"], value_string="/"),
        helper.make_node("StringConcat", ["x", "sep"], ["y0"]),
        helper.make_node("StringConcat", ["y0", "suffix"], ["y"]),
        helper.make_node("Constant", [], ["w"], value_strings=["a/-a", "q", "c/-c"]),
        helper.make_node("Equal", ["y", "w"], ["e"]),
        helper.make_node("Cast", ["e"], ["n"], to=TensorProto.INT64),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", s, [3])],
        [
            helper.make_tensor_value_info("y", s, [3]),
            helper.make_tensor_value_info("n", TensorProto.INT64, [3]),
        ],
        initializer=[suffix],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    feeds = {"x": np.array(["a", "é", "c"], dtype=object)}
    exp_y, exp_n = _ort(model, feeds)
    got_y, got_n = TorchOnnxEvaluator(model, manage_placement=placement).run(None, feeds)
    assert got_y.astype(str).tolist() == exp_y.astype(str).tolist()
    assert got_n.numpy().tolist() == exp_n.tolist()
