"""The evaluator's short path for the common call (all outputs, CPU torch feeds) gives what
the general path gives, and hands every other call to it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as onh

from onnx_sbs_nb.evaluator.compiled import JIT_AFTER
from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator

F = TP.FLOAT


def _dynamic_model():
    """Shape-derived values (Shape, Concat, Reshape) and two outputs: the specialiser and
    the TorchScript tier both take part."""
    w = onh.from_array(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3), "w")
    minus_one = onh.from_array(np.array([-1], dtype=np.int64), "m1")
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["m"]),
        oh.make_node("Shape", ["x"], ["s"], end=1),
        oh.make_node("Concat", ["s", "m1"], ["shape"], axis=0),
        oh.make_node("Reshape", ["m", "shape"], ["r"]),
        oh.make_node("Softmax", ["r"], ["y"], axis=-1),
        oh.make_node("Sigmoid", ["m"], ["z"]),
    ]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", F, ["N", 4])],
        [oh.make_tensor_value_info("y", F, None), oh.make_tensor_value_info("z", F, None)],
        [w, minus_one],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)], ir_version=10)


def test_cpu_tensor_calls_take_the_short_path_with_the_general_results():
    ev = TorchOnnxEvaluator(_dynamic_model())
    for n in (2, 5):
        x = torch.randn(n, 4)
        feeds = {"x": x}
        # the debug path (a hook) goes through the general code, node by node
        expected = ev.run(None, feeds, hook=lambda *a: None)
        for _ in range(JIT_AFTER + 3):  # past the specialised plan and TorchScript
            got = ev._run_cpu_tensors(None, feeds)
            assert got is not None
            for e, g in zip(expected, got):
                torch.testing.assert_close(g, e, rtol=0, atol=0)
                assert not g.is_inference()
        via_run = ev.run(None, feeds)
        for e, g in zip(expected, via_run):
            torch.testing.assert_close(g, e, rtol=0, atol=0)


@pytest.mark.parametrize(
    "output_names,feeds",
    [
        (["z"], {"x": torch.randn(2, 4)}),  # a subset of the outputs
        (None, {"x": np.zeros((2, 4), np.float32)}),  # numpy feeds: numpy results
        (None, {}),  # missing feed: the general path names it
        (None, {"x": torch.randn(2, 4), "extra": torch.randn(1)}),
    ],
)
def test_other_calls_go_the_general_way(output_names, feeds):
    ev = TorchOnnxEvaluator(_dynamic_model())
    assert ev._run_cpu_tensors(output_names, feeds) is None


def test_general_path_errors_still_reach_the_caller():
    ev = TorchOnnxEvaluator(_dynamic_model())
    with pytest.raises(KeyError, match="missing feed 'x'"):
        ev.run(None, {})
    with pytest.raises(KeyError, match="unknown feeds"):
        ev.run(None, {"x": torch.randn(2, 4), "extra": torch.randn(1)})
    (z,) = ev.run(["z"], {"x": torch.ones(1, 4)})
    torch.testing.assert_close(
        z, torch.sigmoid(torch.ones(1, 4) @ torch.linspace(-1, 1, 12).reshape(4, 3))
    )


def test_benchmark_times_a_baseline_checkout_beside_this_one(capsys, monkeypatch):
    """bench_evaluator --baseline: another checkout's evaluator (here this very one, under
    another package name) gets its own column in the same interleaved run."""
    import pathlib
    import sys

    import benchmarks.bench_evaluator as bench

    root = pathlib.Path(__file__).resolve().parents[2]
    cls = bench._load_baseline(str(root))
    try:
        assert cls is not TorchOnnxEvaluator
        assert cls.__module__ == "baseline_onnx_sbs_nb.evaluator.evaluator"
        monkeypatch.setattr(bench, "_BASELINE", cls)
        bench.bench_dispatch(repeat=2, n=20)
        out = capsys.readouterr().out
        assert "baseline checkout" in out and "onnx_sbs_nb" in out
    finally:
        for name in [m for m in sys.modules if m.startswith("baseline_onnx_sbs_nb")]:
            del sys.modules[name]
