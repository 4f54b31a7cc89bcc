"""The residency walk's copy of a live heap and its walk over several heaps, C and Python.

* The copy (memforensics.sources.glibc.heapcopy.copy_into): pread of /proc/PID/mem in C and
  in pure Python: the same bytes both ways, pages not present read as zeros
  (tests/targets/copy_pages.c).
* The walk of arenas above the old 64 MiB whole-copy cap: a worker arena chained over two
  heaps and a main heap above 64 MiB, walked from whole copies in C and in Python and chunk
  by chunk (lazily), with the same figures (tests/targets/proc_arenas.c).
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from memforensics.entry.readers.gdb import read_heap_residency
from memforensics.sources.glibc import glibc_walk, heapcopy
from memforensics.sources.glibc.heapcopy import BufferPool, Segment, copy_into
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.proc.procmem import ProcessMemoryReader
from tests.integration.test_residency_live import limited_arenas_target
from tests.support.residency_figures import walk_figures
from tests.support.targets import c_target, have_cc

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_cc(), reason="no C compiler (cc) to build the target programs"),
]

PAGES = 64
MIB = 1 << 20


def _expected(page: int, pages: int = PAGES) -> bytes:
    """What copy_pages.c holds: page i filled with (i * 7 + 1) & 0xff, 8 untouched pages."""
    untouched = range(pages // 2, pages // 2 + 8)
    return b"".join(
        bytes(page) if i in untouched else bytes([(i * 7 + 1) & 0xFF]) * page for i in range(pages)
    )


def _copy(
    mem: ProcessMemoryReader,
    address: int,
    pool: BufferPool,
    pages: int = PAGES,
    threads: int = 1,
) -> tuple[bytes, bool]:
    """The target's mapping copied by copy_into into a pooled buffer full of stale bytes."""
    page = mem.page_bytes
    segment = Segment(
        address, address + pages * page, mem.pagemap(address, address + pages * page), pool
    )
    try:
        segment.view[:] = b"\xee" * len(segment.view)  # another arena's bytes
        complete = copy_into(mem, segment, 0, segment.length, threads=threads)
        return bytes(segment.view), complete
    finally:
        segment.close(pool)


@pytest.mark.parametrize(("pages", "threads"), [(PAGES, 1), (1024, 2)])
def test_every_copy_way_gives_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch, pages: int, threads: int
) -> None:
    """The C copy and the pure Python one: the same bytes, the PROT_NONE pages read (as
    /proc/PID/mem reads them), holes as zeros, nothing stale. With 1,024 pages and two
    threads the C copy splits at page 512, between the PROT_NONE pages (256) and the
    untouched ones (512 …): each half meets its own kind of page."""
    with c_target("copy_pages", str(pages)) as target:
        address = int(target.ready_line.split()[1], 16)
        with ProcessMemoryReader(target.pid) as mem:
            page = mem.page_bytes
            expected = _expected(page, pages)
            pool = BufferPool()
            try:
                copies = {}
                with monkeypatch.context() as patch:
                    patch.setattr(heapcopy, "_native", None)
                    copies["python"] = _copy(mem, address, pool, pages, threads)
                if heapcopy.native_walk_available():
                    copies["c"] = _copy(mem, address, pool, pages, threads)
            finally:
                pool.close()
    assert set(copies) == ({"python", "c"} if heapcopy.native_walk_available() else {"python"})
    for way, (data, complete) in copies.items():
        assert complete, way
        assert data == expected, way


def test_a_page_gone_reads_as_zeros_and_says_incomplete(monkeypatch: pytest.MonkeyPatch) -> None:
    """A page the pagemap called readable that is unmapped by the time of the copy: zeros,
    and the copy says it fell short (C and Python)."""
    ways = [heapcopy._native, None] if heapcopy._native is not None else [None]
    with c_target("copy_pages", str(PAGES)) as target:
        address = int(target.ready_line.split()[1], 16)
        with ProcessMemoryReader(target.pid) as mem:
            page = mem.page_bytes
            end = address + (PAGES + 4) * page  # four unmapped pages past the mapping's end
            pages = mem.pagemap(address, end)
            readable = bytearray(pages.readable)
            readable[PAGES:] = b"\x01" * 4  # as if they had been resident when looked up
            pages.readable = bytes(readable)
            pool = BufferPool()
            segment = Segment(address, end, pages, pool)
            try:
                for module in ways:
                    monkeypatch.setattr(heapcopy, "_native", module)
                    segment.view[:] = b"\xee" * len(segment.view)
                    assert not copy_into(mem, segment, 0, segment.length)
                    assert bytes(segment.view[: PAGES * page]) == _expected(page)
                    assert bytes(segment.view[PAGES * page :]) == bytes(4 * page)
            finally:
                segment.close(pool)
                pool.close()


