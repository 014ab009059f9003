"""Model Explorer node data: written from a run, read back, loaded by the real adapter."""

from __future__ import annotations

import importlib
import json
import math
import os

import onnx
import pytest

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.pairing.optimized import optimize_model
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.records import STATUS_ERROR, STATUS_FAIL, Record
from onnx_sbs_nb.reports.model_explorer import (
    ERROR_COLOR,
    FAIL_COLOR,
    VALUE_PREFIX,
    node_data,
    read_node_data,
    write_node_data,
)

from ..quant_models import exported


def needs(module: str):
    """The real package, skipped outside CI when absent (CI installs the test extra)."""
    if os.environ.get("CI"):
        return importlib.import_module(module)
    return pytest.importorskip(module)


@pytest.fixture(scope="module")
def optimized_run(tmp_path_factory):
    """The QGemm culprit: records of the optimized graph and that graph, saved."""
    ep, onx, args = exported("linear")
    om = optimize_model(onx, "all")
    path = tmp_path_factory.mktemp("me") / "optimized.onnx"
    onnx.save(om.model, str(path))
    return list(run_aligned(ep, om.model, args)), om.model, path


def test_node_data_round_trip(optimized_run, tmp_path):
    recs, model, _ = optimized_run
    path = write_node_data(recs, tmp_path / "run.node_data.json", model)
    data = json.loads(path.read_text())  # strict JSON: Model Explorer's JSON.parse reads it
    assert list(data) == ["main_graph"] and data["main_graph"]["thresholds"]
    values = read_node_data(path)
    culprit = next(r for r in recs if r.failed)
    assert values["node_linear"] == culprit.err_abs == 1.0
    assert data["main_graph"]["results"]["node_linear"]["bgColor"] == FAIL_COLOR
    # graph inputs and outputs are nodes of their own for the adapter
    out = next(r for r in recs if r.onnx_name == "dequantize_per_tensor_2")
    assert values[VALUE_PREFIX + "dequantize_per_tensor_2"] == out.err_abs
    assert values[VALUE_PREFIX + "x"] == 0.0
    # a passing node gets its colour from the thresholds
    assert "bgColor" not in data["main_graph"]["results"]["node_quantize_per_tensor_1"]
    # records read back from a saved run work as well
    assert node_data([r.to_dict() for r in recs], model) == data


def test_failures_errors_and_non_finite_values():
    _, onx, _ = exported("mlp")
    relu = next(n for n in onx.graph.node if n.op_type == "Relu")
    gemm = next(n for n in onx.graph.node if n.op_type == "Gemm")
    recs = [
        Record(onnx_name=gemm.output[0], err_abs=float("nan"), status=STATUS_FAIL),
        Record(onnx_name=relu.output[0], status=STATUS_ERROR, error="boom"),
    ]
    results = node_data(recs, onx)[onx.graph.name]["results"]
    assert results[gemm.name] == {"value": "nan", "bgColor": FAIL_COLOR}
    assert results[relu.name] == {"value": "error", "bgColor": ERROR_COLOR}
    # the worst output of a node wins
    many = [
        Record(onnx_name=gemm.output[0], err_abs=1e-7),
        Record(onnx_name=gemm.output[0], err_abs=0.5, status=STATUS_FAIL),
        Record(onnx_name=gemm.output[0], err_abs=1e-3),
    ]
    assert node_data(many, onx)[onx.graph.name]["results"][gemm.name]["value"] == 0.5


def test_records_of_another_model_are_refused(optimized_run, tmp_path):
    recs, _, _ = optimized_run
    _, other, _ = exported("conv")
    bad = [Record(onnx_name="nowhere", err_abs=1.0)]
    with pytest.raises(SbsInputError, match="none of the records"):
        node_data(bad, other)
    with pytest.raises(SbsInputError, match=".json"):
        write_node_data(recs, tmp_path / "run.txt", optimized_run[1])
    with pytest.raises(SbsInputError, match="metric"):
        node_data(recs, optimized_run[1], metric="err_max")
    assert math.isfinite(
        read_node_data(write_node_data(recs, tmp_path / "a.json", other))["[value] x"]
    )


def test_the_real_adapter_knows_every_key(optimized_run, tmp_path):
    recs, model, model_path = optimized_run
    adapter_mod = needs("model_explorer_onnx.main")
    graphs = adapter_mod.ONNXAdapter().convert(str(model_path), {})["graphs"]
    main = graphs[0]
    data_path = write_node_data(recs, tmp_path / "run.node_data.json", model_path)
    data = json.loads(data_path.read_text())
    assert list(data) == [main.id]
    ids = {n.id for n in main.nodes}
    assert set(data[main.id]["results"]) <= ids
    labels = {n.id: n.label for n in main.nodes}
    assert labels["node_linear"] == "com.microsoft::QGemm"
    # Model Explorer's own dataclasses accept the document
    ndb = needs("model_explorer.node_data_builder")
    results = {k: ndb.NodeDataResult(**v) for k, v in data[main.id]["results"].items()}
    thresholds = [ndb.ThresholdItem(**t) for t in data[main.id]["thresholds"]]
    text = ndb.ModelNodeData(
        graphsData={main.id: ndb.GraphNodeData(results=results, thresholds=thresholds)}
    ).to_json_string()
    back = json.loads(text)[main.id]
    assert back["results"] == data[main.id]["results"]
    assert back["thresholds"] == data[main.id]["thresholds"]


def test_measures_as_node_data():
    """Any measure is node data; for cosine and SNR the worst output is the lowest."""
    _, onx, _ = exported("mlp")
    gemm = next(n for n in onx.graph.node if n.op_type == "Gemm")
    many = [
        Record(onnx_name=gemm.output[0], err_snr=80.0, err_cos=0.999999, err_ulp=2.0),
        Record(onnx_name=gemm.output[0], err_snr=25.0, err_cos=0.99, err_ulp=900.0),
    ]
    for metric, want in (("err_snr", 25.0), ("err_cos", 0.99), ("err_ulp", 900.0)):
        data = node_data(many, onx, metric=metric)[onx.graph.name]
        assert data["results"][gemm.name]["value"] == want, metric
        bounds = [t["value"] for t in data["thresholds"]]
        assert bounds == sorted(bounds), metric
    with pytest.raises(SbsInputError, match="err_snr"):
        node_data(many, onx, metric="snr")
