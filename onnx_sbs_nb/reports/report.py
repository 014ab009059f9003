"""Report formats: each a named object in one ordered registry (:data:`REPORT_FORMATS`),
saying which suffixes it writes, whether records can be read back from it, and how.

The JSON Lines file is the primary record of a run (:mod:`.jsonl`); every other format is
written from records (read back from that file when the run is over, or later by
``onnx-sbs report``) and says how far the run got too: CSV in its ``run_*`` columns, Excel
in its ``run`` sheet (:mod:`.tables`), HTML in its summary (:mod:`.html`).  Records come
from untrusted files: reading checks every field's type and refuses files that are not
ours (:mod:`.records_file`).  Adding a format is one class here and one entry in
:data:`REPORT_FORMATS`.
"""

from __future__ import annotations

import pathlib
from typing import Any, ClassVar

from ..files import write_text_atomic
from ..records import Record
from .jsonl import JsonlWriter, RecordsWriteError, read_jsonl, read_jsonl_file, write_jsonl
from .records_file import (
    FORMAT,
    RUN_COLUMNS,
    RecordsFile,
    ReportFormatError,
    _completion_of,
    record_from_dict,
    records_to_frame,
)
from .tables import (
    neutralize_formula,
    read_csv,
    read_csv_file,
    read_xlsx,
    read_xlsx_file,
    restore_formula,
    write_csv,
    write_xlsx,
)


class ReportFormat:
    """One report format: ``name``, the ``suffixes`` it is chosen by, :meth:`write`, and
    :meth:`read` where records can be read back from it (``reads``)."""

    name: ClassVar[str]
    suffixes: ClassVar[tuple[str, ...]]
    reads: ClassVar[bool] = False

    def write(
        self,
        records: list[Record],
        path: pathlib.Path,
        summary: Any,
        *,
        title: str,
        model: Any,
        preface: str,
    ) -> pathlib.Path:
        raise NotImplementedError

    def read(self, path: pathlib.Path) -> RecordsFile:
        raise ReportFormatError(f"records cannot be read back from a {self.name} report")


class JsonlFormat(ReportFormat):
    name, suffixes, reads = "JSON Lines", (".jsonl",), True

    def write(self, records, path, summary, *, title, model, preface):
        return write_jsonl(records, path, _completion_of(summary))

    def read(self, path):
        return read_jsonl_file(path)


class CsvFormat(ReportFormat):
    name, suffixes, reads = "CSV", (".csv",), True

    def write(self, records, path, summary, *, title, model, preface):
        return write_csv(records, path, summary)

    def read(self, path):
        return read_csv_file(path)


class XlsxFormat(ReportFormat):
    name, suffixes, reads = "Excel", (".xlsx",), True

    def write(self, records, path, summary, *, title, model, preface):
        return write_xlsx(records, path, summary)

    def read(self, path):
        return read_xlsx_file(path)


class HtmlFormat(ReportFormat):
    name, suffixes = "HTML", (".html", ".htm")

    def write(self, records, path, summary, *, title, model, preface):
        from .html import report_html

        html = report_html(records, summary, title=title, model=model, preface=preface)
        return write_text_atomic(path, html)


#: Every report format, in the order their suffixes are listed to users.
REPORT_FORMATS: tuple[ReportFormat, ...] = (HtmlFormat(), XlsxFormat(), CsvFormat(), JsonlFormat())

#: Suffixes :func:`write_report` understands.
REPORT_SUFFIXES: tuple[str, ...] = tuple(s for f in REPORT_FORMATS for s in f.suffixes)


def report_format(path: str | pathlib.Path, reading: bool = False) -> ReportFormat:
    """The format a path's suffix names; a clear error for a suffix no format has."""
    name = pathlib.Path(path).name
    suffix = pathlib.Path(path).suffix.lower()
    for fmt in REPORT_FORMATS:
        if suffix in fmt.suffixes and (fmt.reads or not reading):
            return fmt
    if reading:
        readable = ", ".join(s for f in REPORT_FORMATS if f.reads for s in f.suffixes)
        raise ReportFormatError(f"cannot read records from {name!r}: expected a {readable} file")
    raise ReportFormatError(
        f"unknown report format {name!r}: use one of {', '.join(REPORT_SUFFIXES)}"
    )


def read_records(path: str | pathlib.Path) -> list[Record]:
    """Records from any report file this package writes, except HTML."""
    return read_records_file(path).records


def read_records_file(path: str | pathlib.Path) -> RecordsFile:
    """Records and what the file says about the run, from any format that reads back."""
    path = pathlib.Path(path)
    fmt = report_format(path, reading=True)
    if not path.is_file():
        raise ReportFormatError(f"no such records file: {path}")
    return fmt.read(path)


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
    fmt = report_format(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    return fmt.write(records, path, summary, title=title, model=model, preface=preface)


__all__ = [
    "FORMAT",
    "REPORT_FORMATS",
    "REPORT_SUFFIXES",
    "RUN_COLUMNS",
    "JsonlWriter",
    "RecordsFile",
    "RecordsWriteError",
    "ReportFormat",
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
    "report_format",
    "restore_formula",
    "write_csv",
    "write_jsonl",
    "write_report",
    "write_xlsx",
]
