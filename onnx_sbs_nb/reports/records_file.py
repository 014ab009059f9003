"""A file of records, whatever its format: what identifies our files, the type every reader
returns (records and how far their run got), and the checks every record read from an
untrusted file goes through (each field's type, known statuses and kinds)."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import records as _records
from ..compare.user_compare import plain_value
from ..completion import INCOMPLETE, Completion
from ..records import RECORD_FIELDS, Record

if TYPE_CHECKING:
    import pandas


#: What identifies our files, and the version of their layout.
FORMAT = "onnx-sbs-records"
FORMAT_VERSION = 1
#: Columns a CSV adds after the record fields: how far the run got (same on every row).
RUN_COLUMNS: tuple[str, ...] = (
    "run_verdict",
    "run_state",
    "run_nodes_done",
    "run_nodes_total",
    "run_reason",
)
# A record file must carry these: anything else is not a table of our records.
_REQUIRED_FIELDS = ("status", "kind", "step")
_STATUSES = frozenset(_records.STATUSES)
_KINDS = frozenset(v for k, v in vars(_records).items() if k.startswith("KIND_"))
# Spreadsheets read a cell starting with one of these as a formula (OWASP, ASVS 1.2.10).
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\0")


class ReportFormatError(ValueError):
    """A report path has a suffix no writer handles, or a report file cannot be read."""


@dataclass
class RecordsFile:
    """The records of a file and what it says about its run (``completion``)."""

    records: list[Record]
    completion: Completion | None


# the fields the user's compare function returned (Record.extra): one column each
EXTRA_PREFIX = "extra."
_COLUMNS = [f for f in RECORD_FIELDS if f != "extra"]


def records_to_frame(records: Iterable[Record]) -> pandas.DataFrame:
    """One row per record, columns in :data:`RECORD_FIELDS` order (onnx-diagnostic names
    first), then one ``extra.<name>`` column per field of ``Record.extra``."""
    import pandas

    rows = [r.to_dict() if isinstance(r, Record) else dict(r) for r in records]
    extra: dict[str, None] = {}
    for row in rows:
        for k, v in (row.pop("extra", None) or {}).items():
            row[EXTRA_PREFIX + k] = v
            extra[EXTRA_PREFIX + k] = None
    df = pandas.DataFrame(rows, columns=_COLUMNS + list(extra))
    # to_dict turns NaN/inf into strings for JSON; a frame wants numbers back.
    for name in RECORD_FIELDS:
        if name.startswith("err_") and df[name].dtype == object:
            df[name] = pandas.to_numeric(df[name], errors="coerce")
    return df


# ---- record validation ----------------------------------------------------------------


def _field_kinds() -> dict[str, tuple[type, bool]]:
    """field -> (int, float, bool or str; whether None is allowed)."""
    hints = typing.get_type_hints(Record)
    kinds: dict[str, tuple[type, bool]] = {}
    for f in dataclasses.fields(Record):
        if f.name == "extra":  # a dict, checked on its own (_extra_of)
            continue
        h = hints[f.name]
        args = set(typing.get_args(h)) or {h}
        optional = type(None) in args
        args.discard(type(None))
        (base,) = args
        kinds[f.name] = (base, optional)
    return kinds


_KINDS_OF_FIELDS = _field_kinds()
_INT_FIELDS = frozenset(k for k, (t, _) in _KINDS_OF_FIELDS.items() if t is int)
_BOOL_FIELDS = frozenset(k for k, (t, _) in _KINDS_OF_FIELDS.items() if t is bool)
_STR_FIELDS = frozenset(k for k, (t, _) in _KINDS_OF_FIELDS.items() if t is str)
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def record_from_dict(d: Mapping[str, Any], where: str = "record") -> Record:
    """A Record from a file's dict, every field type checked (ReportFormatError if not)."""
    missing = [k for k in _REQUIRED_FIELDS if k not in d]
    if missing:
        raise ReportFormatError(
            f"{where}: not an onnx-sbs record (no {', '.join(missing)}); expected a file "
            "written by onnx-sbs run"
        )
    kw: dict[str, Any] = {}
    for key, value in d.items():
        if key == "extra":
            kw[key] = _extra_of(value, where)
            continue
        if key not in _KINDS_OF_FIELDS:
            continue  # a field of a newer version
        base, optional = _KINDS_OF_FIELDS[key]
        if value is None:
            if not optional:
                raise ReportFormatError(f"{where}: {key} must not be empty")
        elif base is float:
            if isinstance(value, str) and value in _NON_FINITE:
                value = _NON_FINITE[value]
            elif isinstance(value, bool) or not isinstance(value, int | float):
                raise ReportFormatError(f"{where}: {key} must be a number, got {value!r:.60}")
            value = float(value)
        elif base is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ReportFormatError(f"{where}: {key} must be an integer, got {value!r:.60}")
        elif not isinstance(value, base):
            raise ReportFormatError(f"{where}: {key} must be a {base.__name__}, got {value!r:.60}")
        kw[key] = value
    if kw["status"] not in _STATUSES:
        raise ReportFormatError(f"{where}: unknown status {kw['status']!r:.60}")
    if kw["kind"] not in _KINDS:
        raise ReportFormatError(f"{where}: unknown kind {kw['kind']!r:.60}")
    return Record(**kw)


