"""Per-node errors in Model Explorer's node-data format.

Model Explorer (``ai-edge-model-explorer``) opens an ONNX graph through the
``model-explorer-onnx`` adapter and overlays "node data" read from a JSON file:
``{graph id: {"results": {node key: {"value": ...}}, "thresholds": [...]}}``.  With that
adapter the graph id is the ONNX graph's name, a node's key is its ONNX node name
(``<node_i>`` when it has none) and graph inputs, outputs and initializers are nodes
keyed ``[value] <name>``.  Each node shows the largest error of the values it produces;
a node whose value fails its tolerance is drawn red, one that could not run says
"error".  Open the same model the run used (for an ``optimize=`` run: the optimized one).

    model-explorer model.onnx --extensions=model_explorer_onnx \\
        --node_data_paths=run.node_data.json
"""

from __future__ import annotations

import json
import math
import os
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from ..align.source.loading import load_onnx_model
from ..errors import SbsInputError
from ..files import write_text_atomic
from ..records import FAILING_STATUSES, STATUS_ERROR

METRICS = (
    "err_abs",
    "err_rel",
    "err_abs2",
    "err_rel2",
    # the measures of measures.py
    "err_cos",
    "err_snr",
    "err_l2",
    "err_p50",
    "err_p99",
    "err_ulp",
)
# measures whose larger values are the better ones: the worst of a node is its smallest
HIGHER_IS_BETTER = frozenset({"err_cos", "err_snr"})

# Upper bounds of the error ranges and their colours (greens: well within float32
# tolerances; amber to red: beyond).  Values above the last bound would get no colour.
THRESHOLDS: list[dict[str, Any]] = [
    {"value": 1e-6, "bgColor": "#1b5e20"},
    {"value": 1e-5, "bgColor": "#388e3c"},
    {"value": 1e-4, "bgColor": "#8bc34a"},
    {"value": 1e-3, "bgColor": "#c8e6c9"},
    {"value": 1e-2, "bgColor": "#ffa000"},
    {"value": 1.0, "bgColor": "#ff5722"},
    {"value": 1e300, "bgColor": "#d32f2f"},
]
# the same colours on the scales of the other measures (upper bounds, ascending)
_GREENS_TO_RED = [t["bgColor"] for t in THRESHOLDS]
METRIC_THRESHOLDS: dict[str, list[dict[str, Any]]] = {
    # cosine and SNR: red for the low values, dark green for the high ones
    "err_cos": [
        {"value": v, "bgColor": c}
        for v, c in zip(
            (0.9, 0.99, 0.999, 0.9999, 0.99999, 0.999999, 1.0), _GREENS_TO_RED[::-1], strict=True
        )
    ],
    "err_snr": [
        {"value": v, "bgColor": c}
        for v, c in zip((10, 20, 30, 40, 60, 80, 1e300), _GREENS_TO_RED[::-1], strict=True)
    ],
    "err_ulp": [
        {"value": v, "bgColor": c}
        for v, c in zip((1, 4, 16, 256, 65536, 1e9, 1e300), _GREENS_TO_RED, strict=True)
    ],
}
FAIL_COLOR = "#d32f2f"  # a value beyond its tolerance, whatever its size
ERROR_COLOR = "#6a1b9a"  # a node that could not run
VALUE_PREFIX = "[value] "  # the adapter's key for graph inputs, outputs and initializers


def _get(record: Any, name: str) -> Any:  # a Record, or its to_dict()
    return record.get(name) if isinstance(record, dict) else getattr(record, name, None)


def graph_id(model: onnx.ModelProto) -> str:
    """The id the adapter gives the main graph."""
    return model.graph.name or "<main>"


def value_keys(model: onnx.ModelProto) -> dict[str, str]:
    """Model Explorer's key of the node that shows each ONNX value of the main graph."""
    g = model.graph
    keys = {i.name: VALUE_PREFIX + i.name for i in [*g.input, *g.initializer]}
    for k, node in enumerate(g.node):
        key = node.name or f"<node_{k}>"
        for o in node.output:
            if o:
                keys[o] = key
    return keys


