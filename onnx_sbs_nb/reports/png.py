"""A small RGBA raster written as PNG with the standard library only (zlib, struct).

The static summary of a run draws its chart with it: an ``<img>`` with a ``data:`` URI is
kept whole by every HTML sanitizer that keeps images (JupyterLab's for an untrusted
notebook among them), where an inline SVG is stripped and leaves its text behind.
"""

from __future__ import annotations

import base64
import struct
import zlib

Color = tuple[int, int, int, int]

# 3x5 glyphs of what the axis labels need ("1e-8", "0"): rows top to bottom, 3 bits each
_GLYPHS: dict[str, tuple[int, ...]] = {
    "0": (0b111, 0b101, 0b101, 0b101, 0b111),
    "1": (0b010, 0b110, 0b010, 0b010, 0b111),
    "2": (0b111, 0b001, 0b111, 0b100, 0b111),
    "3": (0b111, 0b001, 0b111, 0b001, 0b111),
    "4": (0b101, 0b101, 0b111, 0b001, 0b001),
    "5": (0b111, 0b100, 0b111, 0b001, 0b111),
    "6": (0b111, 0b100, 0b111, 0b101, 0b111),
    "7": (0b111, 0b001, 0b010, 0b010, 0b010),
    "8": (0b111, 0b101, 0b111, 0b101, 0b111),
    "9": (0b111, 0b101, 0b111, 0b001, 0b111),
    "e": (0b000, 0b111, 0b111, 0b100, 0b111),
    "-": (0b000, 0b000, 0b111, 0b000, 0b000),
    "+": (0b000, 0b010, 0b111, 0b010, 0b000),
}


class Raster:
    """``width`` x ``height`` RGBA pixels, transparent to start with; drawing blends over."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.pixels = bytearray(width * height * 4)

    def get(self, x: int, y: int) -> Color:
        i = (y * self.width + x) * 4
        p = self.pixels
        return (p[i], p[i + 1], p[i + 2], p[i + 3])

    def put(self, x: int, y: int, color: Color) -> None:
        if not (0 <= x < self.width and 0 <= y < self.height):
            return
        i = (y * self.width + x) * 4
        r, g, b, a = color
        p = self.pixels
        if a >= 255 or p[i + 3] == 0:
            p[i : i + 4] = bytes(color)
            return
        # "over" compositing, so faint grid lines under a point do not wash it out
        da = p[i + 3] / 255
        sa = a / 255
        oa = sa + da * (1 - sa)
        for k, c in enumerate((r, g, b)):
            p[i + k] = round((c * sa + p[i + k] * da * (1 - sa)) / oa)
        p[i + 3] = round(oa * 255)

    def hline(self, x0: int, x1: int, y: int, color: Color, dash: int = 0) -> None:
        for x in range(max(x0, 0), min(x1, self.width)):
            if not dash or (x // dash) % 2 == 0:
                self.put(x, y, color)

    def line(self, x0: float, y0: float, x1: float, y1: float, color: Color) -> None:
        steps = max(int(max(abs(x1 - x0), abs(y1 - y0))), 1)
        for k in range(steps + 1):
            t = k / steps
            self.put(round(x0 + (x1 - x0) * t), round(y0 + (y1 - y0) * t), color)

    def dot(self, x: float, y: float, color: Color, radius: int = 1) -> None:
        cx, cy = round(x), round(y)
        for dy in range(-radius, radius + 1):
            for dx in range(-radius, radius + 1):
                if dx * dx + dy * dy <= radius * radius + 1:
                    self.put(cx + dx, cy + dy, color)

    def text(self, x: int, y: int, text: str, color: Color, scale: int = 2) -> None:
        """Draws ``text`` (digits, ``e``, ``-``, ``+``) with its top left corner at (x, y)."""
        for ch in text:
            rows = _GLYPHS.get(ch)
            if rows is not None:
                for j, bits in enumerate(rows):
                    for i in range(3):
                        if bits >> (2 - i) & 1:
                            for sy in range(scale):
                                for sx in range(scale):
                                    self.put(x + i * scale + sx, y + j * scale + sy, color)
            x += 4 * scale

    def png(self) -> bytes:
        row = self.width * 4
        raw = b"".join(
            b"\x00" + bytes(self.pixels[y * row : (y + 1) * row]) for y in range(self.height)
        )

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        head = struct.pack(">IIBBBBB", self.width, self.height, 8, 6, 0, 0, 0)
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", head)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )

    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png()).decode("ascii")


def read_png(data: bytes) -> Raster:
    """Reads back a PNG :meth:`Raster.png` wrote (RGBA, 8 bits, no filter): for tests."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    raw = zlib.decompress(idat)
    out = Raster(width, height)
    row = width * 4
    for y in range(height):
        start = y * (row + 1)
        assert raw[start] == 0, "filtered rows are not written here"
        out.pixels[y * row : (y + 1) * row] = raw[start + 1 : start + 1 + row]
    return out
