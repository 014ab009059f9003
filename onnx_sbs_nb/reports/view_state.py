"""What every view of a run is drawn from: the widget's synced traits, as plain JSON.

The live widget (:mod:`onnx_sbs_nb.notebook.widget`), the HTML report and the notebook export
(:mod:`onnx_sbs_nb.reports.html`, :mod:`onnx_sbs_nb.reports.notebook`) all hand the same
state to the same front-end bundle; this module is the one place that builds it, so the
views never import each other.  Its keys are :data:`STATE_TRAITS`; the schema is
documented at the top of ``js/src/index.js``.

- Records travel as **columns** (:func:`encode_rows`): one array per Record field, a
  field whose values repeat (op types, statuses, tolerances, shapes) as a dictionary and
  codes, a field with one value as that value.  A saved notebook of 20,000 records is
  then about half the size of one JSON list per record, and the browser appends a batch
  with one loop per field.
- The ONNX graph travels as an adjacency (:func:`graph_state`): per value, the values its
  producer reads; the front end draws the neighbourhood of a node from it, offline.
- JSON has no NaN or infinity: :func:`json_float` writes them as the strings ``"nan"``,
  ``"inf"`` and ``"-inf"`` (which the front end reads back), everywhere in the state.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..align.blame.summary import summarize
from ..records import FAILING_STATUSES, RECORD_FIELDS, Record, schema_dict

BUNDLE_PATH = Path(__file__).parent.parent / "static" / "widget.js"

#: The synced traits, i.e. the keys of the state ``renderStatic(el, state)`` takes.
STATE_TRAITS: tuple[str, ...] = (
    "schema",
    "columns",
    "rows",
    "graph",
    "status",
    "summary",
    "atol",
    "rtol",
    "selected",
    "details",
    "device",
    "cuda_available",
    "cuda_reason",
    "actions",
    "timeline",
)

_bundle_cache: dict[str, Any] = {}


# What a widget carries when another one of the notebook carries the bundle: the bundle
# publishes itself on globalThis.__onnxSbsNb when loaded (js/src/index.js), and this waits
# for it (a view whose bundle never comes leaves the static summary beside it in view).
SHIM_ESM = """\
function bundle() {
  const shared = (globalThis.__onnxSbsNb ||= { waiters: [] });
  if (shared.module) return Promise.resolve(shared.module);
  return new Promise((resolve) => shared.waiters.push(resolve));
}
export default {
  async initialize(ctx) { return (await bundle()).default.initialize(ctx); },
  async render(ctx) { return (await bundle()).default.render(ctx); },
};
"""


def bundle_js() -> str:
    """The built front-end bundle (one ES module: anywidget ``render`` + ``renderStatic``)."""
    try:
        st = BUNDLE_PATH.stat()
    except FileNotFoundError:
        raise FileNotFoundError(
            f"the widget bundle {BUNDLE_PATH} is not built: run `cd js && npm ci && npm run "
            "build` in the source tree (or reinstall with `pip install -e .`, which builds it; "
            "needs node >= 18)"
        ) from None
    key = (st.st_mtime_ns, st.st_size)
    if _bundle_cache.get("key") != key:
        _bundle_cache["text"] = BUNDLE_PATH.read_text(encoding="utf-8")
        _bundle_cache["key"] = key
    return _bundle_cache["text"]


def is_finite(v: Any) -> bool:
    """A real number that is neither NaN nor infinite (booleans are not numbers here)."""
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def json_float(v: float) -> float | str:
    """A float as JSON can hold it: NaN and infinities as ``"nan"``, ``"inf"``, ``"-inf"``."""
    return v if math.isfinite(v) else str(v)


_ROW_GETTER = operator.attrgetter(*RECORD_FIELDS)
# only these fields may hold a float
_FLOAT_FIELDS = tuple(
    i
    for i, f in enumerate(dataclasses.fields(Record))
    if "float" in str(f.type) and "int" not in str(f.type)
)


_FLOAT_SET = frozenset(_FLOAT_FIELDS)
_INFINITIES = (math.inf, -math.inf)
# timings are measurements, not results: four significant digits say all they can
_ROUNDED_FIELDS = frozenset(RECORD_FIELDS.index(f) for f in ("ep_time_run", "onnx_time_run"))


def record_row(rec: Record) -> list[Any]:
    """One row of the ``rows`` trait: the record's JSON-safe values in RECORD_FIELDS order."""
    row = list(_ROW_GETTER(rec))
    for i in _FLOAT_FIELDS:
        v = row[i]
        if isinstance(v, float):
            row[i] = _rounded(v) if i in _ROUNDED_FIELDS else json_float(v)
    return row