def node_data(
    records: Iterable[Any], model: Any, *, metric: str = "err_abs"
) -> dict[str, dict[str, Any]]:
    """The node-data document (a dict) for ``records`` of a run over ``model``."""
    if metric not in METRICS:
        raise SbsInputError(f"metric={metric!r}: use one of {list(METRICS)}")
    model = load_onnx_model(model)
    outputs = {o.name for o in model.graph.output}
    keys_of = value_keys(model)
    results: dict[str, dict[str, Any]] = {}
    worst: dict[str, float] = {}
    better = metric in HIGHER_IS_BETTER
    seen = missing = 0
    for rec in records:
        name = _get(rec, "onnx_name")
        if not name:
            continue
        seen += 1
        key = keys_of.get(name)
        if key is None:
            missing += 1
            continue
        status = _get(rec, "status")
        keys = [key, VALUE_PREFIX + name] if name in outputs else [key]
        if status == STATUS_ERROR:
            for k in keys:
                results[k] = {"value": "error", "bgColor": ERROR_COLOR}
                worst[k] = math.inf
            continue
        value = _get(rec, metric)
        if isinstance(value, str):  # a record read back from JSON: "nan", "inf"
            value = float(value)
        if value is None:
            continue
        value = float(value)
        rank = math.inf if math.isnan(value) else -value if better else value
        for k in keys:
            if k in worst and worst[k] >= rank:
                continue
            worst[k] = rank
            entry: dict[str, Any] = {"value": value if math.isfinite(value) else str(value)}
            if status in FAILING_STATUSES or not math.isfinite(value):
                entry["bgColor"] = FAIL_COLOR
            results[k] = entry
    if seen and missing == seen:
        raise SbsInputError(
            "none of the records names a value of this ONNX model: pass the model the run "
            "compared (for an optimize= run, its optimized model)"
        )
    thresholds = METRIC_THRESHOLDS.get(metric, THRESHOLDS)
    return {graph_id(model): {"results": results, "thresholds": thresholds}}


def write_node_data(
    records: Iterable[Any], path: str | os.PathLike, model: Any, *, metric: str = "err_abs"
) -> Path:
    """Writes the errors of ``records`` as Model Explorer node data; returns the path.

    ``metric``: ``err_abs`` (propagated error, the default), ``err_rel``, the node's
    own error from a rerun on torch inputs (``err_abs2``, ``err_rel2``), or a measure
    (``err_cos``, ``err_snr``, ``err_l2``, ``err_p50``, ``err_p99``, ``err_ulp``; for
    cosine and SNR a node shows its lowest value).
    """
    data = node_data(records, model, metric=metric)
    path = Path(path)
    if path.suffix != ".json":
        raise SbsInputError(f"{str(path)!r}: Model Explorer reads node data from a .json file")
    # allow_nan=False: Model Explorer's JSON.parse rejects NaN, so none may slip in
    text = json.dumps(data, indent=1, allow_nan=False)
    write_text_atomic(path, text)
    return path


@dataclass(frozen=True)
class NodeDataFiles:
    """What :func:`save_node_data` wrote."""

    node_data: Path
    model: Path | None  # the graph the run compared, when it is not the user's own file

    def command(self, model: str | os.PathLike | None = None) -> str:
        """The command that opens the graph with the errors overlaid."""
        graph = self.model or model or "model.onnx"
        return (
            f"model-explorer {shlex.quote(str(graph))} --extensions=model_explorer_onnx "
            f"--node_data_paths={shlex.quote(str(self.node_data))}"
        )


def model_path_for(node_data_path: str | os.PathLike) -> Path:
    """Where the compared graph goes beside its node data: ``run.node_data.json`` ->
    ``run.optimized.onnx``."""
    path = Path(node_data_path)
    stem = path.name.removesuffix(".json").removesuffix(".node_data")
    return path.with_name(f"{stem or 'model'}.optimized.onnx")


def save_node_data(
    records: Iterable[Any],
    path: str | os.PathLike,
    model: Any,
    *,
    save_model: bool = False,
    metric: str = "err_abs",
) -> NodeDataFiles:
    """Writes the node data and, with ``save_model`` (an ``optimize=`` run, whose graph
    exists nowhere else), the compared model beside it, so Model Explorer opens the
    graph the keys name (weights in ``<name>.data`` when they are large)."""
    written = write_node_data(records, path, model, metric=metric)
    model_file = None
    if save_model:
        from ..align.pairing.onnxruntime_session import save_model as save_onnx

        model_file = save_onnx(load_onnx_model(model), model_path_for(written))
    return NodeDataFiles(written, model_file)


def read_node_data(path: str | os.PathLike, graph: str | None = None) -> dict[str, Any]:
    """``{node key: value}`` of one graph of a node-data file (the only one by default)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if "results" in data:  # a single graph's data
        graphs = {"": data}
    else:
        graphs = data
    if graph is None:
        if len(graphs) != 1:
            raise SbsInputError(f"the file holds graphs {sorted(graphs)}: name one with graph=")
        graph = next(iter(graphs))
    if graph not in graphs:
        raise SbsInputError(f"the file holds no graph {graph!r} (it holds {sorted(graphs)})")
    return {k: v.get("value") for k, v in graphs[graph].get("results", {}).items()}


__all__ = [
    "METRICS",
    "NodeDataFiles",
    "THRESHOLDS",
    "graph_id",
    "node_data",
    "model_path_for",
    "read_node_data",
    "save_node_data",
    "value_keys",
    "write_node_data",
]
