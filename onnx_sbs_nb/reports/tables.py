"""Records as spreadsheets: CSV (with ``run_*`` columns saying how far the run got) and
Excel (with a ``run`` sheet), and back.  No cell is ever a formula."""

from __future__ import annotations

import io
import pathlib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from ..completion import Completion
from ..files import atomic_path, write_bytes_atomic
from ..records import Record

if TYPE_CHECKING:
    import pandas

from .records_file import (
    _FORMULA_START,
    _REQUIRED_FIELDS,
    _STR_FIELDS,
    FORMAT,
    FORMAT_VERSION,
    RUN_COLUMNS,
    RecordsFile,
    ReportFormatError,
    _clean_row,
    _completion_of,
    _cut_short,
    _plain,
    record_from_dict,
    records_to_frame,
)

# ---- spreadsheets ---------------------------------------------------------------------


def neutralize_formula(text: str) -> str:
    """A cell that no spreadsheet reads as a formula: a leading ``'`` before = + - @ tab CR
    NUL (and before a ``'`` that precedes one, so :func:`restore_formula` is exact)."""
    if text.lstrip("'").startswith(_FORMULA_START):
        return "'" + text
    return text


def restore_formula(text: str) -> str:
    """The text :func:`neutralize_formula` was given."""
    if text.startswith("'") and text.lstrip("'").startswith(_FORMULA_START):
        return text[1:]
    return text


def _string_columns(df: pandas.DataFrame) -> list[str]:
    from pandas.api.types import is_string_dtype

    return [c for c in df.columns if df[c].dtype == object or is_string_dtype(df[c].dtype)]


def _verdict_of(summary: Any, records: list[Record], completion: Completion | None) -> str:
    verdict = getattr(summary, "verdict", None)
    if verdict is None and isinstance(summary, Mapping):
        verdict = summary.get("verdict")
    if verdict is None:
        from ..align.blame.summary import summarize

        verdict = summarize(records, completion=completion).verdict
    return str(verdict)


def _run_values(summary: Any, records: list[Record]) -> dict[str, Any]:
    c = _completion_of(summary)
    return {
        "run_verdict": _verdict_of(summary, records, c),
        "run_state": c.state if c is not None else None,
        "run_nodes_done": c.nodes_done if c is not None else None,
        "run_nodes_total": c.nodes_total if c is not None else None,
        "run_reason": c.reason if c is not None else None,
    }


def write_csv(
    records: Iterable[Record], path: str | pathlib.Path, summary: Any = None
) -> pathlib.Path:
    """Record columns, then :data:`RUN_COLUMNS`; strings neutralised against formulas."""
    path = pathlib.Path(path)
    records = list(records)
    df = records_to_frame(records)
    for name, value in _run_values(summary, records).items():
        df[name] = value
    for c in _string_columns(df):
        df[c] = df[c].map(lambda v: neutralize_formula(v) if isinstance(v, str) else v)
    with atomic_path(path) as tmp:
        # RFC 4180 line ends: a field holding CR or LF is then quoted, not split
        df.to_csv(tmp, index=False, lineterminator="\r\n")
    return path


def read_csv(path: str | pathlib.Path) -> list[Record]:
    return read_csv_file(path).records


def read_csv_file(path: str | pathlib.Path) -> RecordsFile:
    import pandas

    path = pathlib.Path(path)
    try:
        df = pandas.read_csv(path, dtype=_csv_dtypes(), keep_default_na=False, na_values=[""])
    except (OSError, ValueError, pandas.errors.ParserError, UnicodeDecodeError) as e:
        raise ReportFormatError(f"cannot read {path} as an onnx-sbs CSV: {e}") from None
    _check_columns(df, path)
    for c in _string_columns(df):
        df[c] = df[c].map(lambda v: restore_formula(v) if isinstance(v, str) else v)
    rows = df.to_dict(orient="records")
    records = _table_records(rows, str(path))
    if set(RUN_COLUMNS) <= set(df.columns) and rows:
        completion = _run_completion({k: _plain(rows[0].get(k)) for k in RUN_COLUMNS}, path)
    else:
        completion = _cut_short(records, None, _NO_RUN_INFO)
    return RecordsFile(records, completion)


_NO_RUN_INFO = (
    "the file does not say how the run ended (an older version wrote it): nothing says "
    "the run went to its end"
)


def _csv_dtypes() -> dict[str, Any]:
    # strings stay strings ("1e-3" as a name is not a number); numbers are parsed
    return {name: object for name in _STR_FIELDS} | {"run_verdict": object, "run_state": object}


def _check_columns(df: pandas.DataFrame, path: Any) -> None:
    missing = [k for k in _REQUIRED_FIELDS if k not in df.columns]
    if missing:
        raise ReportFormatError(
            f"{path} is not an onnx-sbs records table: no column {', '.join(missing)} "
            f"(its columns: {', '.join(map(str, list(df.columns)[:8]))})"
        )