def _extra_of(value: Any, where: str) -> dict[str, Any]:
    """Record.extra from a file: names to plain values (non-finite numbers as written)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ReportFormatError(f"{where}: extra must be an object, got {value!r:.60}")
    out = {}
    for k, v in value.items():
        if not isinstance(v, str | int | float | bool | None):
            raise ReportFormatError(f"{where}: extra.{k} must be a plain value, got {v!r:.60}")
        if isinstance(v, int) and not isinstance(v, bool) and abs(v) >= 2**53:
            v = plain_value(v)  # beyond a float: as text, as the run writes it
        out[str(k)] = _NON_FINITE.get(v, v) if isinstance(v, str) else v
    return out


def _plain(v: Any) -> Any:
    """pandas reads empty cells as NaN and numbers as numpy types: plain Python values."""
    if hasattr(v, "item"):
        v = v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _clean_row(row: dict[str, Any]) -> dict[str, Any]:
    """A spreadsheet row as a record dict (CSV/Excel cannot tell an empty cell from NaN;
    JSON Lines keeps NaN).  Types are checked by :func:`record_from_dict`."""
    out: dict[str, Any] = {}
    for k, v in row.items():
        if isinstance(k, str) and k.startswith(EXTRA_PREFIX):
            v = _plain(v)
            if v is not None:
                out.setdefault("extra", {})[k[len(EXTRA_PREFIX) :]] = v
            continue
        if k not in _KINDS_OF_FIELDS:
            continue
        v = _plain(v)
        if isinstance(v, float) and k in _INT_FIELDS and v.is_integer():
            v = int(v)  # a column with empty cells is read as floats
        elif k in _BOOL_FIELDS and isinstance(v, int | float) and v in (0, 1):
            v = bool(v)
        elif k in _BOOL_FIELDS and isinstance(v, str) and v in ("True", "False"):
            v = v == "True"
        elif isinstance(v, str) and k not in _STR_FIELDS and v in _NON_FINITE:
            v = _NON_FINITE[v]
        out[k] = v
    return out


def _cut_short(records: list[Record], nodes_total: int | None, reason: str) -> Completion:
    """An incomplete run: its nodes with a record, of how many if the header said."""
    done = len({r.onnx_id_node for r in records if (r.onnx_id_node or 0) >= 0} - {None})
    if nodes_total is not None:
        done = min(done, nodes_total)
    return Completion(INCOMPLETE, done if records else 0, nodes_total, reason)


def _completion_of(summary: Any) -> Completion | None:
    c = getattr(summary, "completion", None)
    if isinstance(c, Completion):
        return c
    if isinstance(summary, Mapping) and summary.get("completion"):
        try:
            return Completion.from_dict(summary["completion"])
        except (TypeError, ValueError):
            return None
    return None
