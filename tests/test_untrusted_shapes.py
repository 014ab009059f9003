"""Memory bombs (issue 12, item 8): a node whose output would not fit in memory becomes a
failure record before it allocates, and the run goes on."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnx_sbs_nb.align import limits
from onnx_sbs_nb.align.limits import OutputTooLargeError, check_output_size
from onnx_sbs_nb.align.run import run_aligned
from onnx_sbs_nb.align.runners import OnnxruntimeRunner
from onnx_sbs_nb.summary import summarize


class ExpandThenAdd(torch.nn.Module):
    def forward(self, x):
        return x.expand(8, 3) + 1


@pytest.fixture(scope="module")
def expand_export():
    x = torch.randn(1, 3)
    ep = torch.export.export(ExpandThenAdd(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    return ep, onx, x


def _corrupt_expand(onx: onnx.ModelProto, shape: list[int]) -> onnx.ModelProto:
    """The export with the Expand's shape constant replaced, as a damaged file has it."""
    bad = onnx.ModelProto.FromString(onx.SerializeToString())
    expand = next(n for n in bad.graph.node if n.op_type == "Expand")
    init = next(i for i in bad.graph.initializer if i.name == expand.input[1])
    init.CopyFrom(numpy_helper.from_array(np.array(shape, np.int64), init.name))
    return bad


class CountingRunner(OnnxruntimeRunner):
    """onnxruntime, counting the Expand nodes it is asked to run."""

    expands = 0

    def prepare(self, node, ctx):
        fn = super().prepare(node, ctx)
        if node.op_type != "Expand":
            return fn

        def run(inputs):
            CountingRunner.expands += 1
            return fn(inputs)

        return run


def test_corrupt_expand_is_a_failure_record_not_an_allocation(expand_export, monkeypatch):
    ep, onx, x = expand_export
    # a machine with 1 MB free: a 3 MB Expand output must be refused, and is small
    # enough to be allocated harmlessly if the check failed
    monkeypatch.setattr(limits, "free_memory", lambda device="cpu": 1 << 20)
    monkeypatch.setattr(limits, "_SMALL", 0)
    bad = _corrupt_expand(onx, [256, 1024, 3])
    CountingRunner.expands = 0
    recs = list(run_aligned(ep, bad, (x,), runner=CountingRunner()))
    assert CountingRunner.expands == 0  # never handed to the runtime
    expand = next(r for r in recs if r.onnx_op_type == "Expand")
    assert expand.status == "error" and "OutputTooLargeError" in expand.error
    assert "[256x1024x3]" in expand.error and "memory free" in expand.error
    # the run went on to the end: the Add after it is recorded (it continues from the
    # torch value of the refused node)
    add = next(r for r in recs if r.onnx_op_type == "Add")
    assert add.step > expand.step and add.status != "error"
    culprit = summarize(recs, node_inputs=bad).culprit
    assert culprit is not None and culprit.onnx_op_type == "Expand"


def test_huge_outputs_refused_with_the_real_free_memory(expand_export):
    ep, onx, x = expand_export
    bad = _corrupt_expand(onx, [2**40, 2**20, 3])  # 48 exabytes of float32
    recs = list(run_aligned(ep, bad, (x,)))
    expand = next(r for r in recs if r.onnx_op_type == "Expand")
    assert "OutputTooLargeError" in expand.error and "EB" in expand.error
    # the same through the torch evaluator, which would otherwise try torch.expand
    recs = list(run_aligned(ep, bad, (x,), runner="torch"))
    assert "OutputTooLargeError" in next(r for r in recs if r.onnx_op_type == "Expand").error


def _node(op, n_inputs, **attrs):
    return helper.make_node(op, [f"i{k}" for k in range(n_inputs)], ["y"], **attrs)


_TB = 1 << 40
_f32 = np.zeros((2, 3), np.float32)


@pytest.mark.parametrize(
    "node, inputs",
    [
        (
            _node("ConstantOfShape", 1, value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0])),
            [np.array([_TB], np.int64)],
        ),
        (_node("Tile", 2), [_f32, np.array([_TB, 1], np.int64)]),
        (_node("Range", 3), [np.array(0.0), np.array(1e13), np.array(1.0)]),
        (
            _node("Resize", 4),
            [np.zeros((1, 1, 2, 2), np.float32), None, None, np.array([1, 1, _TB, 2])],
        ),
        (
            _node("Resize", 3),
            [np.zeros((1, 1, 2, 2), np.float32), None, np.array([1, 1, 1e12, 1], np.float32)],
        ),
        (_node("Pad", 2), [_f32, np.array([0, 0, _TB, 0], np.int64)]),
        (_node("OneHot", 3), [np.zeros(4, np.int64), np.array(_TB), np.zeros(2, np.float32)]),
        (_node("RandomNormal", 0, shape=[_TB]), []),
        (
            _node("ConvTranspose", 2, output_shape=[_TB, 2]),
            [np.zeros((1, 1, 2, 2), np.float32), np.zeros((1, 1, 1, 1), np.float32)],
        ),
        (
            _node("ConvTranspose", 2, strides=[2**30, 2**30]),
            [np.zeros((1, 1, 4, 4), np.float32), np.zeros((1, 1, 1, 1), np.float32)],
        ),
        (_node("MatMul", 2), [np.zeros((2**20, 1), np.float32), np.zeros((1, 2**20), np.float32)]),
        (
            _node("Mul", 2),
            [torch.zeros(2**20, 1), torch.zeros(1, 2**20)],  # a broadcast gone wrong
        ),
        (_node("Gather", 2), [np.zeros((1, 2**20), np.float32), np.zeros(2**20, np.int64)]),
    ],
    ids=lambda v: v.op_type if isinstance(v, onnx.NodeProto) else "",
)
def test_rules_see_the_output_size(node, inputs):
    with pytest.raises(OutputTooLargeError, match="memory free"):
        check_output_size(node, inputs, "cpu")


def test_ordinary_nodes_pass():
    a = np.zeros((64, 64), np.float32)
    for op in ("Add", "MatMul", "Relu", "Expand", "Tile"):
        check_output_size(_node(op, 2), [a, np.array([1, 1], np.int64)], "cpu")
    # inputs a rule cannot read are for the runtime to judge
    check_output_size(_node("Expand", 2), [a, "not a tensor"], "cpu")
    check_output_size(_node("Expand", 2, domain="custom"), [a, np.array([_TB])], "cpu")