def _table_records(rows: list[dict[str, Any]], where: str) -> list[Record]:
    """Records from a table's rows (row 1 is the header), blank rows skipped."""
    return [
        record_from_dict(_clean_row(row), f"{where}:{i + 2}")
        for i, row in enumerate(rows)
        if not _is_blank(row)
    ]


def _is_blank(row: dict[str, Any]) -> bool:
    return all(_plain(v) is None for v in row.values())


def _run_completion(values: dict[str, Any], path: Any) -> Completion | None:
    if values.get("run_state") is None:
        return None  # the writer was told nothing about the run
    try:
        return Completion.from_dict(
            {
                "state": values["run_state"],
                "nodes_done": _as_int(values.get("run_nodes_done")),
                "nodes_total": _as_int(values.get("run_nodes_total")),
                "reason": values.get("run_reason"),
            }
        )
    except (TypeError, ValueError) as e:
        raise ReportFormatError(f"{path}: bad run columns ({e})") from None


def _as_int(v: Any) -> Any:
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


# openpyxl refuses these characters in a cell: a model name holding one would cost the
# whole workbook
_ILLEGAL_XLSX = re.compile(r"[\000-\010]|[\013-\014]|[\016-\037]")


def _xlsx_text(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    return _ILLEGAL_XLSX.sub(lambda m: f"\\x{ord(m.group()):02x}", v)


def write_xlsx(
    records: Iterable[Record], path: str | pathlib.Path, summary: Any = None
) -> pathlib.Path:
    """Sheet ``sbs``: the records (onnx-diagnostic's column names); ``summary``: the
    summary's text; ``run``: how far the run got.  No cell is a formula."""
    import pandas

    from .html import summary_text

    path = pathlib.Path(path)
    records = list(records)
    df = records_to_frame(records)
    for c in _string_columns(df):
        df[c] = df[c].map(_xlsx_text)
    run = _run_values(summary, records)
    text_columns = [df.columns.get_loc(c) + 1 for c in _string_columns(df)]
    # built in memory, then written whole: a full disk cannot leave openpyxl's zip half
    # written (whose finaliser then complains on stderr)
    buffer = io.BytesIO()
    with pandas.ExcelWriter(buffer, engine="openpyxl") as xw:
        df.to_excel(xw, sheet_name="sbs", index=False)
        text = summary_text(summary)
        if text:
            lines = pandas.DataFrame({"summary": [_xlsx_text(x) for x in text.splitlines()]})
            lines.to_excel(xw, sheet_name="summary", index=False)
        table = pandas.DataFrame(
            {"key": ["format", "version", *RUN_COLUMNS]},
        )
        table["value"] = [FORMAT, FORMAT_VERSION, *(_xlsx_text(run[k]) for k in RUN_COLUMNS)]
        table.to_excel(xw, sheet_name="run", index=False)
        for name, sheet in xw.sheets.items():
            _no_formulas(sheet, text_columns if name == "sbs" else None)
        sheet = xw.sheets["sbs"]
        sheet.freeze_panes = "A2"
        sheet.auto_filter.ref = sheet.dimensions
    write_bytes_atomic(path, buffer.getvalue())
    return path


def _no_formulas(sheet: Any, columns: list[int] | None = None) -> None:
    """openpyxl stores a string that starts with "=" as a formula: store it as text.

    ``columns`` (1-based) are the only ones that can hold strings, when known."""
    ranges = [(c, c) for c in columns] if columns is not None else [(None, None)]
    for lo, hi in ranges:
        for row in sheet.iter_rows(min_col=lo, max_col=hi):
            for cell in row:
                if cell.data_type == "f":
                    cell.data_type = "s"


def read_xlsx(path: str | pathlib.Path) -> list[Record]:
    return read_xlsx_file(path).records


def read_xlsx_file(path: str | pathlib.Path) -> RecordsFile:
    import pandas

    path = pathlib.Path(path)
    try:
        sheets = pandas.read_excel(path, sheet_name=None, dtype=_csv_dtypes())
    except Exception as e:  # openpyxl and zipfile raise many kinds for a damaged file
        raise ReportFormatError(
            f"cannot read {path} as an Excel workbook ({type(e).__name__}: {e})"
        ) from None
    if "sbs" not in sheets:
        raise ReportFormatError(f"{path} has no 'sbs' sheet: it was not written by onnx-sbs")
    df = sheets["sbs"]
    _check_columns(df, path)
    records = _table_records(df.to_dict(orient="records"), f"{path}:sbs")
    run = sheets.get("run")
    if run is not None and {"key", "value"} <= set(run.columns):
        values = {str(k): _plain(v) for k, v in zip(run["key"], run["value"])}
        if values.get("format") != FORMAT:
            raise ReportFormatError(f"{path}: its 'run' sheet is not onnx-sbs's")
        completion = _run_completion(values, path)
    else:
        completion = _cut_short(records, None, _NO_RUN_INFO)
    return RecordsFile(records, completion)
