"""Heap layouts beyond one [heap] and 64 MiB sub-heaps, read from real targets.

* mmapped chunks inside mappings the kernel merged, with the program's own memory before
  and between them (tests/targets/merged_mmaps.c): every chunk is found, as the target
  itself prints them; /proc/PID/maps shows they share mappings; in a Python process, as
  many as its own malloc_info counts;
* a main arena whose brk is blocked, so glibc mmaps its memory instead
  (tests/targets/brk_blocked.c): its segments beyond [heap] are found and walked, checked
  against the target's own malloc_info document (written before it said "ready");
* where the main arena's top ends: at the program break, or not.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import pytest

from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.malloc_info.malloc_xml import parse_dump
from memforensics.sources.proc.procmaps import read_maps
from tests.support.targets import c_target, have_cc, running

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_cc(), reason="no C compiler (cc) to build the target programs"),
]


def test_mmapped_chunks_inside_merged_mappings_are_all_found() -> None:
    """Six 300 KiB blocks (each its own mmap) with 64 KiB of the program's own anonymous
    memory first and between them, merged by the kernel into fewer mappings: all six are
    found, with their sizes, and nothing else is taken for a chunk."""
    with c_target("merged_mmaps", "6", "300") as target:
        words = [int(word, 16) for word in target.ready_line.split()[1:]]
        chunks = list(zip(words[0::2], words[1::2], strict=True))
        maps = read_maps(target.pid)
        holding = {
            (m.start_address, m.end_address)
            for start, _ in chunks
            for m in maps
            if m.start_address <= start < m.end_address
        }
        assert len(holding) < len(chunks), "the kernel did not merge the mappings"
        assert all(start != m.start_address for start, _ in chunks for m in maps), (
            "a chunk starts a mapping: the scan would find it without looking inside"
        )

        scan = scan_heap(target.pid)

        assert scan.mmap_chunks == len(chunks)
        assert scan.mmap_chunk_bytes == sum(size for _, size in chunks)
        # Every page of them was written: all resident.
        assert scan.mmap_chunk_resident_bytes == sum(size for _, size in chunks)
        assert scan.mmap_search_complete


PYTHON_BLOCKS = r"""
import ctypes, sys, time
libc = ctypes.CDLL(None)
keep = []
for i in range(6):
    keep.append(bytearray(300 * 1024))  # a malloc above the threshold: its own mmap
    keep.append([str(j) * 3 for j in range(30000)])  # obmalloc mmaps arenas in between
libc.fopen.restype = ctypes.c_void_p
xml = libc.fopen(sys.argv[1].encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(xml))
libc.fclose(ctypes.c_void_p(xml))
print("ready", flush=True)
time.sleep(600)
"""


def test_a_python_process_has_as_many_mmapped_chunks_as_its_malloc_info_counts() -> None:
    """The case the search was reported missing half of: a Python process whose big objects
    are mmapped chunks between obmalloc's arenas. It counts the chunks and bytes that its
    own malloc_info document (written just before "ready", then idle) counts."""
    with tempfile.TemporaryDirectory() as tmp:
        xml_path = Path(tmp) / "malloc_info.xml"
        with running([sys.executable, "-c", PYTHON_BLOCKS, str(xml_path)]) as target:
            scan = scan_heap(target.pid)
            dump = parse_dump(xml_path.read_bytes(), name="python")
    assert dump.mmap_chunks is not None and dump.mmap_chunks >= 6
    assert (scan.mmap_chunks, scan.mmap_chunk_bytes) == (dump.mmap_chunks, dump.mmap_bytes)


def test_main_arena_that_fell_back_to_mmap_is_found_and_walked() -> None:
    """brk blocked by a mapping right after [heap]: glibc mmaps the main arena's memory
    (1 MiB+ segments). The scan finds those segments (their bytes and [heap]'s add up to
    the arena's system_mem in the target's own malloc_info), walks every bin through them
    and measures the free bytes malloc_info counts, top included; the top does not end at
    the program break."""
    with tempfile.TemporaryDirectory() as tmp:
        xml_path = Path(tmp) / "malloc_info.xml"
        with c_target("brk_blocked", str(xml_path)) as target:
            outside = int(target.ready_line.split()[1])
            assert outside > 0, "no allocation landed outside [heap]: brk was not blocked"
            dump = parse_dump(xml_path.read_bytes(), name="brk_blocked")
            main_xml = dump.arenas[0]
            heap = next(m.start_address for m in read_maps(target.pid) if m.path == "[heap]")

            scan = scan_heap(target.pid)

    main = next(a for a in scan.arenas if a.is_main)
    assert len(main.segments) >= 2, main.segments
    assert main.segments[0].start == heap
    assert sum(s.mapped_bytes for s in main.segments) == main_xml.system_bytes
    assert main.walked and not main.unmeasured_bins and not main.budget_reached
    assert main.top_bytes == main_xml.top_bytes
    free_xml = sum(b.chunk_bytes for b in main_xml.sizes) + (main_xml.top_bytes or 0)
    assert main.free_bytes == free_xml
    assert main.top_at_brk is False
    assert any("fell back to mmap" in note for note in scan.notes)


def test_top_at_brk_for_an_ordinary_main_arena() -> None:
    """A main arena growing [heap] with brk as usual: its top ends at the program break."""
    with c_target("proc_idle") as target:
        scan = scan_heap(target.pid)
    main = next(a for a in scan.arenas if a.is_main)
    assert main.top_at_brk is True
    assert len(main.segments) == 1


def test_an_unwalked_arena_has_its_heaps_read_and_not_its_lists() -> None:
    """scan_heap's ``unwalked`` (the arenas a refused read found too long to follow, which the
    residency read after a stand-in call does not walk again): their heaps and sizes are read
    as for any arena, their lists not, and they say their budget was reached; the others are
    read as without it."""
    with c_target("many_arenas", "4", "2000") as target:
        whole = scan_heap(target.pid)
        walked = [a for a in whole.arenas if a.walked and a.address is not None]
        assert len(walked) >= 2
        skipped = walked[1].address
        assert skipped is not None
        scan = scan_heap(target.pid, unwalked={skipped})
    rows = {a.address: a for a in scan.arenas}
    row = rows[skipped]
    assert not row.walked and row.budget_reached and row.chunks == 0
    assert row.system_bytes is not None and row.system_bytes > 0 and row.segments
    assert all(a.walked for a in scan.arenas if a.address not in (skipped, None))
