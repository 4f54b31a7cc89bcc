"""malloc_info's document written from figures (malloc_info_image) and mp_ found by its shape
(malloc_par), on hand-built inputs whose right answer is written out here from glibc's
__malloc_info format (docs: ../shared reference, malloc/malloc.c)."""

from __future__ import annotations

import struct
from dataclasses import replace

import pytest

from memforensics.errors import (
    DeadlineError,
    ReadOnlyRefusedError,
    ReadTimeRanOutError,
    TargetError,
)
from memforensics.model.heapscan import ArenaScan, BinFigures, HeapScan, MallocParams
from memforensics.model.process import HeapSegment
from memforensics.sources.glibc.malloc_info_image import Dialect, malloc_info_xml
from memforensics.sources.glibc.malloc_par import LAYOUTS, find_malloc_par, parse_malloc_par
from memforensics.sources.malloc_info.malloc_xml import parse_dump
from memforensics.sources.proc.procmaps import Mapping
from memforensics.sources.proc.procmem import PageMap
from tests.support.heap_scans import heap_scan

PAGE = 4096
MAIN = BinFigures(
    fastbin_chunks=(0, 3, 0, 0, 0, 0, 0, 0, 0, 0),  # three 48-byte chunks
    bins=((1, 2, 1377, 2049, 3426), (4, 4, 65, 65, 260), (70, 1, 1105, 1105, 1105)),
    top_bytes=131_000,
    system_bytes=200_704,
    max_system_bytes=204_800,
    aspace_bytes=200_704,
    aspace_mprotect_bytes=200_704,
    subheaps=0,
)
THREAD = BinFigures(
    fastbin_chunks=(0,) * 10,
    bins=((2, 1, 37, 37, 37),),
    top_bytes=4_000,
    system_bytes=135_168,
    max_system_bytes=135_168,
    aspace_bytes=135_168,
    aspace_mprotect_bytes=139_264,
    subheaps=1,
)
PARAMS = MallocParams(
    address=0x7F00_0000_1000,
    layout="2.35",
    mmap_chunks=2,
    mmapped_bytes=2 * 266_240,
    max_mmap_chunks=3,
    max_mmapped_bytes=3 * 266_240,
    mmap_threshold_bytes=131_072,
    trim_threshold_bytes=131_072,
    sbrk_base=0x5555_0000_0000,
)

EXPECTED_2_36 = """\
<malloc version="1">
<heap nr="0">
<sizes>
  <size from="33" to="48" total="144" count="3"/>
  <size from="65" to="65" total="260" count="4"/>
  <size from="1105" to="1105" total="1105" count="1"/>
  <unsorted from="1377" to="2049" total="3426" count="2"/>
</sizes>
<total type="fast" count="3" size="144"/>
<total type="rest" count="8" size="135791"/>
<system type="current" size="200704"/>
<system type="max" size="204800"/>
<aspace type="total" size="200704"/>
<aspace type="mprotect" size="200704"/>
</heap>
<heap nr="1">
<sizes>
  <size from="37" to="37" total="37" count="1"/>
</sizes>
<total type="fast" count="0" size="0"/>
<total type="rest" count="2" size="4037"/>
<system type="current" size="135168"/>
<system type="max" size="135168"/>
<aspace type="total" size="135168"/>
<aspace type="mprotect" size="139264"/>
<aspace type="subheaps" size="1"/>
</heap>
<total type="fast" count="3" size="144"/>
<total type="rest" count="10" size="139828"/>
<total type="mmap" count="2" size="532480"/>
<system type="current" size="335872"/>
<system type="max" size="339968"/>
<aspace type="total" size="335872"/>
<aspace type="mprotect" size="339968"/>
</malloc>
"""


def _scan(*arenas: BinFigures | None, chained: bool = True, params: bool = True) -> HeapScan:
    rows = tuple(
        ArenaScan(
            address=0x1000 * (index + 1),
            is_main=index == 0,
            system_bytes=None if figures is None else figures.system_bytes,
            layout_ok=True,
            segments=(HeapSegment(0, 0, 0),),
            walked=True,
            figures=figures,
            lock_retries=0 if figures is not None else 20,
        )
        for index, figures in enumerate(arenas)
    )
    return heap_scan(
        rows,
        pid=4242,
        page_bytes=PAGE,
        chained=chained,
        malloc_params=PARAMS if params else None,
    )


