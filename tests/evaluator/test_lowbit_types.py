"""Sub-byte and float8 types in the torch evaluator (evaluator/lowbit.py), on small
handmade models, against the ONNX reference and, where it runs the type, onnxruntime."""

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


def _model(nodes, inputs, outputs, inits=(), opset=23) -> onnx.ModelProto:
    graph = h.make_graph(
        nodes,
        "g",
        [h.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [h.make_tensor_value_info(n, t, s) for n, t, s in outputs],
        initializer=list(inits),
    )
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=11)


def _evaluator(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    got = TorchOnnxEvaluator(model).run(None, {k: to_torch(v) for k, v in feeds.items()})
    return [to_numpy(g) for g in got]


def _reference(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    return list(ReferenceEvaluator(model).run(None, feeds))


def _ort(model: onnx.ModelProto, feeds: dict, names: list[str] | None = None) -> list:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(names, feeds)


def _same(got: np.ndarray, exp: np.ndarray) -> None:
    """Same dtype, shape and bits-as-values (NaN equal to NaN)."""
    assert got.dtype == exp.dtype and got.shape == exp.shape, (got.dtype, exp.dtype)
    np.testing.assert_array_equal(got.astype(np.float32), exp.astype(np.float32))


def _through(to: int, back: int = TP.FLOAT, **attrs) -> onnx.ModelProto:
    """x -> Cast(to) -> q, and q -> Cast(back) -> y: onnxruntime gives back only types
    numpy has, so its side is compared through y."""
    return _model(
        [
            h.make_node("Cast", ["x"], ["q"], to=to, **attrs),
            h.make_node("Cast", ["q"], ["y"], to=back),
        ],
        [("x", TP.FLOAT, [None])],
        [("q", to, [None]), ("y", back, [None])],
    )


@pytest.mark.parametrize("saturate", [0, 1])
def test_cast_to_float8e4m3fn_saturates_only_when_asked(saturate):
    x = np.array([0.1, -3.3, 300.0, 460.0, 470.0, -1000.0, np.inf, np.nan], dtype=np.float32)
    model = _through(TP.FLOAT8E4M3FN, saturate=saturate)
    got, exp = _evaluator(model, {"x": x}), _reference(model, {"x": x})
    _same(got[0], exp[0])
    _same(got[1], exp[1])
    _same(got[1], _ort(model, {"x": x}, ["y"])[0])
    # out of range: 448 when saturating, NaN otherwise (e4m3fn has no infinity)
    assert (got[1][4] == 448.0) == bool(saturate)


@pytest.mark.parametrize("to, dtype", [(TP.INT4, ml_dtypes.int4), (TP.UINT4, ml_dtypes.uint4)])
def test_cast_to_4bit_integers_and_back(to, dtype):
    x = np.arange(-8, 16, dtype=np.float32)
    x = x[(x >= ml_dtypes.iinfo(dtype).min) & (x <= ml_dtypes.iinfo(dtype).max)]
    model = _through(to)
    got = _evaluator(model, {"x": x})
    exp = _reference(model, {"x": x})
    assert got[0].dtype == np.dtype(dtype)
    _same(got[0], exp[0])
    _same(got[1], exp[1])
    # onnxruntime rounds where the reference truncates, and wraps out of the range
    # (undefined by the spec): on the values the type holds the three agree
    _same(got[1], _ort(model, {"x": x}, ["y"])[0])


def test_cast_to_int4_follows_the_reference_on_fractions_and_out_of_range():
    x = np.array([-9.0, -8.5, -2.5, 2.5, 7.6, 8.0, np.nan], dtype=np.float32)
    model = _through(TP.INT4)
    _same(_evaluator(model, {"x": x})[0], _reference(model, {"x": x})[0])


def test_float4e2m1_round_trip_rounds_half_to_even_and_saturates():
    x = np.array(
        [0.0, -0.0, 0.24, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, 7.0, 100.0, -100.0],
        dtype=np.float32,
    )
    model = _through(TP.FLOAT4E2M1)
    got, exp = _evaluator(model, {"x": x}), _reference(model, {"x": x})
    assert got[0].dtype == np.dtype(ml_dtypes.float4_e2m1fn)
    np.testing.assert_array_equal(got[0].view(np.uint8), exp[0].view(np.uint8))
    _same(got[1], exp[1])
    assert list(got[1][[7, 8, 9, 12]]) == [2.0, 4.0, 4.0, 6.0]


def test_dequantize_int4_blocked():
    rng = np.random.default_rng(0)
    w = rng.integers(-8, 8, size=(4, 8)).astype(ml_dtypes.int4)
    scale = rng.uniform(0.1, 1.0, size=(4, 2)).astype(np.float32)
    zp = rng.integers(-2, 3, size=(4, 2)).astype(ml_dtypes.int4)
    inits = [
        numpy_helper.from_array(scale, "s"),
        h.make_tensor("zp", TP.INT4, zp.shape, zp.astype(np.int8).ravel().tolist()),
    ]
    model = _model(
        [h.make_node("DequantizeLinear", ["w", "s", "zp"], ["y"], axis=1, block_size=4)],
        [("w", TP.INT4, [4, 8])],
        [("y", TP.FLOAT, [4, 8])],
        inits,
        opset=21,
    )
    got = _evaluator(model, {"w": w})[0]
    _same(got, _reference(model, {"w": w})[0])
    expected = (w.astype(np.float32) - np.repeat(zp.astype(np.float32), 4, 1)) * np.repeat(
        scale, 4, 1
    )
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    # onnxruntime takes the int4 feed only as a model constant: fold w into the model
    model.graph.initializer.append(
        h.make_tensor("w", TP.INT4, w.shape, w.astype(np.int8).ravel().tolist())
    )
    del model.graph.input[:]
    np.testing.assert_allclose(_ort(model, {})[0], got, rtol=1e-6)


def test_quantize_uint4_per_axis():
    x = np.linspace(-3.0, 9.0, 24, dtype=np.float32).reshape(2, 3, 4)
    scale = np.array([0.5, 0.25, 1.0], dtype=np.float32)
    zp = np.array([2, 8, 0], dtype=ml_dtypes.uint4)
    inits = [
        numpy_helper.from_array(scale, "s"),
        h.make_tensor("zp", TP.UINT4, zp.shape, zp.astype(np.uint8).tolist()),
    ]
    model = _model(
        [
            h.make_node("QuantizeLinear", ["x", "s", "zp"], ["q"], axis=1),
            h.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"], axis=1),
        ],
        [("x", TP.FLOAT, [2, 3, 4])],
        [("q", TP.UINT4, [2, 3, 4]), ("y", TP.FLOAT, [2, 3, 4])],
        inits,
        opset=21,
    )
    got, exp = _evaluator(model, {"x": x}), _reference(model, {"x": x})
    assert got[0].dtype == np.dtype(ml_dtypes.uint4)
    _same(got[0], exp[0])
    _same(got[1], exp[1])
    # saturated at 0 and 15, rounded half to even in between
    q = got[0].astype(np.int64)
    assert q.min() == 0 and q.max() == 15
    del model.graph.output[0]
    np.testing.assert_array_equal(_ort(model, {"x": x})[0], got[1])


@pytest.mark.parametrize(
    "op, attrs, extra",
    [
        ("Transpose", {"perm": [1, 0]}, []),
        ("Reshape", {}, ["shape"]),
        ("Slice", {}, ["starts", "ends"]),
        ("Concat", {"axis": 0}, ["x"]),
    ],
)
def test_sub_byte_values_move_through_shape_ops(op, attrs, extra):
    inits = [
        h.make_tensor("shape", TP.INT64, [1], [-1]),
        h.make_tensor("starts", TP.INT64, [1], [1]),
        h.make_tensor("ends", TP.INT64, [1], [2]),
    ]
    model = _model(
        [h.make_node(op, ["x", *extra], ["y"], **attrs)],
        [("x", TP.INT4, [2, 3])],
        [("y", TP.INT4, None)],
        inits,
        opset=21,
    )
    x = np.array([[-3, 2, 7], [0, -8, 1]], dtype=ml_dtypes.int4)
    _same(_evaluator(model, {"x": x})[0], _reference(model, {"x": x})[0])


def _int4_weight_only(onx: onnx.ModelProto, block: int = 8) -> onnx.ModelProto:
    """Every 2-D float initializer replaced by DequantizeLinear of its int4 blocks."""
    g = onx.graph
    inits, nodes = [], []
    for init in g.initializer:
        a = numpy_helper.to_array(init)
        if a.ndim != 2:
            inits.append(init)
            continue
        blocks = a.reshape(a.shape[0], -1, block)
        s = (np.abs(blocks).max(-1) / 7).astype(np.float32)
        q = np.clip(np.round(blocks / s[..., None]), -8, 7).reshape(a.shape).astype(np.int8)
        inits.append(h.make_tensor(init.name + "_q", TP.INT4, a.shape, q.ravel().tolist()))
        inits.append(numpy_helper.from_array(s, init.name + "_s"))
        nodes.append(
            h.make_node(
                "DequantizeLinear",
                [init.name + "_q", init.name + "_s"],
                [init.name],
                axis=1,
                block_size=block,
            )
        )
    del g.initializer[:]
    g.initializer.extend(inits)
    rest = list(g.node)
    del g.node[:]
    g.node.extend(nodes + rest)
    for o in onx.opset_import:
        if o.domain == "":
            o.version = max(o.version, 21)
    return onx


@pytest.mark.parametrize("runner", ["onnxruntime", "torch"])
def test_an_int4_weight_only_model_is_computed_node_by_node(runner):
    import torch

    from onnx_sbs_nb.align.run import run_aligned

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(2, 16)
    ep = torch.export.export(model.eval(), (x,))
    onx = _int4_weight_only(torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto)
    records = list(run_aligned(ep, onx, (x,), runner=runner))
    # onnxruntime's binding takes no int4 array: those nodes fall back to the evaluator
    broken = [
        (r.onnx_name, r.status, r.error) for r in records if r.status in ("error", "not_computed")
    ]
    assert not broken
    # compared: within tolerance, beyond it, or within what 4-bit weights allow for
    compared = ("ok", "fail", "quantization_noise")
    assert sum(r.status in compared for r in records if r.ep_name == r.onnx_name) >= 3
    floor = 12.0  # quantization_noise.MIN_FLOOR_DB: 6.02·4 − 28 would be below zero
    assert all(r.err_snr >= floor for r in records if r.status == "quantization_noise")


def test_a_wrong_int4_scale_is_no_quantization_noise():
    """At 4 bits, 6.02·b − 28 is below zero: the floor keeps 12 dB, so a weight whose
    block scales are doubled (about 0 dB) is named, not taken for noise."""
    import torch

    from onnx_sbs_nb.align.blame.summary import summarize
    from onnx_sbs_nb.align.run import run_aligned

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))
    x = torch.randn(2, 16)
    ep = torch.export.export(model.eval(), (x,))
    onx = _int4_weight_only(torch.onnx.export(model, (x,), dynamo=True, verbose=False).model_proto)
    for init in onx.graph.initializer:
        if init.name == "2.weight_s":
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, init.name))
    summary = summarize(list(run_aligned(ep, onx, (x,))))
    assert summary.verdict == "fail"
    assert "2" in (summary.culprit.ep_module or summary.culprit.ep_name or "")
