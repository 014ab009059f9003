"""Report files: records to a DataFrame, CSV, Excel and JSON Lines, and back.

The JSON Lines file is the primary record of a run: a header line, one record per line,
flushed as it comes, so a run that is killed keeps everything it computed, and a trailer
line that says how the run ended.  A file without its trailer is a run that did not end
(killed, or a file cut short): it is read back as ``incomplete``, never as a pass.  Every
other format is written from records (read back from that file when the run is over, or
later by ``onnx-sbs report``), and says how far the run got too: CSV in its ``run_*``
columns, Excel in its ``run`` sheet, HTML in its summary.

Records come from untrusted files: reading checks every field's type and refuses files
that are not ours.  Strings written to CSV and Excel are never formulas.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import math
import os
import pathlib
import re
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

from .. import records as _records
from ..compare.user_compare import plain_value
from ..completion import INCOMPLETE, Completion
from ..files import atomic_path, open_new_fd, write_bytes_atomic, write_text_atomic
from ..records import RECORD_FIELDS, Record

if TYPE_CHECKING:
    import pandas

#: Suffixes :func:`write_report` understands.
REPORT_SUFFIXES: tuple[str, ...] = (".html", ".htm", ".xlsx", ".csv", ".jsonl")

#: What identifies our files, and the version of their layout.
FORMAT = "onnx-sbs-records"
FORMAT_VERSION = 1
_META_KEY = "onnx_sbs"  # key of the header / trailer lines of a .jsonl (records lack it)
_HEADER = "records"
_TRAILER = "end"
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


# ---- JSON Lines -----------------------------------------------------------------------


class RecordsWriteError(OSError):
    """The records file could not be written (a full disk): the message names the file and
    what it keeps."""


class JsonlWriter:
    """Writes records to a JSON Lines file, each line handed to the system whole, so a
    killed run keeps them.

    The file starts with a header line (``header``: what the run is, e.g. its node count)
    and ends with the trailer that :meth:`finish` writes; a file closed without it is read
    back as an incomplete run.  A write that fails (a full disk) raises
    :class:`RecordsWriteError` naming the file; the file keeps every complete line, cut
    back to the last one, and ends with a trailer saying the run is incomplete, for which
    the last records give their room when the disk has no more.
    """

    def __init__(
        self,
        path: str | pathlib.Path,
        *,
        append: bool = False,
        header: Mapping[str, Any] | None = None,
    ) -> None:
        self.path = pathlib.Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.count = 0
        if append:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        else:
            fd = open_new_fd(self.path)
        self._fd: int | None = fd
        self._good = os.lseek(fd, 0, os.SEEK_END)  # the end of the last complete line
        # the ends of the last record lines: on a full disk, the trailer takes their room
        self._record_ends: list[int] = []
        if not append:
            meta = {_META_KEY: _HEADER, "format": FORMAT, "version": FORMAT_VERSION}
            self._line({**dict(header or {}), **meta})
        self._header_end = self._good

    def _write_all(self, data: bytes) -> None:
        assert self._fd is not None
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]

    def _line(self, obj: Mapping[str, Any]) -> None:
        if self._fd is None:
            raise ValueError(f"JsonlWriter for {self.path} is closed")
        data = (json.dumps(obj, allow_nan=False) + "\n").encode("utf-8")
        try:
            self._write_all(data)
        except OSError as e:
            self._failed(e)
        except BaseException:
            # an interrupt within a line: the file still ends at a line's end
            self._cut()
            raise
        self._good += len(data)

    def _cut(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._good)
                os.lseek(self._fd, self._good, os.SEEK_SET)

    def _failed(self, error: OSError) -> NoReturn:
        """Cuts the file back to its last complete line, closes it with a trailer if the
        disk allows, and raises RecordsWriteError."""
        self._cut()
        reason = f"the records file could not be written: {error.strerror or error}"
        trailer = {
            _META_KEY: _TRAILER,
            "records": self.count,
            "completion": Completion(INCOMPLETE, reason=reason).to_dict(),
        }
        closed = "without its end-of-run line (no room for it)"
        while True:
            data = (json.dumps(trailer) + "\n").encode("utf-8")
            try:
                self._write_all(data)
                closed = "closed with an end-of-run line saying so"
                break
            except OSError:
                self._cut()
            # the end-of-run line matters more than the last record: make room for it
            if len(self._record_ends) >= 2:
                before = self._record_ends[-2]
            elif self.count == 1 and self._record_ends:
                before = self._header_end
            else:
                break
            self._record_ends.pop()
            self._good = before
            self.count -= 1
            trailer["records"] = self.count
            self._cut()
        self.close()
        raise RecordsWriteError(
            f"cannot write records to {str(self.path)!r} ({error.strerror or error}): it keeps "
            f"the {self.count} complete records written before, {closed}; free space or "
            "choose another -o"
        ) from None

    def write(self, record: Record) -> None:
        self._line(record.to_dict())
        self.count += 1
        self._record_ends.append(self._good)
        if len(self._record_ends) > 64:
            del self._record_ends[:32]

    def finish(self, completion: Completion | None = None) -> None:
        """The trailer (how the run ended), then close: the file is whole."""
        if self._fd is None:
            return
        trailer = {
            _META_KEY: _TRAILER,
            "records": self.count,
            "completion": completion.to_dict() if completion is not None else None,
        }
        self._line(trailer)
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            os.close(fd)  # the lock goes with it

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_jsonl(
    records: Iterable[Record], path: str | pathlib.Path, completion: Completion | None = None
) -> pathlib.Path:
    path = pathlib.Path(path)
    with atomic_path(path) as tmp, JsonlWriter(tmp) as w:
        for r in records:
            w.write(r)
        w.finish(completion)
    return path


def read_jsonl(path: str | pathlib.Path) -> list[Record]:
    """Reads records back; a truncated last line (the run was killed mid-write) is skipped."""
    return read_jsonl_file(path).records


def read_jsonl_file(path: str | pathlib.Path) -> RecordsFile:
    """Records and the run's completion; a file without its trailer is incomplete."""
    path = pathlib.Path(path)
    if not path.is_file():
        raise ReportFormatError(f"no such records file: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ReportFormatError(f"cannot read {path} as JSON Lines text: {e}") from None
    records: list[Record] = []
    header: dict[str, Any] | None = None
    trailer: dict[str, Any] | None = None
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        where = f"{path}:{i + 1}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            if i == len(lines) - 1:
                break  # the writer was killed in the middle of this line
            raise ReportFormatError(f"{where}: not a JSON record ({e})") from None
        if not isinstance(d, dict):
            raise ReportFormatError(f"{where}: expected a JSON object per line")
        if trailer is not None:
            raise ReportFormatError(f"{where}: a line after the end-of-run line")
        meta = d.get(_META_KEY)
        if meta == _HEADER and header is None and not records:
            header = d
        elif meta == _TRAILER:
            trailer = d
        elif meta is not None:
            raise ReportFormatError(f"{where}: unexpected {_META_KEY!r} line {meta!r}")
        else:
            records.append(record_from_dict(d, where))
    if header is not None and header.get("format") != FORMAT:
        raise ReportFormatError(f"{path}: not an onnx-sbs records file")
    if trailer is not None:
        completion = _trailer_completion(trailer, path, len(records))
    elif header is not None:
        completion = _cut_short(
            records,
            _count(header.get("nodes_total")),
            "the records file ends before its end-of-run line: the run was killed, or "
            "the file was cut short",
        )
    else:
        completion = _cut_short(records, None, _NO_HEADER)
    return RecordsFile(records, completion)


_NO_HEADER = (
    "the file has no onnx-sbs header (an older version, or another tool, wrote it): "
    "nothing says the run went to its end"
)


def _trailer_completion(trailer: dict[str, Any], path: Any, n: int) -> Completion | None:
    if trailer.get("records") != n:
        return _cut_short(
            [],
            None,
            f"the end-of-run line counts {trailer.get('records')!r} records, the file holds {n}",
        )
    c = trailer.get("completion")
    if c is None:
        return None
    try:
        return Completion.from_dict(c)
    except (TypeError, ValueError) as e:
        raise ReportFormatError(f"{path}: bad end-of-run line ({e})") from None


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _cut_short(records: list[Record], nodes_total: int | None, reason: str) -> Completion:
    """An incomplete run: its nodes with a record, of how many if the header said."""
    done = len({r.onnx_id_node for r in records if (r.onnx_id_node or 0) >= 0} - {None})
    if nodes_total is not None:
        done = min(done, nodes_total)
    return Completion(INCOMPLETE, done if records else 0, nodes_total, reason)


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


# ---- any format -----------------------------------------------------------------------


def read_records(path: str | pathlib.Path) -> list[Record]:
    """Records from any report file this module writes, except HTML."""
    return read_records_file(path).records


def read_records_file(path: str | pathlib.Path) -> RecordsFile:
    """Records and what the file says about the run, from a .jsonl, .csv or .xlsx."""
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    readers = {".jsonl": read_jsonl_file, ".csv": read_csv_file, ".xlsx": read_xlsx_file}
    if suffix not in readers:
        raise ReportFormatError(
            f"cannot read records from {path.name!r}: expected a .jsonl, .csv or .xlsx file"
        )
    if not path.is_file():
        raise ReportFormatError(f"no such records file: {path}")
    return readers[suffix](path)


def write_report(
    records: list[Record],
    path: str | pathlib.Path,
    summary: Any = None,
    *,
    title: str = "",
    model: Any = None,
    preface: str = "",
) -> pathlib.Path:
    """Writes one report whose format follows the path's suffix (see :data:`REPORT_SUFFIXES`).

    ``model``: the ONNX model, for the HTML report's graph around each node.
    ``preface``: script-free HTML above the HTML report's view (a precision advice).

    The file is written whole or not at all (a new file moved over the old one), and a
    link at ``path`` is replaced, not followed.
    """
    path = pathlib.Path(path)
    suffix = path.suffix.lower()
    if suffix not in REPORT_SUFFIXES:
        raise ReportFormatError(
            f"unknown report format {path.name!r}: use one of {', '.join(REPORT_SUFFIXES)}"
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".jsonl":
        return write_jsonl(records, path, _completion_of(summary))
    if suffix == ".csv":
        return write_csv(records, path, summary)
    if suffix == ".xlsx":
        return write_xlsx(records, path, summary)
    from .html import report_html

    return write_text_atomic(
        path, report_html(records, summary, title=title, model=model, preface=preface)
    )


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


__all__ = [
    "FORMAT",
    "REPORT_SUFFIXES",
    "RUN_COLUMNS",
    "JsonlWriter",
    "RecordsFile",
    "ReportFormatError",
    "neutralize_formula",
    "read_csv",
    "read_jsonl",
    "read_jsonl_file",
    "read_records",
    "read_records_file",
    "read_xlsx",
    "record_from_dict",
    "records_to_frame",
    "restore_formula",
    "write_csv",
    "write_jsonl",
    "write_report",
    "write_xlsx",
]