def test_the_document_is_glibcs_byte_for_byte() -> None:
    assert malloc_info_xml(_scan(MAIN, THREAD), "2.36").decode() == EXPECTED_2_36


def test_the_document_parses_to_the_figures_it_was_written_from() -> None:
    dump = parse_dump(malloc_info_xml(_scan(MAIN, THREAD), "2.36"))
    assert len(dump.arenas) == 2
    assert dump.fast_bytes == 144 and dump.fast_chunks == 3
    assert dump.system_bytes == MAIN.system_bytes + THREAD.system_bytes
    assert dump.mmap_bytes == PARAMS.mmapped_bytes and dump.mmap_chunks == PARAMS.mmap_chunks


def test_before_2_31_rest_leaves_the_top_out_and_lines_carry_the_stray_indentation() -> None:
    text = malloc_info_xml(_scan(MAIN, THREAD), "2.28").decode()
    assert '<total type="rest" count="7" size="4791"/>' in text  # bins only, no top
    assert "\t" * 7 + " " * 6 + '  <size from="33" to="48"' in text
    assert '\n  <unsorted from="1377"' in text  # the unsorted line kept two spaces
    assert Dialect.of_release(None) == Dialect.of_release("2.41")


@pytest.mark.parametrize(
    ("scan", "says", "exit_code"),
    [
        # Locked at every stop: no moment came to read it, a timeout (exit 6).
        (
            _scan(MAIN, None),
            "arena 1 could not be read consistently (locked at every stop: arena 1)",
            6,
        ),
        (_scan(MAIN, THREAD, chained=False), "malloc_info's order", 3),
        (_scan(MAIN, THREAD, params=False), "mp_", 3),
    ],
    ids=["an arena unread", "not chained", "no mp_"],
)
def test_no_document_with_a_part_guessed(scan: HeapScan, says: str, exit_code: int) -> None:
    with pytest.raises(TargetError) as info:
        malloc_info_xml(scan, "2.36")
    assert says in info.value.message
    assert info.value.exit_code == exit_code
    assert info.value.hint and "gdb path" in info.value.hint


def _malloc_par(layout_name: str, *, sbrk_base: int, mmaps: int = 2) -> bytes:
    """struct malloc_par as glibc lays it out, up to its tcache fields (their defaults)."""
    layout = next(layout for layout in LAYOUTS if layout.name == layout_name)
    data = bytearray(136)
    struct.pack_into("<5Q", data, 0, 131_072, 0, 131_072, 8, 0)
    if layout.huge_pages is not None:
        struct.pack_into("<2Qi", data, layout.huge_pages, 0, 0, 0)
    struct.pack_into("<4i", data, layout.ints, mmaps, 65_536, mmaps + 1, 0)
    mapped = mmaps * 266_240
    struct.pack_into("<3Q", data, layout.mmapped, mapped, mapped + 266_240, sbrk_base)
    struct.pack_into("<4Q", data, layout.mmapped + 24, 64, 1032, 7, 0)
    return bytes(data)


class FakeMemory:
    """A libc data region as bytes (the MemoryReader the finder reads)."""

    page_bytes = PAGE

    def __init__(self, start: int, data: bytes) -> None:
        self.start = start
        self.data = data

    def read_present(self, address: int, length: int, present: bytes | None = None) -> bytes:
        offset = address - self.start
        return self.data[offset : offset + length]

    def read(self, address: int, length: int) -> bytes | None:
        return self.read_present(address, length)

    def read_into(self, view: memoryview, address: int) -> bool:
        view[:] = self.read_present(address, len(view))
        return True

    def readable(self, address: int) -> bool:
        return True

    def pagemap(self, start: int, end: int) -> PageMap:
        raise NotImplementedError


@pytest.mark.parametrize("layout_name", ["2.26", "2.35"])
def test_mp_is_found_by_its_shape_in_either_layout(layout_name: str) -> None:
    base = 0x5555_5555_0000
    start = 0x7F00_0000_0000
    region = bytearray(0x2000)
    # A decoy that names sbrk_base but breaks an invariant (mmapped bytes not whole pages).
    decoy = bytearray(_malloc_par(layout_name, sbrk_base=base))
    layout = next(layout for layout in LAYOUTS if layout.name == layout_name)
    struct.pack_into("<Q", decoy, layout.mmapped, 12_345)
    region[0x100 : 0x100 + len(decoy)] = decoy
    region[0x800 : 0x800 + len(decoy)] = _malloc_par(layout_name, sbrk_base=base)
    mapping = Mapping(start, start + len(region), "rw-p", 0, 1, "/lib/libc.so.6")
    found = find_malloc_par(FakeMemory(start, bytes(region)), [mapping], sbrk_bases=[base])
    assert found is not None
    assert (found.address, found.layout, found.mmap_chunks) == (start + 0x800, layout_name, 2)
    assert found.mmapped_bytes == 2 * 266_240 and found.sbrk_base == base
    # The same bytes read with the other layout are not a malloc_par.
    other = next(layout for layout in LAYOUTS if layout.name != layout_name)
    assert parse_malloc_par(0, _malloc_par(layout_name, sbrk_base=base), other, PAGE) is None


