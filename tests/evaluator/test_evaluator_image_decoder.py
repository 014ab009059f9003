"""ImageDecoder in the torch evaluator: PIL's decodings (onnx's frozen data) and images
encoded here, byte by byte, with every PNG filter and the BMP/PNM/TIFF variants."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator


def _decode(data: bytes, pixel_format: str = "RGB") -> np.ndarray:
    node = helper.make_node("ImageDecoder", ["x"], ["y"], pixel_format=pixel_format)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, [None])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [None, None, None])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    x = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return TorchOnnxEvaluator(model).run(None, {"x": x})[0].numpy()


def _image(h: int = 7, w: int = 9, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _frozen(name: str):
    from onnx.backend.test.case.node import _image_decoder_data as d

    return getattr(d, name)


@pytest.mark.parametrize("fmt", ["bmp", "png", "tiff", "pnm"])
def test_the_frozen_pil_decodings_of_onnx_are_reproduced(fmt):
    frozen = _frozen(f"image_decoder_decode_{fmt}_rgb")
    data = frozen.data.tobytes()
    rgb = _decode(data, "RGB")
    np.testing.assert_array_equal(rgb, frozen.output)
    np.testing.assert_array_equal(_decode(data, "BGR"), frozen.output[:, :, ::-1])
    gray = _decode(data, "Grayscale")
    assert gray.shape == (*rgb.shape[:2], 1)
    luma = np.round(rgb.astype(np.float64) @ [0.299, 0.587, 0.114])
    assert np.abs(gray[:, :, 0].astype(np.float64) - luma).max() <= 1


def test_lossy_formats_are_refused_in_words():
    data = _frozen("image_decoder_decode_jpeg_rgb").data.tobytes()
    with pytest.raises(Exception, match="not JPEG") as info:
        _decode(data)
    assert isinstance(info.value.__cause__, NotImplementedError)


# -- PNG written here: each filter type, colour types and bit depths ------------------------


def _png_filter(kind: int, line: np.ndarray, prev: np.ndarray, bpp: int) -> bytes:
    cur, up = line.astype(np.int64), prev.astype(np.int64)
    left = np.concatenate([np.zeros(bpp, np.int64), cur[:-bpp]])
    upleft = np.concatenate([np.zeros(bpp, np.int64), up[:-bpp]])
    if kind == 0:
        pred = np.zeros_like(cur)
    elif kind == 1:
        pred = left
    elif kind == 2:
        pred = up
    elif kind == 3:
        pred = (left + up) // 2
    else:
        p = left + up - upleft
        pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - upleft)
        pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, upleft))
    return bytes([kind]) + ((cur - pred) % 256).astype(np.uint8).tobytes()


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(rows: np.ndarray, w: int, depth: int, color: int, bpp: int, plte: bytes = b"") -> bytes:
    raw, prev = b"", np.zeros(rows.shape[1], np.uint8)
    for y, line in enumerate(rows):
        raw += _png_filter(y % 5, line, prev, bpp)
        prev = line
    ihdr = struct.pack(">IIBBBBB", w, rows.shape[0], depth, color, 0, 0, 0)
    body = _chunk(b"IHDR", ihdr) + (_chunk(b"PLTE", plte) if plte else b"")
    body += _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")
    return b"\x89PNG\r\n\x1a\n" + body


def test_png_rgb_and_rgba_with_every_filter():
    img = _image(11, 13)
    got = _decode(_png(img.reshape(11, -1), 13, 8, 2, 3))
    np.testing.assert_array_equal(got, img)
    alpha = np.full((11, 13, 1), 7, np.uint8)
    rgba = np.concatenate([img, alpha], axis=2)
    np.testing.assert_array_equal(_decode(_png(rgba.reshape(11, -1), 13, 8, 6, 4)), img)


def test_png_sixteen_bit_keeps_the_high_byte():
    img16 = np.random.default_rng(1).integers(0, 65536, (5, 6, 3), dtype=np.uint16)
    rows = img16.astype(">u2").view(np.uint8).reshape(5, -1)
    got = _decode(_png(rows, 6, 16, 2, 6))
    np.testing.assert_array_equal(got, (img16 >> 8).astype(np.uint8))


def test_png_palette_and_four_bit_gray():
    pal = _image(16, 1, seed=2).reshape(16, 3)
    idx = np.random.default_rng(3).integers(0, 16, (6, 9), dtype=np.uint8)
    packed = np.packbits(np.unpackbits(idx[:, :, None], axis=2)[:, :, 4:].reshape(6, -1), axis=1)
    np.testing.assert_array_equal(_decode(_png(packed, 9, 4, 3, 1, pal.tobytes())), pal[idx])
    gray = _decode(_png(packed, 9, 4, 0, 1))
    np.testing.assert_array_equal(gray[:, :, 0], idx * 17)  # 4-bit scaled to 0..255
    np.testing.assert_array_equal(gray[:, :, 1], gray[:, :, 2])


# -- BMP, PNM, TIFF written here ------------------------------------------------------------


def _bmp(img: np.ndarray, top_down: bool) -> bytes:
    h, w, _ = img.shape
    stride = (w * 3 + 3) // 4 * 4
    rows = np.zeros((h, stride), np.uint8)
    rows[:, : w * 3] = img[:, :, ::-1].reshape(h, -1)
    pixels = (rows if top_down else rows[::-1]).tobytes()
    info = struct.pack("<IiiHHIIiiII", 40, w, -h if top_down else h, 1, 24, 0, 0, 0, 0, 0, 0)
    return b"BM" + struct.pack("<IHHI", 54 + len(pixels), 0, 0, 54) + info + pixels


def _bmp8(idx: np.ndarray, pal: np.ndarray) -> bytes:
    h, w = idx.shape
    stride = (w + 3) // 4 * 4
    rows = np.zeros((h, stride), np.uint8)
    rows[:, :w] = idx
    table = np.concatenate([pal[:, ::-1], np.zeros((len(pal), 1), np.uint8)], axis=1).tobytes()
    info = struct.pack("<IiiHHIIiiII", 40, w, h, 1, 8, 0, 0, 0, 0, len(pal), 0)
    offset = 54 + len(table)
    pixels = rows[::-1].tobytes()
    return b"BM" + struct.pack("<IHHI", offset + len(pixels), 0, 0, offset) + info + table + pixels


@pytest.mark.parametrize("top_down", [False, True])
def test_bmp_24_bit_rows_padded_either_way_up(top_down):
    img = _image(5, 7)  # 21 bytes a row: padded to 24
    np.testing.assert_array_equal(_decode(_bmp(img, top_down)), img)


def test_bmp_8_bit_palette():
    pal = _image(20, 1, seed=4).reshape(20, 3)
    idx = np.random.default_rng(5).integers(0, 20, (4, 5), dtype=np.uint8)
    np.testing.assert_array_equal(_decode(_bmp8(idx, pal)), pal[idx])


def test_pnm_binary_ascii_gray_and_maxval():
    img = _image(4, 6)
    p6 = b"P6\n# a comment\n6 4\n255\n" + img.tobytes()
    np.testing.assert_array_equal(_decode(p6), img)
    p3 = b"P3 6 4 255\n" + " ".join(map(str, img.reshape(-1))).encode()
    np.testing.assert_array_equal(_decode(p3), img)
    g = img[:, :, 0] // 2  # maxval 127: scaled to 255
    got = _decode(b"P5 6 4 127\n" + g.tobytes())
    np.testing.assert_array_equal(
        got[:, :, 0], np.round(g.astype(np.int64) * 255 / 127).astype(np.uint8)
    )


def _packbits(data: bytes) -> bytes:
    """PackBits: runs of 3 to 128 equal bytes as repeats, the rest as literals."""
    out, i, literal = b"", 0, b""
    while i < len(data):
        j = i
        while j < len(data) and j - i < 128 and data[j] == data[i]:
            j += 1
        if j - i >= 3:
            if literal:
                out += bytes([len(literal) - 1]) + literal
                literal = b""
            out += bytes([257 - (j - i), data[i]])
            i = j
        else:
            literal += data[i : i + 1]
            i += 1
            if len(literal) == 128:
                out += bytes([127]) + literal
                literal = b""
    return out + (bytes([len(literal) - 1]) + literal if literal else b"")


@pytest.mark.parametrize("compression", [1, 32773])
def test_tiff_rgb_strips(compression):
    img = _image(6, 5)
    img[1] = 40  # a run for PackBits to repeat
    raw = img.tobytes()
    strips = [raw[:45], raw[45:]]  # three rows a strip
    if compression == 32773:
        strips = [_packbits(s) for s in strips]
    entries = [(256, 3, [5]), (257, 3, [6]), (258, 3, [8, 8, 8]), (259, 3, [compression])]
    entries += [(262, 3, [2]), (277, 3, [3]), (278, 3, [3]), (284, 3, [1])]
    entries += [(273, 4, [0, 0]), (279, 4, [len(s) for s in strips])]
    data_at = 8 + 2 + 12 * len(entries) + 4
    np.testing.assert_array_equal(_decode(_place_out_of_line(entries, data_at, strips)), img)


def _place_out_of_line(entries, data_at: int, strips) -> bytes:
    """Rewrites the IFD so every value over 4 bytes points past it, then the strips."""
    n = len(entries)
    blob, pointers = b"", {}
    for tag, typ, values in sorted(entries):
        fmt = "H" if typ == 3 else "I"
        packed = struct.pack(f"<{len(values)}{fmt}", *values)
        if len(packed) > 4:
            pointers[tag] = data_at + len(blob)
            blob += packed
    strip_at = data_at + len(blob)
    offsets = [strip_at, strip_at + len(strips[0])]
    ifd = struct.pack("<H", n)
    for tag, typ, values in sorted(entries):
        if tag == 273:
            values = offsets
        fmt = "H" if typ == 3 else "I"
        packed = struct.pack(f"<{len(values)}{fmt}", *values)
        if len(packed) > 4:
            packed = struct.pack("<I", pointers[tag])
        ifd += struct.pack("<HHI", tag, typ, len(values)) + packed.ljust(4, b"\0")
    ifd += b"\0\0\0\0"
    head = b"II*\x00" + struct.pack("<I", 8) + ifd
    assert len(head) == data_at
    if 273 in pointers:  # the offsets array itself is out of line: patch it in the blob
        at = pointers[273] - data_at
        blob = blob[:at] + struct.pack("<2I", *offsets) + blob[at + 8 :]
    return head + blob + b"".join(strips)
