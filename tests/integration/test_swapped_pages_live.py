"""The residency walk never reads a page that is swapped out (it would fault it back in).

A real target (tests/targets/swapped_free.c) pushes free chunks of its main arena to swap
with madvise(MADV_PAGEOUT). The oracles are not the code under test: the target's own view
of /proc/self/pagemap (it says "ready OK" only once the pages are swapped), a pagemap reader
written here, and /proc/PID/smaps_rollup's Swap. Swap is needed: the machine's own if it has
some, else, as root, a 64 MiB swap file in a private temporary directory, switched on for
this test only and switched off and deleted in ``finally``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.sources.glibc import heapcopy
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.proc.pagemap_scan import residency_flags
from memforensics.sources.proc.procmem import ProcessMemoryReader
from tests.support.targets import c_target, have_cc

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_cc(), reason="no C compiler (cc) to build the target programs"),
]

SWAP_FILE_MIB = 64
PAGE = os.sysconf("SC_PAGE_SIZE")
UNSORTED_BIN = 1


def _swap_free_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("SwapFree:"):
            return int(line.split()[1])
    return 0


@contextlib.contextmanager
def _swap_available() -> Iterator[None]:
    """Swap for the test: the machine's, or a small swap file of our own (root only)."""
    if _swap_free_kib() >= 16 * 1024:
        yield
        return
    if os.geteuid() != 0 or not (shutil.which("mkswap") and shutil.which("swapon")):
        pytest.skip("no swap on this machine, and not root to switch on a swap file for the test")
    with tempfile.TemporaryDirectory(prefix="memforensics-swap-") as tmp:
        path = Path(tmp) / "swap"
        with path.open("wb") as handle:
            handle.truncate(0)
            for _ in range(SWAP_FILE_MIB):
                handle.write(bytes(1 << 20))  # written out: swapon refuses a file with holes
        path.chmod(0o600)
        made = subprocess.run(["mkswap", str(path)], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            pytest.skip(f"mkswap failed here: {made.stderr.strip()}")
        on = subprocess.run(["swapon", str(path)], capture_output=True, text=True, check=False)
        if on.returncode != 0:
            pytest.skip(f"swapon of a file in {tmp} failed here: {on.stderr.strip()}")
        try:
            yield
        finally:
            # Whatever is in it comes back into RAM (a few pages of the target, if it lives).
            subprocess.run(["swapoff", str(path)], capture_output=True, check=False, timeout=120)


def _pagemap_flags(pid: int, start: int, end: int) -> list[tuple[bool, bool]]:
    """(present, swapped) of each page of [start, end), read here, not through memforensics."""
    with open(f"/proc/{pid}/pagemap", "rb") as handle:
        handle.seek(start // PAGE * 8)
        data = handle.read((end - start) // PAGE * 8)
    entries = [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]
    return [(bool(e >> 63 & 1), bool(e >> 62 & 1)) for e in entries]


def _present_bytes(pid: int, start: int, end: int) -> int:
    """Bytes of [start, end) on pages in RAM, by the reader above."""
    first = start // PAGE * PAGE
    flags = _pagemap_flags(pid, first, (end + PAGE - 1) // PAGE * PAGE)
    total = 0
    for index, (present, _) in enumerate(flags):
        page_start = first + index * PAGE
        if present:
            total += min(end, page_start + PAGE) - max(start, page_start)
    return total


def _swap_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Swap:"):
            return int(line.split()[1])
    raise AssertionError("smaps_rollup has no Swap line")


@pytest.mark.parametrize("native", [True, False], ids=["c-copy", "python-copy"])
def test_swapped_pages_are_not_read_and_count_as_not_resident(
    native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A scan of a heap with swapped-out free chunks leaves them in swap (its pagemap and
    smaps say so after the scan as before), counts their bytes as not resident, and leaves
    the bin whose list runs through a swapped chunk header unmeasured."""
    if native and heapcopy.native_loop() is None:
        pytest.skip("the C copy is not in use (not built here, or MEMFORENSICS_PURE_PYTHON)")
    if not native:
        monkeypatch.setattr(heapcopy, "_native", None)
    with _swap_available(), c_target("swapped_free") as target:
        words = target.ready_line.split()
        if words[1] != "OK":
            pytest.skip("the kernel would not page the target's memory out (MADV_PAGEOUT)")
        a3_from, a3_to, b5_from, b5_to, *b_chunks, b_size = (int(w, 16) for w in words[2:])
        swapped_spans = [(a3_from, a3_to), (b5_from, b5_to)]
        for start, end in swapped_spans:
            assert all(s and not p for p, s in _pagemap_flags(target.pid, start, end))
        swap_before = _swap_kib(target.pid)

        scan = scan_heap(target.pid)

        for start, end in swapped_spans:
            flags = _pagemap_flags(target.pid, start, end)
            faulted = sum(p for p, _ in flags)
            assert faulted == 0, f"{faulted} swapped pages were read back into RAM"
        assert _swap_kib(target.pid) >= swap_before
        main = next(a for a in scan.arenas if a.is_main)
        assert main.walked
        # A3's header is swapped: the unsorted list cannot be followed through it.
        assert UNSORTED_BIN in main.unmeasured_bins
        # The B chunks' large bin is read whole (B5's header stays in RAM): the only free
        # chunks measured besides the top. B5's swapped bytes (and the tail of B3 on A3's
        # first page) are not resident.
        assert main.free_bytes - (main.top_bytes or 0) == len(b_chunks) * b_size
        expected = sum(_present_bytes(target.pid, c, c + b_size) for c in b_chunks)
        assert expected <= len(b_chunks) * b_size - (b5_to - b5_from)
        assert main.free_resident_bytes - (main.top_resident_bytes or 0) == expected


def test_the_kernels_page_table_scan_says_what_the_entries_say() -> None:
    """ProcessMemoryReader.pagemap takes residency from the kernel's PAGEMAP_SCAN where it
    can (pagemap_scan): over the target's heap, with pages in RAM, in swap and never
    touched, it says of each page exactly what its pagemap entry says (read here)."""
    with _swap_available(), c_target("swapped_free") as target:
        words = target.ready_line.split()
        if words[1] != "OK":
            pytest.skip("the kernel would not page the target's memory out (MADV_PAGEOUT)")
        heap = next(
            line.split()[0]
            for line in Path(f"/proc/{target.pid}/maps").read_text().splitlines()
            if line.endswith("[heap]")
        )
        start, end = (int(bound, 16) for bound in heap.split("-"))
        end += 16 * PAGE  # (past the heap's end: pages no mapping holds)
        with open(f"/proc/{target.pid}/pagemap", "rb") as handle:
            assert residency_flags(handle.fileno(), start, end, PAGE) is not None
        with ProcessMemoryReader(target.pid) as mem:
            pages = mem.pagemap(start, end)
        expected = _pagemap_flags(target.pid, start, end)
        assert any(swapped for _, swapped in expected) and any(p for p, _ in expected)
        flags = zip(pages.present, pages.swapped, strict=True)
        assert [(bool(present), bool(swapped)) for present, swapped in flags] == expected
        assert pages.resident_pages == sum(p for p, _ in expected)


def test_no_call_is_made_through_a_list_the_proof_cannot_read() -> None:
    """The same heap under `inspect`: its read is refused (the unsorted list runs through a
    swapped chunk header, which reads as zeros), not taken for corruption: before, the held
    read named the list corrupt there (exit 8) on this healthy heap. The default's stand-in
    malloc_info call is made only once the lists the read could not follow are proved in the
    call's hold; that proof cannot read the swapped header either, so nothing is called:
    exit 3, saying so, with the gdb path named. The swapped pages stay in swap (the pagemap
    reader above)."""
    import sys

    with _swap_available(), c_target("swapped_free") as target:
        words = target.ready_line.split()
        if words[1] != "OK":
            pytest.skip("the kernel would not page the target's memory out (MADV_PAGEOUT)")
        a3_from, a3_to = (int(w, 16) for w in words[2:4])
        inspect = [sys.executable, "-m", "memforensics", "inspect", str(target.pid)]
        read_only = subprocess.run(
            [*inspect, "--read-only"], capture_output=True, text=True, timeout=120, check=False
        )
        assert read_only.returncode == 3, read_only.stderr
        assert "could not be read consistently" in read_only.stderr, read_only.stderr
        done = subprocess.run(inspect, capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 3, done.stderr
        assert "malloc_info was not called" in done.stderr, done.stderr
        assert "not in RAM" in done.stderr or "not in memory" in done.stderr, done.stderr
        assert "--gdb" in done.stderr, done.stderr
        flags = _pagemap_flags(target.pid, a3_from, a3_to)
        assert all(swapped and not present for present, swapped in flags), flags
