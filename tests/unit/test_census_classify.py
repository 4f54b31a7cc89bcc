"""The census's pure pieces on bytes built by hand: content kinds, size classes, make_shared
names, pymalloc pool headers (good, inconsistent, hostile) and tcache structs."""

from __future__ import annotations

import random
import struct

import pytest

from memforensics.analysis.census import HeapRanges, classify_bytes, size_class
from memforensics.entry.census import cxx_name
from memforensics.sources.census.pymalloc import _pool
from memforensics.sources.glibc.heap_lists import tcache_struct

HEAP = HeapRanges([(0x10000, 0x20000), (0x7F0000000000, 0x7F0000100000)])


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (b"GET /index.html HTTP/1.1\0\0\0\0\0\0\0", "text"),
        ("naïve café résumé\0".encode(), "text"),
        (bytes(64), "zeros"),
        (struct.pack("<4Q", 0x10010, 0x10020, 0, 0x7F0000000040), "pointers"),
        (struct.pack("<4Q", 0x10010, 12345, 67890, 0xDEADBEEF), "unknown"),
        (b"ab\0" + bytes(61), "unknown"),  # a short name at the start of a record
    ],
)
def test_content_kinds(data: bytes, kind: str) -> None:
    assert classify_bytes(data, len(data) + 16, HEAP)[1] == kind


def test_size_classes() -> None:
    assert size_class(32) == "unknown <=32 B"
    assert size_class(48) == "unknown 33-64 B"
    assert size_class(1040) == "unknown 1-2 KiB"
    assert size_class(3 << 20) == "unknown 2-4 MiB"


def test_make_shared_and_shared_ptr_names() -> None:
    inplace = (
        "std::_Sp_counted_ptr_inplace<shop::Cart, std::allocator<void>, (__gnu_cxx::_Lock_policy)2>"
    )
    assert cxx_name(inplace) == "std::make_shared<shop::Cart>"
    pointer = "std::_Sp_counted_ptr<shop::Cart*, (__gnu_cxx::_Lock_policy)2>"
    assert cxx_name(pointer) == "std::shared_ptr<shop::Cart> control block"
    assert cxx_name("shop::Box<std::map<int, int> >") == "shop::Box<std::map<int, int> >"


def _pool_bytes(szidx: int, used: int, freed: list[int], count: int | None = None) -> bytearray:
    """A 16 KiB pool at address 0x100000 whose first ``used`` blocks were handed out and
    ``freed`` (block numbers) given back, as pymalloc lays it out."""
    size = (szidx + 1) * 16
    pool = bytearray(16 << 10)
    base = 0x100000
    chain = 0
    for block in freed:  # pushed in order: the last freed is the head
        offset = 48 + block * size
        pool[offset : offset + 8] = struct.pack("<Q", chain)
        chain = base + offset
    nextoffset = 48 + used * size
    live = used - len(freed) if count is None else count
    struct.pack_into(
        "<IIQQQIIII", pool, 0, live, 0, chain, 0, 0, 0, szidx, nextoffset, (16 << 10) - size
    )
    return pool


def test_pool_blocks_in_use() -> None:
    pool = _pool_bytes(3, 10, [2, 5])
    found = _pool(memoryview(pool), 0x100000, 0x100000)
    assert found is not None
    pool_size, size, used = found
    assert (pool_size, size) == (16 << 10, 64)
    assert used == [48 + b * 64 for b in range(10) if b not in (2, 5)]


def test_pool_whose_count_disagrees_is_unread() -> None:
    found = _pool(memoryview(_pool_bytes(3, 10, [2], count=4)), 0x100000, 0x100000)
    assert found is not None and found[2] == [-1]


def test_pool_with_a_free_chain_loop_is_unread_and_ends() -> None:
    pool = _pool_bytes(1, 4, [1])
    struct.pack_into("<Q", pool, 48 + 32, 0x100000 + 48 + 32)  # points at itself
    found = _pool(memoryview(pool), 0x100000, 0x100000)
    assert found is not None and found[2] == [-1]


def test_random_bytes_are_never_a_pool_or_a_tcache() -> None:
    rng = random.Random(33)
    for _ in range(300):
        junk = bytes(rng.getrandbits(8) for _ in range(1024)) + bytes(16 << 10)
        assert _pool(memoryview(junk), 0x100000, 0x100000) is None
        assert tcache_struct(junk, 0x290) is None


def test_tcache_struct_counts_match_entries() -> None:
    body = bytearray(0x290)
    struct.pack_into("<H", body, 16 + 2 * 3, 2)  # counts[3] = 2
    struct.pack_into("<Q", body, 16 + 128 + 8 * 3, 0x55550000A0B0)  # entries[3]
    assert tcache_struct(bytes(body), 0x290) == [0x55550000A0B0]
    struct.pack_into("<H", body, 16 + 2 * 4, 1)  # a count without its entry
    assert tcache_struct(bytes(body), 0x290) is None
