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
