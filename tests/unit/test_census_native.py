"""The census's C loops (sources/census/_censuswindow.c) against its Python loops, on the same
window copies: every line of the tally, counts and bytes, must be the same.

The windows are built by hand: objects with vptrs (one resolvable only behind an array
cookie), ASCII and UTF-8 text (valid and cut mid-character), zeros, pointer arrays, records,
chunks cut by the window's end and chunks of other states. The stand-in resolver names a few
vptr words (the real RttiResolver needs a process's runtime; what is compared here is the
C and Python classification around it).
"""

from __future__ import annotations

import random
import struct
from array import array

import pytest

from memforensics.analysis.census import HeapRanges, Tally
from memforensics.entry import census
from memforensics.sources.glibc.heap_window import ChunkRef

BASE = 0x5555_0000_0000
HEAP_SPANS = [(BASE, BASE + (1 << 24)), (0x7F00_0000_0000, 0x7F00_0010_0000)]
VPTRS = {0x5555_5555_8D00: "shop::Order", 0x5555_5555_8E00: "shop::Item"}
COOKIE_VPTR = 0x5555_5555_8F00  # named only as an array's element type


class _Rtti:
    usable = True

    def name(self, vptr: int) -> str | None:
        return {**VPTRS, COOKIE_VPTR: "shop::Cell"}.get(vptr)


class _NoPython:
    usable = False


def _classifier() -> census.Classifier:
    classifier = census.Classifier.__new__(census.Classifier)
    classifier.rtti = _Rtti()  # type: ignore[assignment]
    classifier.python = _NoPython()  # type: ignore[assignment]
    classifier.heap = HeapRanges(HEAP_SPANS)
    classifier.tally = Tally()
    classifier._known = {}
    return classifier


def _payload(rng: random.Random, size: int) -> bytes:
    room = size - 16
    choice = rng.randrange(11)
    if choice == 0:
        data = struct.pack("<Q", rng.choice(list(VPTRS))) + rng.randbytes(8)
    elif choice == 1:
        data = struct.pack("<QQ", rng.randrange(1, 50), COOKIE_VPTR)
    elif choice == 2:
        data = bytes(rng.choice(b"abcdefghij klm\n") for _ in range(rng.randrange(0, room)))
        data += b"\0"
    elif choice == 3:
        data = ("naïve café " * 40).encode()[: room - 1] + b"\0"
    elif choice == 4:
        data = "é".encode() * (room // 2)  # cut mid-character when room is odd
        data = data[: room - 1] + b"\0" if rng.random() < 0.5 else data[:room]
    elif choice == 5:
        data = b""
    elif choice == 6:
        spans = [rng.randrange(*rng.choice(HEAP_SPANS)) & ~7 for _ in range(rng.randrange(1, 40))]
        data = b"".join(struct.pack("<Q", w if rng.random() < 0.7 else 0) for w in spans)
    elif choice == 7:
        data = struct.pack("<QQ", rng.randrange(1 << 64), rng.randrange(1 << 64))
    elif choice == 8:
        data = b"ab\0" + rng.randbytes(rng.randrange(0, 100))
    elif choice == 9:
        data = b"x" * rng.randrange(0, 70) + b"\0" + b"\1" * rng.randrange(0, 200)
    else:
        data = rng.randbytes(rng.randrange(0, room))
    return data[:room].ljust(room, b"\0")


def _window(seed: int) -> tuple[memoryview, list[int], list[int], bytearray]:
    rng = random.Random(seed)
    window = bytearray()
    addresses: list[int] = []
    sizes: list[int] = []
    states = bytearray()
    for _ in range(rng.randrange(50, 400)):
        size = rng.choice([32, 48, 64, 128, 272, 528, 1040, 2064])
        addresses.append(BASE + len(window))
        sizes.append(size)
        states.append(0 if rng.random() < 0.85 else rng.choice([1, 2, 3]))
        window += struct.pack("<QQ", 0, size | 1) + _payload(rng, size)
    cut = len(window) - rng.randrange(0, 600)  # the last chunks cut by the window's end
    return memoryview(bytes(window[:cut])), addresses, sizes, states


def _tally(
    window: memoryview, addresses: list[int], sizes: list[int], states: bytearray
) -> tuple[dict[tuple[str, str], list[int]], int, int]:
    classifier = _classifier()
    ref = ChunkRef(arena=0, heap=0, pages=None)
    # In two halves: what one window learned (a vptr's line) serves the next.
    half = len(addresses) // 2
    classifier(ref, window, BASE, addresses[:half], sizes[:half], states[:half])
    classifier(ref, window, BASE, array("Q", addresses[half:]), sizes[half:], states[half:])
    tally = classifier.tally
    return tally.lines, tally.live_chunks, tally.live_bytes


@pytest.mark.skipif(census._native is None, reason="the C loops are not built")
@pytest.mark.parametrize("seed", range(40))
def test_c_and_python_loops_tally_the_same(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    window = _window(seed)
    native = _tally(*window)
    monkeypatch.setattr(census, "_native", None)
    python = _tally(*window)
    assert native == python
    kinds = {kind for _, kind in python[0]}
    assert {"c++", "text", "zeros", "unknown"} <= kinds  # the window exercised the rules


def test_cookie_arrays_and_vptrs_are_named() -> None:
    window = _window(7)
    lines = _tally(*window)[0]
    assert ("shop::Cell[]", "c++") in lines
    assert ("shop::Order", "c++") in lines


@pytest.mark.skipif(census._native is None, reason="the C loops are not built")
@pytest.mark.parametrize("text", [b"abc", b"abcd", b"abcde", "é".encode() * 2, b"\x7fabc"])
@pytest.mark.parametrize("tail", [b"", b"\0", b"\0\0\0\0\0\0"])
def test_short_texts_at_the_window_end(
    text: bytes, tail: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text cut by the window's end: only there can a 4-character text be one."""
    data = struct.pack("<QQ", 0, 48 | 1) + text + tail
    window = (memoryview(data), [BASE], [48], bytearray(1))
    native = _tally(*window)
    monkeypatch.setattr(census, "_native", None)
    assert native == _tally(*window)
