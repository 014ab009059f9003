"""ImageDecoder (ai.onnx 20): the lossless formats, decoded with numpy and zlib.

The spec lists BMP, JPEG, JPEG2000, TIFF, PNG, WebP and PNM. The evaluator has no image
library to lean on, so it decodes the formats whose decoding is exact and short: BMP
(uncompressed), PNM, PNG (non-interlaced) and TIFF (uncompressed or PackBits, 8-bit
chunky). JPEG, JPEG2000 and WebP raise a clear error: a lossy decoder written here would
not give the bytes libjpeg or libwebp give, which is what other runtimes return.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import torch

from ..registry import op


class UnsupportedImage(NotImplementedError):
    """An image format or variant this decoder does not read."""


# -- pixel formats ------------------------------------------------------------------------


def _to_pixel_format(rgb: np.ndarray, pixel_format: str) -> np.ndarray:
    """``rgb`` (H, W, 3) uint8 -> the layout the attribute asks for."""
    if pixel_format == "RGB":
        return rgb
    if pixel_format == "BGR":
        return np.ascontiguousarray(rgb[:, :, ::-1])
    if pixel_format == "Grayscale":
        # ITU-R 601-2 luma in 16-bit fixed point, rounded: the conversion of the reference
        # (PIL's convert("L")), so a grayscale decode gives the same bytes
        r, g, b = (rgb[:, :, i].astype(np.uint32) for i in range(3))
        luma = (r * 19595 + g * 38470 + b * 7471 + 0x8000) >> 16
        return luma.astype(np.uint8)[:, :, None]
    raise ValueError(
        f"ImageDecoder: pixel_format must be RGB, BGR or Grayscale, not {pixel_format!r}"
    )


def _gray_to_rgb(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[:, :, None], 3, axis=2)


def _unpack_samples(rows: np.ndarray, bits: int, w: int) -> np.ndarray:
    """(H, bytes) -> (H, w) uint8 samples of 1, 2 or 4 bits, most significant first."""
    h = rows.shape[0]
    split = np.unpackbits(rows, axis=1).reshape(h, -1, bits)
    weights = (1 << np.arange(bits - 1, -1, -1)).astype(np.uint8)
    return (split * weights).sum(axis=2, dtype=np.uint8)[:, :w]


# -- PNM ----------------------------------------------------------------------------------


def _pnm_header(data: bytes, count: int) -> tuple[list[int], int]:
    """The first ``count`` whitespace-separated integers after the magic, skipping
    comments, and the offset just past the single whitespace that ends the header."""
    values: list[int] = []
    i = 2
    while len(values) < count:
        c = data[i : i + 1]
        if c == b"#":
            i = data.index(b"\n", i)
        elif c.isspace():
            i += 1
        else:
            j = i
            while j < len(data) and data[j : j + 1].isdigit():
                j += 1
            values.append(int(data[i:j]))
            i = j
    return values, i + 1


def _scale_to_8bit(v: np.ndarray, maxval: int) -> np.ndarray:
    if maxval == 255:
        return v.astype(np.uint8)
    return np.round(v.astype(np.float64) * 255.0 / maxval).astype(np.uint8)


def _decode_pnm(data: bytes) -> np.ndarray:
    kind = data[1:2]
    bitmap = kind in (b"1", b"4")
    (w, h, *rest), start = _pnm_header(data, 2 if bitmap else 3)
    maxval = 1 if bitmap else rest[0]
    channels = 3 if kind in (b"3", b"6") else 1
    if kind == b"4":
        rows = np.frombuffer(data, np.uint8, h * ((w + 7) // 8), start).reshape(h, -1)
        v = 1 - np.unpackbits(rows, axis=1)[:, :w]  # 1 is black
    elif kind in (b"1", b"2", b"3"):
        if kind == b"1":  # digits may be packed without separators
            digits = [c for c in data[start - 1 :].decode("ascii") if c in "01"]
            v = 1 - np.array(digits[: w * h], dtype=np.int64)
        else:
            v = np.array(data[start - 1 :].split()[: w * h * channels], dtype=np.int64)
    elif kind in (b"5", b"6"):
        dtype = np.dtype(np.uint8) if maxval < 256 else np.dtype(">u2")
        v = np.frombuffer(data, dtype, w * h * channels, start)
    else:
        raise UnsupportedImage(f"PNM variant P{kind.decode(errors='replace')}")
    v = _scale_to_8bit(np.asarray(v).reshape(h, w, channels), maxval)
    return v if channels == 3 else _gray_to_rgb(v[:, :, 0])


# -- BMP ----------------------------------------------------------------------------------


def _decode_bmp(data: bytes) -> np.ndarray:
    (offset,) = struct.unpack_from("<I", data, 10)
    (dib,) = struct.unpack_from("<I", data, 14)
    if dib == 12:  # OS/2 core header
        w, h, _, bits = struct.unpack_from("<HhHH", data, 18)
        compression, n_colors, entry = 0, 0, 3
    else:
        w, h, _, bits, compression = struct.unpack_from("<iiHHI", data, 18)
        (n_colors,) = struct.unpack_from("<I", data, 46)
        entry = 4
    if compression not in (0, 3) or (compression == 3 and bits not in (16, 32)):
        raise UnsupportedImage(f"BMP compression {compression}")
    top_down, h = h < 0, abs(h)
    stride = ((w * bits + 31) // 32) * 4
    rows = np.frombuffer(data, np.uint8, stride * h, offset).reshape(h, stride)
    if not top_down:
        rows = rows[::-1]
    if bits in (1, 4, 8):
        n = n_colors or 1 << bits
        pal = np.frombuffer(data, np.uint8, n * entry, 14 + dib).reshape(n, entry)[:, 2::-1]
        idx = _unpack_samples(rows, bits, w) if bits < 8 else rows[:, :w]
        return np.ascontiguousarray(pal[idx])
    if bits == 24:
        return np.ascontiguousarray(rows[:, : w * 3].reshape(h, w, 3)[:, :, ::-1])
    if bits == 32:
        masks = struct.unpack_from("<III", data, 54) if compression == 3 else None
        if masks not in (None, (0xFF0000, 0xFF00, 0xFF)):
            raise UnsupportedImage(f"BMP bit fields {masks}")
        return np.ascontiguousarray(rows[:, : w * 4].reshape(h, w, 4)[:, :, 2::-1])
    raise UnsupportedImage(f"BMP with {bits} bits per pixel")


# -- PNG ----------------------------------------------------------------------------------


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def _unfilter(raw: bytes, h: int, row_bytes: int, bpp: int) -> np.ndarray:
    """Undoes the per-row filters (None, Sub, Up, Average, Paeth) of the PNG spec."""
    out = np.zeros((h, row_bytes), dtype=np.uint8)
    prev = np.zeros(row_bytes, dtype=np.uint8)
    for y in range(h):
        start = y * (row_bytes + 1)
        kind = raw[start]
        line = np.frombuffer(raw, np.uint8, row_bytes, start + 1)
        if kind == 0:
            cur = line.copy()
        elif kind == 2:
            cur = line + prev
        elif kind == 1 and row_bytes % bpp == 0:
            # running sum per byte lane, modulo 256
            lanes = line.reshape(-1, bpp).astype(np.int64)
            cur = (np.cumsum(lanes, axis=0) % 256).astype(np.uint8).reshape(-1)
        elif kind in (1, 3, 4):
            cur = _unfilter_sequential(kind, line.tolist(), prev.tolist(), bpp)
        else:
            raise UnsupportedImage(f"PNG filter type {kind}")
        out[y] = cur
        prev = out[y]
    return out


def _unfilter_sequential(kind: int, line: list[int], up: list[int], bpp: int) -> np.ndarray:
    cur = [0] * len(line)
    for x, v in enumerate(line):
        a = cur[x - bpp] if x >= bpp else 0
        if kind == 1:
            pred = a
        elif kind == 3:
            pred = (a + up[x]) >> 1
        else:
            pred = _paeth(a, up[x], up[x - bpp] if x >= bpp else 0)
        cur[x] = (v + pred) & 0xFF
    return np.array(cur, dtype=np.uint8)


def _png_chunks(data: bytes):
    i = 8
    while i + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, i)
        yield kind, data[i + 8 : i + 8 + length]
        i += 12 + length


def _decode_png(data: bytes) -> np.ndarray:
    idat, palette = [], None
    for kind, body in _png_chunks(data):
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
        elif kind == b"PLTE":
            palette = np.frombuffer(body, np.uint8).reshape(-1, 3)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
    if interlace:
        raise UnsupportedImage("interlaced (Adam7) PNG")
    channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[color]
    row_bytes = (w * channels * depth + 7) // 8
    rows = _unfilter(zlib.decompress(b"".join(idat)), h, row_bytes, max(1, channels * depth // 8))
    if depth == 16:
        v = rows.view(">u2").reshape(h, w, channels)
        v = (v >> 8).astype(np.uint8)  # the high byte, as 16-bit PNGs read into 8-bit modes
    elif depth == 8:
        v = rows.reshape(h, w, channels)
    else:
        v = _unpack_samples(rows, depth, w)[:, :, None]
        if color == 0:
            v = (v.astype(np.uint16) * 255 // ((1 << depth) - 1)).astype(np.uint8)
    if color == 3:
        if palette is None:
            raise ValueError("ImageDecoder: palette PNG without a PLTE chunk")
        return np.ascontiguousarray(palette[v[:, :, 0]])
    if channels in (1, 2):  # gray, gray + alpha: the alpha is dropped
        return _gray_to_rgb(v[:, :, 0])
    return np.ascontiguousarray(v[:, :, :3])


# -- TIFF ---------------------------------------------------------------------------------

_TIFF_TYPES = {1: "B", 3: "H", 4: "I", 16: "Q"}


def _tiff_tags(data: bytes) -> dict[int, list[int]]:
    order = "<" if data[:2] == b"II" else ">"
    (ifd,) = struct.unpack_from(order + "I", data, 4)
    (n,) = struct.unpack_from(order + "H", data, ifd)
    tags: dict[int, list[int]] = {}
    for k in range(n):
        tag, typ, count = struct.unpack_from(order + "HHI", data, ifd + 2 + 12 * k)
        fmt = _TIFF_TYPES.get(typ)
        if fmt is None:
            continue
        size = struct.calcsize(fmt) * count
        at = ifd + 2 + 12 * k + 8
        if size > 4:
            (at,) = struct.unpack_from(order + "I", data, at)
        tags[tag] = list(struct.unpack_from(f"{order}{count}{fmt}", data, at))
    return tags


def _unpackbits(chunk: bytes) -> bytes:
    """PackBits run-length decoding (TIFF compression 32773)."""
    out, i = bytearray(), 0
    while i < len(chunk):
        n = chunk[i]
        if n < 128:
            out += chunk[i + 1 : i + 2 + n]
            i += 2 + n
        elif n > 128:
            out += chunk[i + 1 : i + 2] * (257 - n)
            i += 2
        else:
            i += 1
    return bytes(out)


def _decode_tiff(data: bytes) -> np.ndarray:
    tags = _tiff_tags(data)
    w, h = tags[256][0], tags[257][0]
    bits = tags.get(258, [1])
    compression = tags.get(259, [1])[0]
    photometric = tags.get(262, [1])[0]
    spp = tags.get(277, [1])[0]
    if set(bits) != {8} or tags.get(284, [1])[0] != 1 or compression not in (1, 32773):
        raise UnsupportedImage(
            f"TIFF with bits {bits}, compression {compression}, planar {tags.get(284)}"
        )
    strips = [data[o : o + n] for o, n in zip(tags[273], tags[279])]
    if compression == 32773:
        strips = [_unpackbits(s) for s in strips]
    # each strip holds RowsPerStrip rows (the last one fewer): padding beyond them is cut
    strip_len = min(tags.get(278, [h])[0], h) * w * spp
    raw = b"".join(s[:strip_len] for s in strips)[: w * h * spp]
    v = np.frombuffer(raw, np.uint8).reshape(h, w, spp)
    if tags.get(317, [1])[0] == 2:  # horizontal differencing predictor
        v = (np.cumsum(v.astype(np.int64), axis=1) % 256).astype(np.uint8)
    if photometric == 2:
        return np.ascontiguousarray(v[:, :, :3])
    if photometric in (0, 1):
        gray = v[:, :, 0] if photometric == 1 else 255 - v[:, :, 0]
        return _gray_to_rgb(gray)
    if photometric == 3:
        cmap = np.array(tags[320], dtype=np.uint16).reshape(3, -1).T >> 8
        return np.ascontiguousarray(cmap.astype(np.uint8)[v[:, :, 0]])
    raise UnsupportedImage(f"TIFF photometric interpretation {photometric}")


# -- dispatch -----------------------------------------------------------------------------


def decode_image(data: bytes) -> np.ndarray:
    """The RGB pixels (H, W, 3) uint8 of an encoded image, told apart by its magic bytes."""
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return _decode_png(data)
    if data[:2] == b"BM":
        return _decode_bmp(data)
    if data[:1] == b"P" and data[1:2] in b"123456" and data[2:3].isspace():
        return _decode_pnm(data)
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return _decode_tiff(data)
    if data[:2] == b"\xff\xd8":
        raise UnsupportedImage("JPEG")
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        raise UnsupportedImage("WebP")
    if data[4:8] == b"jP  " or data[:4] == b"\xff\x4f\xff\x51":
        raise UnsupportedImage("JPEG 2000")
    raise ValueError("ImageDecoder: the bytes are not an image format it knows")


@op("ImageDecoder", since=20)
def image_decoder(encoded_stream: torch.Tensor, pixel_format: str = "RGB") -> torch.Tensor:
    data = encoded_stream.detach().cpu().numpy().tobytes()
    try:
        rgb = decode_image(data)
    except UnsupportedImage as e:
        raise UnsupportedImage(
            f"ImageDecoder: the torch evaluator decodes BMP, PNM, PNG and TIFF, not {e}"
        ) from None
    out = _to_pixel_format(rgb, pixel_format)
    # a copy: the pixels may be a view of the read-only input bytes
    return torch.from_numpy(np.array(out, copy=True)).to(encoded_stream.device)
