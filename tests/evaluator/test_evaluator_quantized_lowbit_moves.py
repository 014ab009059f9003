"""Ops that move sub-byte values (Gather, Reshape, Pad, Concat...) in the torch evaluator:
run on the values' codes (evaluator/lowbit.py ``on_codes``), compared with the ONNX
reference and, where it runs the type, with onnxruntime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as h
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

from onnx_sbs_nb.convert import to_numpy, to_torch
from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator


def _ints(name: str, v) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, dtype=np.int64), name)


def _bools(name: str, v) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(v, dtype=np.bool_), name)


# op name -> (nodes reading x [3, 4], initializers); outputs: every node output but "t"
CASES = {
    "Identity": ([h.make_node("Identity", ["x"], ["y"])], []),
    "Reshape": ([h.make_node("Reshape", ["x", "s"], ["y"])], [_ints("s", [4, 3])]),
    "Transpose": ([h.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], []),
    "Flatten": ([h.make_node("Flatten", ["x"], ["y"], axis=0)], []),
    "Squeeze": (
        [h.make_node("Unsqueeze", ["x", "a"], ["t"]), h.make_node("Squeeze", ["t", "a"], ["y"])],
        [_ints("a", [0])],
    ),
    "Gather": ([h.make_node("Gather", ["x", "i"], ["y"], axis=1)], [_ints("i", [2, 0, 1])]),
    "GatherElements": (
        [h.make_node("GatherElements", ["x", "i"], ["y"], axis=1)],
        [_ints("i", [[2, 0], [1, 1], [0, 3]])],
    ),
    "GatherND": ([h.make_node("GatherND", ["x", "i"], ["y"])], [_ints("i", [[1], [0]])]),
    "Slice": ([h.make_node("Slice", ["x", "b", "e"], ["y"])], [_ints("b", [1]), _ints("e", [3])]),
    "Concat": ([h.make_node("Concat", ["x", "x"], ["y"], axis=0)], []),
    "Expand": ([h.make_node("Expand", ["x", "s"], ["y"])], [_ints("s", [2, 3, 4])]),
    "Split": ([h.make_node("Split", ["x"], ["y", "z"], axis=1, num_outputs=2)], []),
    "Tile": ([h.make_node("Tile", ["x", "r"], ["y"])], [_ints("r", [2, 1])]),
    "Pad": ([h.make_node("Pad", ["x", "p"], ["y"])], [_ints("p", [1, 0, 0, 2])]),
    "PadEdge": ([h.make_node("Pad", ["x", "p"], ["y"], mode="edge")], [_ints("p", [1, 0, 0, 2])]),
    "PadValue": ([h.make_node("Pad", ["x", "p", "v"], ["y"])], [_ints("p", [0, 1, 1, 0])]),
    "Shape": ([h.make_node("Shape", ["x"], ["y"])], []),
    "Size": ([h.make_node("Size", ["x"], ["y"])], []),
    "Where": (
        [h.make_node("Where", ["c", "x", "v"], ["y"])],
        [_bools("c", [True, False, True, False])],
    ),
    "Compress": (
        [h.make_node("Compress", ["x", "c"], ["y"], axis=1)],
        [_bools("c", [True, False, True, True])],
    ),
    "ReverseSequence": (
        [h.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=0, time_axis=1)],
        [_ints("l", [1, 2, 3])],
    ),
    "DepthToSpace": (
        [
            h.make_node("Reshape", ["x", "s"], ["t"]),
            h.make_node("DepthToSpace", ["t"], ["y"], blocksize=2),
        ],
        [_ints("s", [1, 4, 3, 1])],
    ),
    "ScatterND": (
        [h.make_node("ScatterND", ["x", "i", "u"], ["y"])],
        [_ints("i", [[1]])],
    ),
    "Trilu": ([h.make_node("Trilu", ["x"], ["y"], upper=0)], []),
    "ConstantOfShape": ([h.make_node("ConstantOfShape", ["s"], ["y"], value="v")], []),
}

TYPES = [
    (TP.INT4, ml_dtypes.int4),
    (TP.UINT4, ml_dtypes.uint4),
    (TP.FLOAT4E2M1, ml_dtypes.float4_e2m1fn),
]
if hasattr(TP, "INT2") and hasattr(ml_dtypes, "int2"):
    TYPES += [(TP.INT2, ml_dtypes.int2), (TP.UINT2, ml_dtypes.uint2)]


def _data(elem: int, dtype) -> np.ndarray:
    """Every code of the type appears (negative values included)."""
    info = ml_dtypes.finfo(dtype) if elem == TP.FLOAT4E2M1 else ml_dtypes.iinfo(dtype)
    lo, hi = float(info.min), float(info.max)
    return np.linspace(lo, hi, 12, dtype=np.float32).reshape(3, 4).astype(dtype)


def _model(name: str, elem: int, dtype) -> onnx.ModelProto:
    nodes, inits = CASES[name]
    x = _data(elem, dtype)
    inits = list(inits)
    if name == "ScatterND":
        inits.append(numpy_helper.from_array(x[2:3][::-1].copy(), "u"))
    if name in ("PadValue", "Where"):
        inits.append(numpy_helper.from_array(x[2, 1:2].reshape(()), "v"))
    if name == "ConstantOfShape":
        value = numpy_helper.from_array(x[0, :1], "v")
        nodes = [h.make_node("ConstantOfShape", ["s"], ["y"], value=value)]
        inits = [_ints("s", [2, 3])]
    outs = [o for n in nodes for o in n.output if o != "t"]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", elem, [3, 4])],
        [h.make_tensor_value_info(o, 0, None) for o in outs],
        initializer=inits,
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 23)], ir_version=11)


def _same(got: np.ndarray, exp: np.ndarray) -> None:
    assert got.dtype == exp.dtype and got.shape == exp.shape, (got.dtype, exp.dtype)
    np.testing.assert_array_equal(got.astype(np.float32), exp.astype(np.float32))


@pytest.mark.parametrize("elem, dtype", TYPES, ids=lambda v: str(v))
@pytest.mark.parametrize("name", sorted(CASES))
def test_moving_ops_on_sub_byte_values_match_the_reference(name, elem, dtype):
    model = _model(name, elem, dtype)
    x = _data(elem, dtype)
    expected = ReferenceEvaluator(model).run(None, {"x": x})
    ev = TorchOnnxEvaluator(model)
    # three runs: the kernels, then the plan that may have fallen back from inline forms
    for _ in range(3):
        got = [to_numpy(g) for g in ev.run(None, {"x": to_torch(x)})]
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _same(g, e)


def test_a_scatter_that_adds_is_not_run_on_codes():
    """Adding codes would be wrong (int4 -1 is code 15): refused, not answered."""
    elem, dtype = TP.INT4, ml_dtypes.int4
    x = _data(elem, dtype)
    graph = h.make_graph(
        [h.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add")],
        "g",
        [h.make_tensor_value_info("x", elem, [3, 4])],
        [h.make_tensor_value_info("y", elem, None)],
        initializer=[_ints("i", [[1]]), numpy_helper.from_array(x[:1], "u")],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 23)], ir_version=11)
    with pytest.raises(Exception, match="ScatterND"):
        TorchOnnxEvaluator(model).run(None, {"x": to_torch(x)})


@pytest.mark.parametrize("elem, dtype", TYPES[:2], ids=["int4", "uint4"])
def test_int4_weights_transposed_then_dequantized_match_onnxruntime(elem, dtype):
    """A quantizer's int4 weight, transposed before DequantizeLinear: onnxruntime runs
    Transpose on int4 (opset 21)."""
    w = _data(elem, dtype)
    graph = h.make_graph(
        [
            h.make_node("Transpose", ["w"], ["t"], perm=[1, 0]),
            h.make_node("DequantizeLinear", ["t", "s"], ["y"]),
        ],
        "g",
        [],
        [h.make_tensor_value_info("y", TP.FLOAT, None)],
        initializer=[
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(np.array(0.25, dtype=np.float32), "s"),
        ],
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)], ir_version=10)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    exp = sess.run(None, {})[0]
    got = to_numpy(TorchOnnxEvaluator(model).run(None, {})[0])
    np.testing.assert_array_equal(got, exp)
    np.testing.assert_array_equal(got, w.astype(np.float32).T * 0.25)


@pytest.mark.parametrize("elem, dtype", TYPES[:3], ids=["int4", "uint4", "float4e2m1"])
def test_a_chain_of_moves_keeps_its_values_once_the_plan_is_compiled(elem, dtype):
    """Reshape -> Transpose -> Slice -> Concat -> Gather run 25 times: past the runs
    after which a plan moves to inline code and TorchScript, the values stay the
    reference's."""
    nodes = [
        h.make_node("Reshape", ["x", "s"], ["r"]),
        h.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),
        h.make_node("Slice", ["t", "b", "e"], ["u"]),
        h.make_node("Concat", ["u", "u"], ["c"], axis=0),
        h.make_node("Gather", ["c", "i"], ["y"], axis=1),
    ]
    inits = [_ints("s", [6, 2]), _ints("b", [0]), _ints("e", [1]), _ints("i", [5, 0, 2])]
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info("x", elem, [3, 4])],
        [h.make_tensor_value_info("y", elem, None)],
        initializer=inits,
    )
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 23)], ir_version=11)
    x = _data(elem, dtype)
    expected = ReferenceEvaluator(model).run(None, {"x": x})[0]
    ev = TorchOnnxEvaluator(model)
    for _ in range(25):
        _same(to_numpy(ev.run(None, {"x": to_torch(x)})[0]), expected)
