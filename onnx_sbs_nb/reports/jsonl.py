"""JSON Lines, the primary record of a run: a header line, one record per line, flushed as
it comes (a killed run keeps everything it computed), and a trailer line that says how
the run ended.  A file without its trailer is read back as ``incomplete``, never a pass."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from ..completion import INCOMPLETE, Completion
from ..files import atomic_path, open_new_fd
from ..records import Record
from .records_file import (
    FORMAT,
    FORMAT_VERSION,
    RecordsFile,
    ReportFormatError,
    _cut_short,
    record_from_dict,
)

_META_KEY = "onnx_sbs"  # key of the header / trailer lines of a .jsonl (records lack it)
_HEADER = "records"
_TRAILER = "end"


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