@pytest.mark.parametrize("layout_name", [layout.name for layout in LAYOUTS])
def test_a_threshold_set_by_tunable_beyond_mallopts_bound_is_read(layout_name: str) -> None:
    """glibc.malloc.mmap_threshold=64 MiB is taken as it is (and sets no_dyn_threshold);
    the dynamic threshold never goes past 32 MiB, so such a value with it unset is no mp_."""
    layout = next(layout for layout in LAYOUTS if layout.name == layout_name)
    data = bytearray(_malloc_par(layout_name, sbrk_base=0x5555_5555_0000))
    struct.pack_into("<Q", data, 16, 64 << 20)
    assert parse_malloc_par(0, bytes(data), layout, PAGE) is None  # dynamic: not glibc's
    struct.pack_into("<i", data, layout.ints + 12, 1)  # no_dyn_threshold
    found = parse_malloc_par(0, bytes(data), layout, PAGE)
    assert found is not None and found.mmap_threshold_bytes == 64 << 20


def test_a_word_of_main_arena_in_a_small_heap_is_no_malloc_par() -> None:
    """A small [heap] (sleep, cat): main_arena's bins hold many words less than 64 KiB past
    its start, and main_arena lies right after mp_ in libc's data. Read with the 2.26 layout,
    one of them passed every test but the tcache's (taken from /bin/sleep's libc, glibc 2.36:
    trim_threshold 0, mmap_threshold 1, arena_test 1, no mmapped chunk, zeros after it), so
    two places qualified and mp_ was "not found": the default called into the target."""
    base = 0x5555_5555_0000
    start = 0x7F00_0000_0000
    region = bytearray(0x2000)
    region[0x340 : 0x340 + 136] = _malloc_par("2.35", sbrk_base=base, mmaps=0)
    decoy = bytearray(136)
    layout = next(layout for layout in LAYOUTS if layout.name == "2.26")
    struct.pack_into("<5Q", decoy, 0, 0, 0, 1, 1, 0)
    struct.pack_into("<Q", decoy, layout.mmapped + 16, base + 0x3AB0)  # a chunk in a bin
    region[0x1C70 - 0x40 : 0x1C70 - 0x40 + 136] = decoy
    mapping = Mapping(start, start + len(region), "rw-p", 0, 1, "/lib/libc.so.6")
    found = find_malloc_par(FakeMemory(start, bytes(region)), [mapping], sbrk_bases=[base])
    assert found is not None and (found.address, found.layout) == (start + 0x340, "2.35")


@pytest.mark.parametrize(
    ("bins", "max_bytes", "count", "is_mp"),
    [
        (64, 1032, 7, True),  # the defaults
        (1, 0, 7, True),  # GLIBC_TUNABLES=glibc.malloc.tcache_max=0
        (64, 1032, 0, True),  # glibc.malloc.tcache_count=0
        (2, 25, 7, True),  # tcache_max=25: a 48-byte chunk's bin too
        (0, 0, 0, False),
        (65, 1048, 7, False),
        (63, 1032, 7, False),  # bins and bytes disagree
        (64, 1032, 65_536, False),
    ],
)
def test_the_tcache_fields_are_within_what_glibc_accepts(
    bins: int, max_bytes: int, count: int, is_mp: bool
) -> None:
    layout = next(layout for layout in LAYOUTS if layout.name == "2.35")
    data = bytearray(_malloc_par("2.35", sbrk_base=0x5555_5555_0000))
    struct.pack_into("<3Q", data, layout.mmapped + 24, bins, max_bytes, count)
    assert (parse_malloc_par(0, bytes(data), layout, PAGE) is not None) == is_mp


