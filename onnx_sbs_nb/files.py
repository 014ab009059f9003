"""Writing files where the user said, whole or not at all.

Every file the package writes goes through this module.  A report, node data, a replay
bundle's file, an exported notebook is written to a fresh name next to its destination
and moved over it with ``os.replace``: an interrupted write leaves the previous file (or
nothing), never half a file, and a symbolic link planted at the destination is replaced,
never followed out of the folder the user chose.  Files written together (a model and its
external data) are written in a fresh folder beside them and moved in one by one.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .errors import SbsInputError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A new path next to ``path`` to write to; it replaces ``path`` if the block succeeds.

    The temporary name keeps the suffix (writers that choose a format by suffix still
    do) and starts with a dot; it is removed if the block fails or is interrupted.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.{secrets.token_hex(6)}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def make_parent(path: str | os.PathLike[str]) -> Path:
    """Creates the folders above ``path``; a link to a missing folder or a file on the way
    is named instead of a bare ``[Errno 17] File exists``."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        why = writable_location(path) or f"{str(path.parent)!r} is not a folder"
        raise SbsInputError(why) from None
    return path


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    with atomic_path(make_parent(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_path(make_parent(path)) as tmp:
        tmp.write_bytes(data)
    return Path(path)


@contextlib.contextmanager
def atomic_folder(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh, empty folder inside ``folder`` to write several files to (a model and
    its external data: they name each other, so they are written under their final
    names); when the block succeeds each is moved over its namesake in ``folder``.  A
    link planted at any of those names is replaced, not followed."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=folder))
    try:
        yield tmp
        for f in sorted(tmp.iterdir()):
            if f.is_symlink() or not f.is_file():
                raise OSError(f"refusing to move {f.name!r}: not a plain file")
            os.replace(f, folder / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def open_new_fd(path: str | os.PathLike[str]) -> int:
    """A descriptor of ``path`` opened for writing, emptied: a link at ``path`` is
    replaced, not followed."""
    path = Path(path)
    if path.is_symlink():
        path.unlink()
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
    return os.open(path, flags, 0o666)


def open_new(path: str | os.PathLike[str]) -> IO[str]:
    """``path`` opened for writing as a new file: a link at ``path`` is replaced, not followed."""
    return os.fdopen(open_new_fd(path), "w", encoding="utf-8")


@contextlib.contextmanager
def output_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    """Holds the lock of the outputs named after ``path`` (a ``.NAME.lock`` file beside
    it) for the block: two runs writing the same files at once would interleave their
    records, so the later one is refused with a message naming the file.  The lock file
    is removed while still held; a run that locked a file removed meanwhile is refused
    too (another run holds the name)."""
    try:
        import fcntl
    except ImportError:  # no flock here: nothing to hold
        yield
        return
    path = Path(path)
    make_parent(path)
    lock = path.with_name(f".{path.name}.lock")
    if lock.is_symlink():
        lock.unlink()
    fd = os.open(lock, os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held = os.path.samestat(os.fstat(fd), os.stat(lock))
        except OSError:
            held = False
        if not held:
            raise SbsInputError(
                f"{str(path)!r} is being written by another run: give each run its own "
                "output files (-o), or wait for the other one to end"
            )
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.unlink()
    finally:
        os.close(fd)  # the lock goes with it


def writable_location(path: str | os.PathLike[str]) -> str | None:
    """Why ``path`` cannot be written (None when it can), checked before a run starts.

    The nearest existing folder above it must be a folder the user may write in; the
    folders in between are created when the file is written.
    """
    path = Path(path)
    if path.is_dir():
        return f"{str(path)!r} is a folder: give a file name such as report.html"
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():
            return (
                f"cannot write {str(path)!r}: {str(parent)!r} is a link to "
                f"{os.readlink(parent)!r}, which does not exist"
            )
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        return f"cannot write {str(path)!r}: {str(parent)!r} is not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot write {str(path)!r}: no permission to write in {str(parent)!r}"
    if path.exists() and not os.access(path, os.W_OK) and not path.is_symlink():
        # os.replace would still succeed in a writable folder, but the user said no
        return f"cannot write {str(path)!r}: the file is read-only"
    return None


def planted_link(folder: str | os.PathLike[str]) -> str | None:
    """Why a folder the package names itself (``sbs_replays`` beside the reports) cannot be
    written into: a link at its name (planted, or left by someone) would send the files
    wherever it points.  None when the name is free or a real folder."""
    folder = Path(folder)
    if folder.is_symlink():
        return (
            f"{str(folder)!r} is a link (to {os.readlink(folder)!r}): onnx-sbs writes into "
            "the folders it names only where they are real folders; remove the link, or name "
            "the folder yourself (--replay-dir)"
        )
    return None


__all__ = [
    "atomic_folder",
    "atomic_path",
    "make_parent",
    "open_new",
    "open_new_fd",
    "output_lock",
    "planted_link",
    "writable_location",
    "write_bytes_atomic",
    "write_text_atomic",
]


def json_safe(value: Any) -> Any:
    """``value`` as JSON can hold it: NaN and infinities as ``"nan"``, ``"inf"``,
    ``"-inf"``, through dicts, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_json_atomic(path: str | os.PathLike[str], data: Any) -> Path:
    """``data`` as indented JSON (non-finite floats as strings), written whole or not at
    all; a link at ``path`` is replaced, not followed."""
    return write_text_atomic(path, json.dumps(json_safe(data), indent=2) + "\n")


def save_onnx_atomic(model: Any, path: str | os.PathLike[str]) -> Path:
    """An ONNX model saved whole or not at all (its parent folder made)."""
    import onnx

    with atomic_path(make_parent(path)) as tmp:
        onnx.save(model, str(tmp))
    return Path(path)
