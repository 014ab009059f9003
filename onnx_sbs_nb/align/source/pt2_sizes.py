"""A ``.pt2`` archive's members checked against what they must hold, before inflating one.

torch writes every member of a ``.pt2`` stored, not compressed: a member's bytes are its
bytes on disk.  A hostile archive can deflate a weight of gigabytes of zeros into a few
megabytes, which torch inflates whole while loading.  So before torch reads the file, each
compressed member's declared size is checked: a weight or constant member may not declare
more bytes than the storage of the tensors its config says it holds; any other member may
not inflate more than :data:`MAX_RATIO` times beyond :data:`SMALL_MEMBER`.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

from ...errors import SbsInputError

# a compressed member larger than this once inflated, at more than MAX_RATIO times its
# compressed size, is refused (only long runs of equal bytes compress that well)
SMALL_MEMBER = 16 << 20
MAX_RATIO = 100
# a tensor config (JSON) larger than this is no config torch wrote
MAX_CONFIG = 64 << 20


def _itemsize(code: int) -> int | None:
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    dtype = _SERIALIZE_TO_TORCH_DTYPE.get(code)
    return None if dtype is None else dtype.itemsize


def _ints(values: list) -> list[int] | None:
    out = []
    for v in values:
        if not isinstance(v, dict) or not isinstance(v.get("as_int"), int):
            return None  # symbolic: no bound
        out.append(v["as_int"])
    return out


def _storage_bytes(meta: dict) -> int | None:
    """Bytes the storage of a tensor with this serialized metadata must hold."""
    sizes, strides = _ints(meta.get("sizes", [])), _ints(meta.get("strides", []))
    offset = _ints([meta.get("storage_offset", {"as_int": 0})])
    itemsize = _itemsize(meta.get("dtype"))
    if sizes is None or strides is None or offset is None or itemsize is None:
        return None
    if len(sizes) != len(strides) or any(s < 0 for s in sizes):
        return None
    if 0 in sizes:
        return 0
    last = offset[0] + sum((s - 1) * abs(st) for s, st in zip(sizes, strides))
    return (last + 1) * itemsize


def _needed(z: zipfile.ZipFile, path: Path) -> dict[str, int]:
    """{member: the bytes the tensors stored in it need} from the archive's configs."""
    needed: dict[str, int] = {}
    for info in z.infolist():
        name = info.filename
        folder, _, base = name.rpartition("/")
        if not (
            base.endswith("_config.json")
            and (folder.endswith("data/weights") or folder.endswith("data/constants"))
        ):
            continue
        if info.file_size > MAX_CONFIG:
            raise SbsInputError(
                f"{str(path)!r} was not loaded: its member {name!r} declares {info.file_size} "
                "bytes, no tensor config torch writes is that large"
            )
        try:
            config = json.loads(z.read(info))["config"]
        except Exception:
            continue  # torch says what is wrong with it
        if not isinstance(config, dict):
            continue
        for entry in config.values():
            if not isinstance(entry, dict) or entry.get("use_pickle"):
                continue
            meta, member = entry.get("tensor_meta"), entry.get("path_name")
            if not isinstance(meta, dict) or not isinstance(member, str):
                continue
            size = _storage_bytes(meta)
            key = f"{folder}/{member}"
            if size is None:
                needed[key] = -1  # unknown: the ratio rule decides
            elif needed.get(key, 0) >= 0:
                needed[key] = max(needed.get(key, 0), size)
    return needed


def check_pt2_sizes(path: str | Path) -> None:
    """Refuses an archive with a compressed member declaring more than it must hold."""
    path = Path(path)
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # not a zip: torch's own message says so
    with z:
        needed = _needed(z, path)
        for info in z.infolist():
            if info.compress_type == zipfile.ZIP_STORED:
                continue  # its bytes are on disk: nothing inflates
            limit = needed.get(info.filename, -1)
            if limit >= 0 and info.file_size > limit:
                raise SbsInputError(
                    f"{str(path)!r} was not loaded: its member {info.filename!r} inflates to "
                    f"{info.file_size} bytes where the program's tensors stored there need "
                    f"{limit} (a compressed member torch never writes: a zip bomb or a damaged "
                    "file)"
                )
            if limit < 0 and info.file_size > max(SMALL_MEMBER, MAX_RATIO * info.compress_size):
                raise SbsInputError(
                    f"{str(path)!r} was not loaded: its member {info.filename!r} inflates "
                    f"{info.file_size} bytes from {info.compress_size} (a zip bomb or a damaged "
                    "file; torch writes members uncompressed)"
                )


def check_pt_sizes(path: str | Path, what: str = "file") -> None:
    """Refuses a ``torch.save`` file (a zip, every member stored) with a compressed member
    that would inflate beyond :data:`MAX_RATIO` times its size past :data:`SMALL_MEMBER`:
    checked before ``torch.load`` inflates anything."""
    path = Path(path)
    try:
        z = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError, ValueError):
        return  # the legacy format, or not torch's: nothing is inflated, torch says what
    with z:
        for info in z.infolist():
            if info.compress_type == zipfile.ZIP_STORED:
                continue
            if info.file_size > max(SMALL_MEMBER, MAX_RATIO * info.compress_size):
                raise SbsInputError(
                    f"{what} {str(path)!r} was not loaded: its member {info.filename!r} "
                    f"inflates to {info.file_size} bytes from {info.compress_size} (a zip bomb "
                    "or a damaged file; torch.save writes members uncompressed)"
                )


__all__ = ["MAX_RATIO", "SMALL_MEMBER", "check_pt2_sizes", "check_pt_sizes"]