@pytest.mark.parametrize(("pages", "threads"), [(PAGES, 1), (1024, 2)])
def test_a_recheck_reads_only_the_flagged_pages_still_in_ram(
    monkeypatch: pytest.MonkeyPatch, pages: int, threads: int
) -> None:
    """Flags from an earlier pagemap (every page "readable") and ``recheck``: the pages the
    pagemap says are not in RAM now (the 8 never touched) are not read and their flags are
    cleared; the kernel's pagemap after the copy still has them absent (a read would have
    mapped them), and every other page is copied (C and Python). With 1,024 pages and two
    threads, the second thread's first pages are the untouched ones."""
    ways = [heapcopy._native, None] if heapcopy._native is not None else [None]
    with c_target("copy_pages", str(pages)) as target:
        address = int(target.ready_line.split()[1], 16)
        with ProcessMemoryReader(target.pid) as mem:
            page = mem.page_bytes
            untouched = range(pages // 2, pages // 2 + 8)
            pool = BufferPool()
            end = address + pages * page
            segment = Segment(address, end, mem.pagemap(address, end), pool)
            try:
                for module in ways:
                    monkeypatch.setattr(heapcopy, "_native", module)
                    segment.view[:] = b"\xee" * len(segment.view)
                    flags = bytearray(b"\x01" * pages)
                    copy_into(
                        mem, segment, 0, segment.length, threads=threads, only=flags, recheck=True
                    )
                    assert [i for i in range(pages) if not flags[i]] == list(untouched), module
                    absent = mem.pagemap(address, end).present
                    assert all(absent[i] == 0 for i in untouched), module
                    expected = _expected(page, pages)
                    for i in range(pages):
                        got = bytes(segment.view[i * page : (i + 1) * page])
                        want = (
                            b"\xee" * page
                            if i in untouched
                            else expected[i * page : (i + 1) * page]
                        )
                        assert got == want, (module, i)
            finally:
                segment.close(pool)
                pool.close()


def test_a_recheck_of_a_few_scattered_pages_reads_those_in_ram_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Flags on a page in 37 (as a scouted copy's, a few pages of each heap), two of them on
    untouched pages: each flagged page is looked up in the pagemap (the C copy reads it up to
    the last flagged page of its window, not the window's every entry); the untouched ones
    are not read (still absent after) and lose their flags, the others are copied, and no
    unflagged page is written (C and Python)."""
    pages = 1024
    ways = [heapcopy._native, None] if heapcopy._native is not None else [None]
    with c_target("copy_pages", str(pages)) as target:
        address = int(target.ready_line.split()[1], 16)
        with ProcessMemoryReader(target.pid) as mem:
            page = mem.page_bytes
            untouched = set(range(pages // 2, pages // 2 + 8))
            pool = BufferPool()
            end = address + pages * page
            segment = Segment(address, end, mem.pagemap(address, end), pool)
            wanted = {*range(3, pages, 37), pages // 2 + 1, pages // 2 + 6}
            try:
                for module in ways:
                    monkeypatch.setattr(heapcopy, "_native", module)
                    segment.view[:] = b"\xee" * len(segment.view)
                    flags = bytearray(pages)
                    for index in wanted:
                        flags[index] = 1
                    copy_into(mem, segment, 0, segment.length, threads=2, only=flags, recheck=True)
                    kept = {i for i in range(pages) if flags[i]}
                    assert kept == wanted - untouched, module
                    absent = mem.pagemap(address, end).present
                    assert all(absent[i] == 0 for i in untouched), module
                    expected = _expected(page, pages)
                    for i in range(pages):
                        got = bytes(segment.view[i * page : (i + 1) * page])
                        copied = i in kept
                        want = expected[i * page : (i + 1) * page] if copied else b"\xee" * page
                        assert got == want, (module, i)
            finally:
                segment.close(pool)
                pool.close()


@pytest.mark.parametrize("held", [False, True])
def test_a_copy_of_several_heaps_at_once_is_each_heaps_copy(held: bool) -> None:
    """copy_again over three heaps of unequal size (one mapping cut in three): the bytes and
    flags each heap's own copy_into gives, untouched pages rechecked out, with the pages of
    all three split between two threads as one copy (the split falls inside the second
    heap: 712 flagged pages in all, the 356th among the second heap's). ``held``: the pages
    the target alone maps read pinned (here the test's own target, not held: the same
    bytes)."""
    pages = 1024
    cuts = [0, 300, 700, pages]
    with c_target("copy_pages", str(pages)) as target:
        address = int(target.ready_line.split()[1], 16)
        with ProcessMemoryReader(target.pid) as mem:
            page = mem.page_bytes
            untouched = set(range(pages // 2, pages // 2 + 8))
            wanted = set(range(0, pages, 2)) | set(range(300, 700))
            results = {}
            for way in ("each", "together"):
                pool = BufferPool()
                segments = [
                    Segment(
                        address + low * page,
                        address + high * page,
                        mem.pagemap(address + low * page, address + high * page),
                        pool,
                    )
                    for low, high in itertools.pairwise(cuts)
                ]
                try:
                    items = []
                    for (low, high), segment in zip(
                        itertools.pairwise(cuts), segments, strict=True
                    ):
                        segment.view[:] = b"\xee" * len(segment.view)
                        items.append(
                            (segment, bytearray(int(i in wanted) for i in range(low, high)))
                        )
                    if way == "each":
                        complete = all(
                            copy_into(
                                mem,
                                segment,
                                0,
                                segment.length,
                                threads=2,
                                only=flags,
                                recheck=True,
                                held=held,
                            )
                            for segment, flags in items
                        )
                    else:
                        complete = heapcopy.copy_again(mem, items, recheck=True, held=held)
                    results[way] = (
                        complete,
                        b"".join(bytes(segment.view) for segment in segments),
                        b"".join(bytes(flags) for _, flags in items),
                    )
                finally:
                    for segment in segments:
                        segment.close(pool)
                    pool.close()
    assert len(wanted) >= 700
    assert results["together"] == results["each"]
    complete, data, flags = results["together"]
    assert complete
    assert {i for i in range(pages) if flags[i]} == wanted - untouched
    expected = _expected(page, pages)
    for i in range(pages):
        want = expected[i * page : (i + 1) * page] if i in wanted - untouched else b"\xee" * page
        assert data[i * page : (i + 1) * page] == want, i


@pytest.mark.slow
def test_chained_heaps_and_a_main_heap_above_64_mib_walk_the_same_every_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One worker arena over two 64 MiB heaps and a ~73 MiB main heap: whole copies walked
    in C (when built) and in Python, and the lazy chunk-by-chunk walk, give the same
    figures, before and after a trim (partly resident pages)."""
    seen: list[int] = []
    walk_copies = glibc_walk.walk_copies

    def spied(
        segments: Sequence[Segment], *args: int, copies: heapcopy.CopiesForC | None = None
    ) -> tuple[int, ...] | None:
        seen.append(len(segments))
        return walk_copies(segments, *args, copies=copies)

    monkeypatch.setattr(glibc_walk, "walk_copies", spied)
    with limited_arenas_target("1", "70000", "1024", "runs") as arenas:
        for trimmed in (False, True):
            if trimmed:
                assert arenas.trim() == 1
            dump = arenas.dump()
            seen.clear()
            whole = read_heap_residency(arenas.pid, dump)
            assert max(seen) >= 2, "no arena of several heaps walked from whole copies"
            ways = {"whole": whole}
            with monkeypatch.context() as patch:
                patch.setattr(heapcopy, "_native", None)
                ways["python"] = read_heap_residency(arenas.pid, dump)
            with monkeypatch.context() as patch:
                patch.setattr(heapcopy, "COPY_MAX_BYTES", 0)  # every arena chunk by chunk
                seen.clear()
                ways["lazy"] = read_heap_residency(arenas.pid, dump)
                assert not seen
            for way, residency in ways.items():
                assert walk_figures(residency) == walk_figures(whole), way
            main, worker = whole.arena(0), whole.arena(1)
            assert main is not None and worker is not None
            assert sum(s.mapped_bytes for s in main.segments) > 64 * MIB
            assert len(worker.segments) >= 2
            assert all(row.free_method == "walked" for row in whole.arenas)
            assert whole.measured_share > 0.99
            # The worker's free pages were all written: resident until the trim released them.
            resident = [row.free_resident_bytes for row in whole.arenas[1:]]
            measured = [row.measured_free_bytes for row in whole.arenas[1:]]
            assert (resident == measured) is not trimmed


def test_the_c_copy_lets_other_threads_run() -> None:
    """The C copy releases the GIL (inspect copies in a worker thread while its main thread
    drives gdb): Python code in another thread runs in the middle of a copy. With the GIL
    held it could tick only just before the call or just after it returned."""
    native = heapcopy._native
    if native is None:
        pytest.skip("the C copy is not in use (not built here, or MEMFORENSICS_PURE_PYTHON is set)")
    pages = 8192  # 32 MiB: milliseconds per copy
    with c_target("copy_pages", str(pages)) as target:
        address = int(target.ready_line.split()[1], 16)
        with ProcessMemoryReader(target.pid) as mem:
            length = pages * mem.page_bytes
            readable = mem.pagemap(address, address + length).readable
            buffer = bytearray(length)
            calls: list[tuple[float, float]] = []

            def copier() -> None:
                for _ in range(20):
                    before = time.monotonic()
                    native.copy(mem.mem_fd, buffer, address, readable, mem.page_bytes, False)
                    calls.append((before, time.monotonic()))

            thread = threading.Thread(target=copier)
            # Short GIL turns: with the GIL held by the C code, the main thread could only tick
            # within a switch interval of the call's start or end, far from its middle half.
            interval = sys.getswitchinterval()
            sys.setswitchinterval(1e-4)
            ticks: list[float] = []
            try:
                thread.start()
                while thread.is_alive():
                    ticks.append(time.monotonic())
                thread.join()
            finally:
                sys.setswitchinterval(interval)
    during = [
        sum(before + (after - before) / 4 < tick < after - (after - before) / 4 for tick in ticks)
        for before, after in calls
    ]
    assert max(during) > 0, (during, [after - before for before, after in calls])


def test_a_scan_may_be_held_between_slices_of_an_arena_copy() -> None:
    """``pause`` comes between every ~1 ms slice of a whole arena's copy, not only between
    arenas: a gdb session closing the gate waits for one slice (gdb_background.QuietGate). Four
    worker arenas of ~15 MiB each: four slices each, three pauses inside each copy."""
    calls: list[float] = []
    with c_target("many_arenas", "4", "30000") as target:
        scan = scan_heap(target.pid, pause=lambda: calls.append(time.monotonic()))
        again = scan_heap(target.pid)
    slice_bytes = glibc_walk._COPY_SLICE_BYTES
    inside = sum(
        -(-segment.mapped_bytes // slice_bytes) - 1
        for row in scan.arenas
        if row.walked
        for segment in row.segments
    )
    big = [row for row in scan.arenas if sum(s.mapped_bytes for s in row.segments) > 8 * MIB]
    assert len(big) >= 4 and inside >= 4 * 2
    assert len(calls) >= len(scan.arenas) + inside
    assert [(row.free_bytes, row.chunks) for row in scan.arenas] == [
        (row.free_bytes, row.chunks) for row in again.arenas
    ]


def test_an_arena_judged_scouted_then_copied_whole_has_its_buffers_faulted_in_before_its_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under a CPU quota, whether an arena is scouted follows the stops' costs as measured,
    so the read's start (which faults in the buffers of the arenas to be copied whole) and
    the arena's turn may judge it differently. Here every arena is judged scouted at the
    start and copied whole at its turn: each one's buffers are faulted in before its stop
    (outside any stop), and the read measures what a read judged the usual way does."""
    from memforensics.sources.glibc import heapmaps
    from memforensics.sources.glibc.arena_hold import StopBatches
    from memforensics.sources.glibc.libc_elf import load_libc_image

    with c_target("many_arenas", "4", "30000") as target:
        maps = Path(f"/proc/{target.pid}/maps").read_text().splitlines()
        libc_path = next(line.split()[-1] for line in maps if "/libc.so.6" in line)
        libc = load_libc_image(target.pid, libc_path)
        usual_hold = StopBatches(target.pid, libc=libc, single_threaded=False)
        try:
            usual = scan_heap(target.pid, libc_path=libc_path, figures=True, hold=usual_hold)
        finally:
            usual_hold.close()
        batches = StopBatches(target.pid, libc=libc, single_threaded=False)
        preparing = [False]
        prepared: list[tuple[list[int], bool]] = []  # (lengths, whether inside a stop)
        real_prepare, real_pool_prepare = heapmaps._HeapRead.prepare, BufferPool.prepare

        def read_prepare(self: heapmaps._HeapRead) -> None:
            preparing[0] = True
            try:
                real_prepare(self)
            finally:
                preparing[0] = False

        def pool_prepare(self: BufferPool, lengths: Sequence[int]) -> None:
            prepared.append((list(lengths), batches.stopped))
            real_pool_prepare(self, lengths)

        monkeypatch.setattr(heapmaps._HeapRead, "prepare", read_prepare)
        monkeypatch.setattr(BufferPool, "prepare", pool_prepare)
        monkeypatch.setattr(heapmaps.StopRules, "scouts", lambda self, _bytes: preparing[0])
        try:
            scan = scan_heap(target.pid, libc_path=libc_path, figures=True, hold=batches)
        finally:
            batches.close()
    thread_arenas = [row for row in scan.arenas if not row.is_main]
    assert len(thread_arenas) >= 4 and all(row.walked for row in thread_arenas)
    # (Each heap's buffer sized to the heap: one call per arena whose heaps were judged.)
    sizes = sorted(sorted(s.mapped_bytes for s in row.segments) for row in scan.arenas)
    assert sorted(sorted(lengths) for lengths, _ in prepared) == sizes
    assert not any(inside for _, inside in prepared)
    assert [(row.free_bytes, row.chunks, row.figures) for row in scan.arenas] == [
        (row.free_bytes, row.chunks, row.figures) for row in usual.arenas
    ]
