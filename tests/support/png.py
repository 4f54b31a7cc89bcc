"""A tiny PNG decoder (8-bit RGB/RGBA, non-interlaced: what Chromium's screenshots are)."""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass

_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@dataclass
class Image:
    width: int
    height: int
    pixels: list[tuple[int, int, int]]  # row by row

    def colours(self) -> Counter[tuple[int, int, int]]:
        return Counter(self.pixels)


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    if pa <= pb and pa <= pc:
        return a
    return b if pb <= pc else c


def decode(data: bytes) -> Image:
    """Decode ``data``; raises ValueError for anything but 8-bit RGB(A) without interlace."""
    if not data.startswith(_SIGNATURE):
        raise ValueError("not a PNG")
    position = len(_SIGNATURE)
    idat = b""
    width = height = channels = 0
    while position < len(data):
        (length,) = struct.unpack(">I", data[position : position + 4])
        kind = data[position + 4 : position + 8]
        body = data[position + 8 : position + 8 + length]
        position += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or colour not in (2, 6) or interlace:
                raise ValueError(f"unsupported PNG: depth {depth}, colour type {colour}")
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    raw = zlib.decompress(idat)
    stride = width * channels
    previous = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    offset = 0
    for _ in range(height):
        kind = raw[offset]
        line = bytearray(raw[offset + 1 : offset + 1 + stride])
        offset += 1 + stride
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up = previous[i]
            corner = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + up) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                line[i] = (line[i] + _paeth(left, up, corner)) & 0xFF
        pixels.extend((line[i], line[i + 1], line[i + 2]) for i in range(0, stride, channels))
        previous = line
    return Image(width, height, pixels)