def _rounded(v: float) -> float | str:
    return float(f"{v:.4g}") if math.isfinite(v) else str(v)


def _json_safe_map(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    return {k: json_float(v) if isinstance(v, float) else v for k, v in value.items()}


def encode_column(values: list[Any]) -> Any:
    """One field's JSON-safe values, compactly: ``{"c": v}`` when all are ``v``,
    ``{"d": distinct, "k": codes}`` when values repeat, else the plain list."""
    n = len(values)
    if n == 0:
        return []
    try:
        distinct = set(values)  # JSON scalars, so hashable
    except TypeError:  # Record.extra: a dict per record, JSON-safe like every other value
        return [_json_safe_map(v) for v in values]
    if len(distinct) == 1:
        return {"c": values[0]}
    if 2 * len(distinct) <= n:
        order = list(dict.fromkeys(values))  # first-seen order: stable across runs
        code = {v: k for k, v in enumerate(order)}
        return {"d": order, "k": [code[v] for v in values]}
    return values


def encode_rows(records: Sequence[Record]) -> dict[str, Any]:
    """Records as the ``rows`` trait (and the streamed batches): ``{"n": count, "data":
    [one encoded column per RECORD_FIELDS entry]}``."""
    data = []
    for i, name in enumerate(RECORD_FIELDS):
        col = [getattr(r, name) for r in records]
        if i in _FLOAT_SET:
            if i in _ROUNDED_FIELDS:
                col = [_rounded(v) if isinstance(v, float) else v for v in col]
            if not all(v is None or (v == v and v not in _INFINITIES) for v in col):
                col = [json_float(v) if isinstance(v, float) else v for v in col]
        data.append(encode_column(col))
    return {"n": len(records), "data": data}


def decode_column(enc: Any, n: int) -> list[Any]:
    """The ``n`` values of a column :func:`encode_column` wrote."""
    if isinstance(enc, list):
        return enc
    if isinstance(enc, dict) and "c" in enc:
        return [enc["c"]] * n
    if isinstance(enc, dict) and "d" in enc:
        return [enc["d"][k] for k in enc["k"]]
    raise ValueError(f"not an encoded column: {type(enc).__name__}")


def decode_rows(rows: Any) -> list[list[Any]]:
    """One list per record (RECORD_FIELDS order) from the ``rows`` trait or a batch; the
    one list per record of the first releases' saved states is returned as it is."""
    if isinstance(rows, list):
        return rows
    n = rows.get("n", 0)
    columns = [decode_column(c, n) for c in rows.get("data", [])]
    return [list(r) for r in zip(*columns)] if columns else [[] for _ in range(n)]


def graph_state(model: Any) -> dict[str, Any]:
    """The ``graph`` trait: which ONNX value feeds which, for the neighbourhood view.

    ``{"values": [value names], "op": encoded op type of each value's producer
    ("initializer", "input" for sources), "parents": flat [count, value index ...] per
    value, the values its producer reads}``.  Only the main graph (subgraph values are
    internal to their node); ``{}`` without a model.  Attribute access only: any
    ``onnx.ModelProto`` or ``GraphProto``.
    """
    graph = getattr(model, "graph", model)
    if graph is None or not hasattr(graph, "node"):
        return {}
    index: dict[str, int] = {}
    names: list[str] = []
    ops: list[str | None] = []
    parents: list[list[int]] = []

    def value(name: str, op: str | None = None) -> int:
        k = index.get(name)
        if k is None:
            k = index[name] = len(names)
            names.append(name)
            ops.append(op)
            parents.append([])
        return k

    for init in graph.initializer:
        value(init.name, "initializer")
    for inp in graph.input:
        value(inp.name, "input")
    for node in graph.node:
        ins = [value(x) for x in node.input if x]
        for out in node.output:
            if out:
                k = value(out)
                ops[k] = node.op_type
                parents[k] = ins
    flat: list[int] = []
    for p in parents:
        flat.append(len(p))
        flat.extend(p)
    return {"values": names, "op": encode_column(ops), "parents": flat}


def jsonable(obj: Any) -> Any:
    """A JSON-safe copy: non-finite floats as strings, paths and unknown objects as str."""
    if obj is None or isinstance(obj, bool | int | str):
        return obj
    if isinstance(obj, float):
        return json_float(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set | frozenset):
        return [jsonable(v) for v in obj]
    # to_dict first: Summary.to_dict carries its verdict, a property asdict would drop
    to_dict = getattr(obj, "to_dict", None)
    if callable(to_dict) and not isinstance(obj, type):
        return jsonable(to_dict())
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return jsonable(dataclasses.asdict(obj))
    return str(obj)


def culprit_of(summary: Any) -> dict[str, Any] | None:
    """The one answer of a summary dict: ``summary["culprit"]``; a summary made before
    that key existed gives its first own failure, in the same shape (without ``why``)."""
    to_dict = getattr(summary, "to_dict", None)
    if callable(to_dict):  # a Summary
        summary = to_dict()
    if not isinstance(summary, dict):
        return None
    if "culprit" in summary:
        c = summary["culprit"]
        return c if isinstance(c, dict) else None
    r = summary.get("first_own_failure")
    if not isinstance(r, dict):
        return None
    rule = summary.get("first_own_failure_rule")
    own = r.get("err_abs2") if r.get("err_abs2") is not None else r.get("err_abs")
    return {
        "ep_name": r.get("ep_name"),
        "ep_user_name": r.get("ep_user_name"),
        "ep_module": r.get("ep_module"),
        "ep_source": r.get("ep_source"),
        "onnx_name": r.get("onnx_name"),
        "onnx_node": None,
        "onnx_op_type": r.get("onnx_op_type"),
        "onnx_nodes": None,
        "own_error": own,
        "atol": r.get("atol"),
        "rtol": r.get("rtol"),
        "why": None,
        "rule": rule,
        "step": r.get("step"),
        "kind": r.get("kind"),
    }


def culprit_name(culprit: dict[str, Any]) -> str:
    """The culprit in the user's words: their fx node name first."""
    for key in ("ep_user_name", "ep_name", "onnx_name", "onnx_node"):
        if culprit.get(key):
            return str(culprit[key])
    return "?"


def finished_status(records: list[Record]) -> dict[str, Any]:
    """The ``status`` of a finished run known only by its records (a report, a file)."""
    failures = sum(1 for r in records if r.status in FAILING_STATUSES)
    finite = [(r.err_abs, r) for r in records if is_finite(r.err_abs)]
    worst = max(finite, key=lambda t: t[0], default=(0.0, None))
    return {
        "state": "finished",
        "finished": True,
        "records": len(records),
        "rows": len(records),
        "failures": failures,
        "max_err_abs": worst[0],
        "max_err_name": worst[1].onnx_name if worst[1] is not None else None,
    }


def widget_state(
    records: Iterable[Record],
    *,
    summary: Any = None,
    status: dict[str, Any] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    selected: int = -1,
    details: dict[str, Any] | None = None,
    device: str = "cpu",
    model: Any = None,
    actions: Sequence[dict[str, Any]] = (),
    timeline: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The state ``renderStatic(el, state)`` takes: the widget's traits for a finished run.

    ``summary`` may be a Summary, its dict, or None (then computed from the records);
    ``model`` (the ONNX model) gives the neighbourhood view its graph; ``actions`` is the
    action table of a view that has a session to ask (``session.action_table()``), none
    for a report: no kernel answers it, so it shows no button.  ``timeline``: the run's
    two sides step by step (``Run.timeline()``), None for a kind that has none.
    """
    records = list(records)
    if summary is None:
        summary = summarize(records).to_dict()
    if status is None:
        status = finished_status(records)
    return {
        "schema": schema_dict(),
        "columns": list(RECORD_FIELDS),
        "rows": encode_rows(records),
        "graph": graph_state(model) if model is not None else {},
        "status": jsonable(status),
        "summary": jsonable(summary),
        "atol": atol,
        "rtol": rtol,
        "selected": selected,
        "details": jsonable(details or {}),
        "device": device,
        "cuda_available": False,
        "cuda_reason": "",
        "actions": [dict(a) for a in actions],
        "timeline": jsonable(timeline),
    }
