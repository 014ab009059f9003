"""What every view of a run is drawn from: the widget's synced traits, as plain JSON.

The live widget (:mod:`onnx_sbs_nb.widget`), the HTML report and the notebook export
(:mod:`onnx_sbs_nb.report_html`, :mod:`onnx_sbs_nb.notebook_export`) all hand the same
state to the same front-end bundle; this module is the one place that builds it, so the
views never import each other.  Its keys are :data:`STATE_TRAITS`; the schema is
documented at the top of ``js/src/index.js``.

JSON has no NaN or infinity: :func:`json_float` writes them as the strings ``"nan"``,
``"inf"`` and ``"-inf"`` (which the front end reads back), everywhere in the state.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .records import FAILING_STATUSES, RECORD_FIELDS, Record
from .summary import summarize

BUNDLE_PATH = Path(__file__).with_name("static") / "widget.js"

#: The synced traits, i.e. the keys of the state ``renderStatic(el, state)`` takes.
STATE_TRAITS: tuple[str, ...] = (
    "columns",
    "rows",
    "status",
    "summary",
    "atol",
    "rtol",
    "selected",
    "details",
    "action",
    "device",
    "cuda_available",
    "cuda_reason",
)

_bundle_cache: dict[str, Any] = {}


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


def record_row(rec: Record) -> list[Any]:
    """One row of the ``rows`` trait: the record's JSON-safe values in RECORD_FIELDS order."""
    row = list(_ROW_GETTER(rec))
    for i in _FLOAT_FIELDS:
        v = row[i]
        if isinstance(v, float):
            row[i] = json_float(v)
    return row


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
) -> dict[str, Any]:
    """The state ``renderStatic(el, state)`` takes: the widget's traits for a finished run.

    ``summary`` may be a Summary, its dict, or None (then computed from the records).
    """
    records = list(records)
    if summary is None:
        summary = summarize(records).to_dict()
    if status is None:
        status = finished_status(records)
    return {
        "columns": list(RECORD_FIELDS),
        "rows": [record_row(r) for r in records],
        "status": jsonable(status),
        "summary": jsonable(summary),
        "atol": atol,
        "rtol": rtol,
        "selected": selected,
        "details": jsonable(details or {}),
        "action": {},
        "device": device,
        "cuda_available": False,
        "cuda_reason": "",
    }