def test_two_places_that_qualify_are_no_answer() -> None:
    base = 0x5555_5555_0000
    start = 0x7F00_0000_0000
    region = bytearray(0x1000)
    region[0x100 : 0x100 + 136] = _malloc_par("2.35", sbrk_base=base)
    region[0x400 : 0x400 + 136] = _malloc_par("2.35", sbrk_base=base)
    mapping = Mapping(start, start + len(region), "rw-p", 0, 1, "/lib/libc.so.6")
    assert find_malloc_par(FakeMemory(start, bytes(region)), [mapping], sbrk_bases=[base]) is None


def test_arenas_too_long_to_follow_are_told_apart_from_a_read_out_of_time() -> None:
    """Only the arenas whose lists were too long for a stop are listed for the read after a
    stand-in call to leave unwalked; one the read's time ran out on is walked again there."""
    scan = _scan(MAIN, None, None, None)
    long, late = scan.arenas[1], scan.arenas[2]
    rows = (
        scan.arenas[0],
        replace(long, lock_retries=0, budget_reached=True, lists_too_long=True),
        replace(late, lock_retries=0, budget_reached=True),
        scan.arenas[3],  # locked at every stop
    )
    with pytest.raises(ReadOnlyRefusedError) as info:
        malloc_info_xml(replace(scan, arenas=rows), "2.36")
    message = info.value.message
    assert "arenas 1-3 could not be read consistently" in message
    assert "(locked at every stop: arena 3)" in message
    assert "(lists too long to follow within a stop: arena 1)" in message
    assert "(the read's time ran out: arena 2)" in message
    assert info.value.too_long == (long.address,)


def test_a_refusal_names_why_in_the_words_it_is_given() -> None:
    """A core's read has no stops: the refusal says why in its words (entry.readers.core),
    the scan's own reasons unchanged; and it carries the scan, whose unread arenas the
    stand-in call proves before calling."""
    from memforensics.sources.glibc.malloc_info_image import RefusalWords

    scan = _scan(MAIN, None, None, None)
    rows = (
        scan.arenas[0],
        replace(scan.arenas[1], lock_retries=0, budget_reached=True, lists_too_long=True),
        scan.arenas[2],
        scan.arenas[3],  # locked
    )
    words = RefusalWords(locked="LOCKED", too_long="TOO LONG", gave_up="GAVE UP")
    with pytest.raises(ReadOnlyRefusedError) as info:
        malloc_info_xml(replace(scan, arenas=rows), "2.36", words)
    message = info.value.message
    assert "(LOCKED: arenas 2, 3)" in message and "(TOO LONG: arena 1)" in message, message
    assert "stop" not in message, message
    assert info.value.partial is not None and info.value.partial.arenas == rows


def test_a_read_out_of_time_names_its_arenas_in_ranges_and_is_no_refusal() -> None:
    """1,500 arenas, the read's time out from the 1,063rd on (one locked at every stop): one
    line, not 437 numbers; and a deadline (exit 6), not a refusal of the read, which the
    default would answer with a call in its place."""
    scan = _scan(MAIN, *([THREAD] * 1061), *([None] * 438))
    rows = tuple(
        replace(arena, lock_retries=0, budget_reached=True) if arena.figures is None else arena
        for arena in scan.arenas
    )
    rows = (*rows[:1063], replace(rows[1063], lock_retries=20, budget_reached=False), *rows[1064:])
    with pytest.raises(ReadTimeRanOutError) as info:
        malloc_info_xml(replace(scan, arenas=rows, walk_budget_seconds=10.52), "2.36")
    assert info.value.message == (
        "the read's time (10.5 s) ran out before arenas 1062, 1064-1499 were read;"
        " locked at every stop: arena 1063"
    )
    assert isinstance(info.value, DeadlineError)
    assert not isinstance(info.value, ReadOnlyRefusedError)


def test_a_read_out_of_time_with_another_arena_unreadable_is_refused() -> None:
    """One arena late, another whose lists could not be read (neither late nor locked): the
    read is refused as before, naming both, since more time would not read the second."""
    scan = _scan(MAIN, THREAD, None, None)
    rows = (
        *scan.arenas[:2],
        replace(scan.arenas[2], lock_retries=0, budget_reached=True),
        replace(scan.arenas[3], lock_retries=0),
    )
    with pytest.raises(ReadOnlyRefusedError) as info:
        malloc_info_xml(replace(scan, arenas=rows), "2.36")
    assert info.value.message == (
        "arenas 2, 3 could not be read consistently (the read's time ran out: arena 2)"
    )
