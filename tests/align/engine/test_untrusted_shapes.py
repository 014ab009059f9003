"""Memory bombs (issue 12, item 8): a node whose output would not fit in memory becomes a
failure record before it allocates, and the run goes on."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.align.engine import limits
from onnx_sbs_nb.align.engine.limits import OutputTooLargeError, check_output_size
from onnx_sbs_nb.align.engine.runners import OnnxruntimeRunner
from onnx_sbs_nb.align.run import run_aligned


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
        (
            _node("Where", 3),  # a scalar among them does not hide the other broadcast
            [
                np.zeros((2**20, 1), bool),
                np.array(1.0, np.float32),
                np.zeros((1, 2**20), np.float32),
            ],
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


# ---- the program side: a .pt2 is untrusted input too


class ZerosPlus(torch.nn.Module):
    def forward(self, x):
        return x + torch.zeros(2, 3)


def _tampered_program(shape: list[int]):
    """A program whose aten.zeros asks for ``shape``, as a hostile .pt2 can."""
    x = torch.randn(2, 3)
    ep = torch.export.export(ZerosPlus(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    zeros = next(n for n in ep.graph.nodes if "zeros" in str(n.target))
    zeros.args = (shape, *zeros.args[1:])
    return ep, onx, x


def test_huge_program_allocation_is_a_failure_record():
    ep, onx, x = _tampered_program([2**30, 2**30])  # 4 exabytes of float32
    recs = list(run_aligned(ep, onx, (x,)))
    zeros = next(r for r in recs if r.ep_name and "zeros" in r.ep_name)
    assert zeros.error and "OutputTooLargeError" in zeros.error, zeros
    assert "[1073741824x1073741824]" in zeros.error and "memory free" in zeros.error
    # the run goes to the end: the program's output has its record
    assert any(r.kind == "output" for r in recs)


def test_broadcast_bomb_in_the_program_is_refused_before_it_allocates():
    class Outer(torch.nn.Module):
        def forward(self, a, b):
            return a * b

    n = 2**18  # [n, 1] * [1, n]: 256 GB of float32 from two 1 MB inputs
    a, b = torch.randn(n, 1), torch.randn(1, n)
    dims = {"a": {0: torch.export.Dim("n")}, "b": {1: torch.export.Dim("m")}}
    small = (torch.randn(4, 1), torch.randn(1, 4))
    ep = torch.export.export(Outer(), small, dynamic_shapes=dims)
    onx = torch.onnx.export(ep, small, dynamo=True, verbose=False).model_proto
    recs = list(run_aligned(ep, onx, (a, b)))
    errors = [r.error for r in recs if r.error]
    # refused on the program's side (its record says so), not only on the ONNX side
    assert any(
        e.startswith("reference side") and "OutputTooLargeError" in e and "262144x262144" in e
        for e in errors
    ), errors


@pytest.mark.parametrize(
    "target, args, kwargs, shape",
    [
        (torch.ops.aten.full.default, ([3, 4], 1.5), {}, (3, 4)),
        (torch.ops.aten.new_zeros.default, (torch.zeros(2), [5, 6]), {}, (5, 6)),
        (torch.ops.aten.arange.start_step, (0, 10, 3), {}, (4,)),
        (torch.ops.aten.repeat.default, (torch.zeros(2, 3), [4, 1, 2]), {}, (4, 2, 6)),
        (torch.ops.aten.mul.Tensor, (torch.zeros(7, 1), torch.zeros(1, 9)), {}, (7, 9)),
        (
            torch.ops.aten.addmm.default,
            (torch.zeros(5), torch.zeros(3, 4), torch.zeros(4, 5)),
            {},
            (3, 5),
        ),
        (torch.ops.aten.constant_pad_nd.default, (torch.zeros(2, 3), [1, 2, 3, 4]), {}, (9, 6)),
    ],
)
def test_program_rules_see_the_output_size(target, args, kwargs, shape):
    from onnx_sbs_nb.align.engine.fx_limits import fx_size_rule

    rule = fx_size_rule(target)
    assert rule is not None
    assert rule(args, kwargs)[0] == shape
    assert shape == tuple(target(*args, **kwargs).shape)


def test_ordinary_program_ops_have_no_rule_or_pass():
    from onnx_sbs_nb.align.engine.fx_limits import check_fx_output_size, fx_size_rule

    assert fx_size_rule(torch.ops.aten.relu.default) is None
    rule = fx_size_rule(torch.ops.aten.add.Tensor)
    check_fx_output_size(rule, (torch.zeros(3), torch.zeros(3)), {}, "cpu")  # no raise
