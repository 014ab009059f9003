"""Report files: records to a DataFrame, CSV, Excel and JSON Lines, and back.

The JSON Lines file is the primary record of a run: one record per line, flushed as it
comes, so a run that is killed keeps everything it computed.  Every other format is
written from records (read back from that file when the run is over, or later by
``onnx-sbs report``).
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import Iterable
from typing import IO, TYPE_CHECKING, Any

from .records import RECORD_FIELDS, Record

if TYPE_CHECKING:
    import pandas

#: Suffixes :func:`write_report` understands.
REPORT_SUFFIXES: tuple[str, ...] = (".html", ".htm", ".xlsx", ".csv", ".jsonl")


class ReportFormatError(ValueError):
    """A report path has a suffix no writer handles, or a report file cannot be read."""


def records_to_frame(records: Iterable[Record]) -> pandas.DataFrame:
    """One row per record, columns in :data:`RECORD_FIELDS` order (onnx-diagnostic names first)."""
    import pandas

    rows = [r.to_dict() if isinstance(r, Record) else dict(r) for r in records]
    df = pandas.DataFrame(rows, columns=list(RECORD_FIELDS))
    # to_dict turns NaN/inf into strings for JSON; a frame wants numbers back.
    for name in RECORD_FIELDS:
        if name.startswith("err_") and df[name].dtype == object:
            df[name] = pandas.to_numeric(df[name], errors="coerce")
    return df


class JsonlWriter:
    """Appends records to a JSON Lines file, flushing each line so a killed run keeps them."""

    def __init__(self, path: str | pathlib.Path, *, append: bool = False) -> None:
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f: IO[str] | None = self.path.open("a" if append else "w", encoding="utf-8")
        self.count = 0

    def write(self, record: Record) -> None:
        if self._f is None:
            raise ValueError(f"JsonlWriter for {self.path} is closed")
        self._f.write(json.dumps(record.to_dict(), allow_nan=False) + "\n")
        self._f.flush()
        self.count += 1

    def close(self) -> None:
        if self._f is not None:
            self._f.close()
            self._f = None

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_jsonl(records: Iterable[Record], path: str | pathlib.Path) -> pathlib.Path:
    with JsonlWriter(path) as w:
        for r in records:
            w.write(r)
    return pathlib.Path(path)


def read_jsonl(path: str | pathlib.Path) -> list[Record]:
    """Reads records back; a truncated last line (the run was killed mid-write) is skipped."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ReportFormatError(f"no such records file: {path}")
    records: list[Record] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break  # the writer was killed in the middle of this line
            raise ReportFormatError(f"{path}:{i + 1}: not a JSON record ({e})") from e
        if not isinstance(d, dict):
            raise ReportFormatError(f"{path}:{i + 1}: expected a JSON object per line")
        records.append(Record.from_dict(d))
    return records


def write_csv(records: Iterable[Record], path: str | pathlib.Path) -> pathlib.Path:
    path = pathlib.Path(path)
    records_to_frame(records).to_csv(path, index=False)
    return path


def read_csv(path: str | pathlib.Path) -> list[Record]:
    import pandas

    df = pandas.read_csv(path)
    return [Record.from_dict(_clean_row(row)) for row in df.to_dict(orient="records")]


def write_xlsx(
    records: Iterable[Record], path: str | pathlib.Path, summary: Any = None
) -> pathlib.Path:
    """Sheet ``sbs`` holds the records (onnx-diagnostic's column names); ``summary`` the verdict."""
    import pandas

    path = pathlib.Path(path)
    df = records_to_frame(records)
    with pandas.ExcelWriter(path, engine="openpyxl") as xw:
        df.to_excel(xw, sheet_name="sbs", index=False)
        from .report_html import summary_text

        text = summary_text(summary)
        if text:
            lines = pandas.DataFrame({"summary": text.splitlines()})
            lines.to_excel(xw, sheet_name="summary", index=False)
        sheet = xw.sheets["sbs"]
        sheet.freeze_panes = "A2"
        sheet.auto_filter.ref = sheet.dimensions
    return path


def read_xlsx(path: str | pathlib.Path) -> list[Record]:
    import pandas

    df = pandas.read_excel(path, sheet_name="sbs")
    return [Record.from_dict(_clean_row(row)) for row in df.to_dict(orient="records")]


def read_records(path: str | pathlib.Path) -> list[Record]:
    """Records from any report file this module writes, except HTML."""
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        return read_jsonl(path)
    if suffix == ".csv":
        return read_csv(path)
    if suffix == ".xlsx":
        return read_xlsx(path)
    raise ReportFormatError(
        f"cannot read records from {path.name!r}: expected a .jsonl, .csv or .xlsx file"
    )


def write_report(
    records: list[Record], path: str | pathlib.Path, summary: Any = None, *, title: str = ""
) -> pathlib.Path:
    """Writes one report whose format follows the path's suffix (see :data:`REPORT_SUFFIXES`)."""
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if suffix not in REPORT_SUFFIXES:
        raise ReportFormatError(
            f"unknown report format {path.name!r}: use one of {', '.join(REPORT_SUFFIXES)}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        return write_jsonl(records, path)
    if suffix == ".csv":
        return write_csv(records, path)
    if suffix == ".xlsx":
        return write_xlsx(records, path, summary)
    from .report_html import report_html

    path.write_text(report_html(records, summary, title=title), encoding="utf-8")
    return path


def _clean_row(row: dict[str, Any]) -> dict[str, Any]:
    """pandas reads empty cells as NaN and ints as numpy types: back to plain Python values."""
    import math

    out: dict[str, Any] = {}
    for k, v in row.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float) and math.isnan(v):
            v = None  # CSV/Excel cannot tell an empty cell from NaN; JSON Lines keeps NaN
        if v is not None and k in _INT_FIELDS:
            v = int(v)
        if v is not None and k in _BOOL_FIELDS:
            v = bool(v)
        if v is not None and k in _STR_FIELDS:
            v = str(v)
        out[k] = v
    return out


def _field_types() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    import dataclasses
    import typing

    hints = typing.get_type_hints(Record)
    ints, bools, strs = set(), set(), set()
    for f in dataclasses.fields(Record):
        h = str(hints[f.name])
        if "int" in h and "float" not in h:
            ints.add(f.name)
        elif "bool" in h:
            bools.add(f.name)
        elif "str" in h:
            strs.add(f.name)
    return frozenset(ints), frozenset(bools), frozenset(strs)


_INT_FIELDS, _BOOL_FIELDS, _STR_FIELDS = _field_types()
