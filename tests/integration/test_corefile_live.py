"""Real cores of a real idle process, from gdb's gcore and from the kernel, read back and
set against what the live process showed just before: /proc/PID/maps, /proc/PID/task and
/proc/PID/mem (through the project's ProcessMemoryReader), and readelf's build-ids.

The target (tests/targets/core_target.c) holds memory of every kind a core may or may not
keep, with recognisable contents, and blocks in pause() in every thread, so that its memory
does not change between the live reads and the core. Cores are written to the test's own
temporary directory and deleted by the fixture that made them.

What the two writers keep, as these tests pin it down:
- gdb's gcore: every anonymous mapping whole (PROT_NONE ones too, as zeros, flagged R), a
  file mapping's pages only when they were written to (relocated .data, RELRO), the whole
  first mapping of an ELF file (its headers, so its build-id), a deleted file's mapping whole;
  no segment at all for what it leaves out (libc's text), and none for [vvar].
- the kernel (coredump_filter 0x33 by default): every anonymous private and shared mapping,
  with the real permissions; of an unwritten ELF file mapping only the first page; an empty
  segment (p_filesz 0) for everything else, [vvar] included; the crashing thread first.
"""

from __future__ import annotations

import contextlib
import os
import re
import resource
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from memforensics.sources.core.corefile import CoreFile
from memforensics.sources.core.elf64 import (
    EHDR,
    PHDR,
    PT_LOAD,
    PT_NOTE,
    build_id,
    identify,
    program_headers,
)
from memforensics.sources.proc.procmaps import Mapping, read_maps
from memforensics.sources.proc.procmem import ProcessMemoryReader
from tests.support.gcore import gcore as write_gcore
from tests.support.targets import Target, c_target, live_skip_reason

pytestmark = pytest.mark.integration

THREADS = 3
MAGIC = 0x5EEDC0DE00000000
# pause(2) on x86-64, and rt_sigsuspend(2) where a libc implements pause() with it.
PAUSE_SYSCALLS = ("34", "130")
LIBC_NAME = re.compile(r"/libc[.-][^/]*so")


@dataclass
class LiveProcess:
    """What the live target showed before its core was taken."""

    pid: int
    maps: list[Mapping]
    tasks: list[int]
    addresses: dict[str, int]  # the target's "ready key=0x..." line
    contents: dict[tuple[int, int], bytes]  # (start, end) -> bytes, swapped pages as zeros
    page_bytes: int
    comm: str  # /proc/PID/comm
    cmdline: str  # /proc/PID/cmdline, arguments joined by spaces

    def libc_path(self) -> str:
        return next(m.path for m in self.maps if LIBC_NAME.search(m.path))


def _compared(mapping: Mapping) -> bool:
    """Private writable memory that is not a file's: the heap's, stacks', arenas', bss."""
    return (
        mapping.perms.startswith("rw")
        and mapping.perms.endswith("p")
        and (mapping.anonymous or mapping.path in ("[heap]", "[stack]"))
    )


def _wait_until_idle(pid: int, timeout_seconds: float = 20.0) -> None:
    """Wait until every thread is blocked in pause(): a thread still on its way there (its
    "ready" comes before the workers leave the barrier) writes to its stack meanwhile."""
    deadline = time.monotonic() + timeout_seconds
    while True:
        calls = [
            Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()[0]
            for tid in os.listdir(f"/proc/{pid}/task")
        ]
        if all(call in PAUSE_SYSCALLS for call in calls):
            return
        assert time.monotonic() < deadline, f"the target's threads are not idle: {calls}"
        time.sleep(0.01)


def _snapshot(target: Target) -> LiveProcess:
    pid = target.pid
    _wait_until_idle(pid)
    maps = read_maps(pid)
    addresses = {
        key: int(value, 16)
        for key, value in (item.split("=") for item in target.ready_line.split()[1:])
    }
    contents: dict[tuple[int, int], bytes] = {}
    with ProcessMemoryReader(pid) as memory:
        libc = [m for m in maps if LIBC_NAME.search(m.path) and "w" in m.perms]
        bss = [m for m in maps if any(m.start_address == lib.end_address for lib in libc)]
        for mapping in [*filter(_compared, maps), *libc, *bss]:
            key = (mapping.start_address, mapping.end_address)
            contents[key] = memory.read_present(mapping.start_address, mapping.size_bytes)
            swapped = memory.pagemap(*key).swapped
            assert not any(swapped), "a page of the target is in swap: its bytes are unknown"
    return LiveProcess(
        pid=pid,
        maps=maps,
        tasks=sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")),
        addresses=addresses,
        contents=contents,
        page_bytes=os.sysconf("SC_PAGE_SIZE"),
        comm=Path(f"/proc/{pid}/comm").read_text().strip(),
        cmdline=" ".join(Path(f"/proc/{pid}/cmdline").read_text().rstrip("\0").split("\0")),
    )


def kernel_core_skip_reason() -> str | None:
    """Why the kernel cannot write a core into a test's directory here, or None."""
    pattern = Path("/proc/sys/kernel/core_pattern").read_text().strip()
    if pattern.startswith("|"):
        return f"core_pattern pipes cores to a helper ({pattern.split()[0]}); tests leave it"
    if "/" in pattern:
        return f"core_pattern writes cores to a fixed directory ({pattern}); tests leave it"
    return None


@pytest.fixture(scope="module")
def gcore(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveProcess, CoreFile]]:
    """A gcore core of the target, and the target as it was just before."""
    reason = live_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("gcore")
    path = directory / "target.core"
    try:
        with c_target("core_target", str(directory), str(THREADS)) as target:
            live = _snapshot(target)
            write_gcore(target.pid, path)
            assert target.alive() and target.settled_state() == "S", "gcore left the target stopped"
        with CoreFile(path) as core:
            yield live, core
    finally:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def kernel_core(directory: Path, limit_bytes: int) -> Iterator[tuple[LiveProcess, Path, int]]:
    """The kernel's core of the target, killed by SIGSEGV sent to one of its worker threads,
    with RLIMIT_CORE ``limit_bytes``; yields the live snapshot, the core and that thread."""
    reason = live_skip_reason() or kernel_core_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    try:
        with c_target("core_target", str(directory), str(THREADS)) as target:
            live = _snapshot(target)
            _soft, hard = resource.prlimit(target.pid, resource.RLIMIT_CORE)
            if hard != resource.RLIM_INFINITY and hard < limit_bytes:
                pytest.skip(f"the hard RLIMIT_CORE ({hard}) is below {limit_bytes}")
            resource.prlimit(target.pid, resource.RLIMIT_CORE, (limit_bytes, hard))
            crashing = live.tasks[-1]
            # kill() of a thread's id: the signal is the process's, but that thread takes it.
            os.kill(crashing, signal.SIGSEGV)
            assert target.proc.wait(timeout=120) == -signal.SIGSEGV
        cores = [p for p in directory.iterdir() if p.is_file()]
        assert len(cores) == 1, f"the kernel wrote no core in {directory}: {cores}"
        yield live, cores[0], crashing
    finally:
        for leftover in directory.iterdir():
            leftover.unlink()


@pytest.fixture(scope="module")
def kcore(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LiveProcess, CoreFile, int]]:
    directory = tmp_path_factory.mktemp("kcore")
    with (
        kernel_core(directory, resource.RLIM_INFINITY) as (live, path, crashing),
        CoreFile(path) as core,
    ):
        yield live, core, crashing


def _range(mappings: list[Mapping]) -> set[tuple[int, int]]:
    return {(m.start_address, m.end_address) for m in mappings}


def _special(mapping: Mapping) -> bool:
    return mapping.path.startswith("[vvar")


# Facts from the notes.


def test_threads_pid_and_page_size(gcore: tuple[LiveProcess, CoreFile]) -> None:
    live, core = gcore
    assert core.written_by_gdb
    assert core.pid == live.pid
    assert len(core.threads) == len(live.tasks) == THREADS + 1
    assert sorted(t.tid for t in core.threads) == live.tasks
    assert core.page_bytes == live.page_bytes
    # gdb's NT_PRPSINFO names the executable (its name cut to 16 bytes, with no NUL) where
    # the kernel's has comm, and leaves out the arguments of a process it attached to.
    assert core.process is not None and core.executable_path is not None
    assert core.process.fname == Path(core.executable_path).name[:16]
    assert core.process.psargs == core.executable_path == live.cmdline.split()[0]
    assert core.warnings == []


def test_nt_file_lists_the_file_mappings_of_maps(gcore: tuple[LiveProcess, CoreFile]) -> None:
    live, core = gcore
    expected = [
        (m.start_address, m.end_address, m.offset_bytes, m.path, m.deleted)
        for m in live.maps
        if m.file_backed
    ]
    found = [
        (f.start_address, f.end_address, f.offset_bytes, f.path, f.deleted) for f in core.files
    ]
    assert found == expected
    assert any(f.deleted and f.path.endswith("/mapped-file") for f in core.files)
    assert any(f.deleted and f.path == "/dev/zero" for f in core.files)


def _check_mappings(live: LiveProcess, core: CoreFile, *, exact_read_bit: bool) -> None:
    """core.mappings() is maps' list: ranges, offsets, paths, names; permissions too, but for
    gcore's read bit (it flags every segment it writes readable)."""
    kept = [m for m in live.maps if exact_read_bit or not _special(m)]
    rebuilt = {(m.start_address, m.end_address): m for m in core.mappings()}
    assert set(rebuilt) == _range(kept)
    for mapping in kept:
        twin = rebuilt[(mapping.start_address, mapping.end_address)]
        expected_path = "" if mapping.path == "[heap]" or _special(mapping) else mapping.path
        assert (twin.path, twin.deleted, twin.offset_bytes) == (
            expected_path,
            mapping.deleted,
            mapping.offset_bytes,
        ), mapping
        perms = mapping.perms[:3] + "p"
        if not exact_read_bit and twin.perms != perms:
            assert twin.perms[1:] == perms[1:] and twin.perms[0] == "r", (mapping, twin)
        else:
            assert twin.perms == perms, (mapping, twin)
        # [heap] and [vvar] are not named in a core: they look like anonymous memory there.
        assert twin.anonymous == (
            mapping.anonymous or mapping.path == "[heap]" or _special(mapping)
        )
    heap = next(m for m in live.maps if m.path == "[heap]")
    assert core.heap_range_hint == (heap.start_address, heap.end_address)
    assert core.program_break_hint == heap.end_address
    assert core.executable_path == next(m.path for m in live.maps if m.file_backed)


def test_mappings_look_like_maps(gcore: tuple[LiveProcess, CoreFile]) -> None:
    _check_mappings(*gcore, exact_read_bit=False)


def _check_memory(live: LiveProcess, core: CoreFile) -> None:
    """Every private writable anonymous mapping, [heap], the stacks, libc's .data and bss:
    the core holds every byte, equal to what /proc/PID/mem read (untouched pages as zeros)."""
    assert len(live.contents) >= 12
    with core.memory() as memory:
        for (start, end), expected in live.contents.items():
            assert memory.read(start, end - start) == expected, f"{start:#x}-{end:#x}"
            assert memory.pagemap(start, end).all_resident
        for key in ("heap", "big"):  # the target's own pattern, at the address it printed
            at = live.addresses[key]
            word = memory.read(at + 4096, 8)
            assert word is not None and int.from_bytes(word, "little") == (at + 4096) ^ MAGIC


def test_anonymous_memory_is_in_the_core_byte_for_byte(
    gcore: tuple[LiveProcess, CoreFile],
) -> None:
    _check_memory(*gcore)


def test_what_gcore_keeps_and_leaves_out(gcore: tuple[LiveProcess, CoreFile]) -> None:
    live, core = gcore
    page = live.page_bytes
    libc = live.libc_path()
    libc_maps = [m for m in live.maps if m.path == libc]
    with core.memory() as memory:
        header, text = libc_maps[0], next(m for m in libc_maps if "x" in m.perms)
        assert memory.pagemap(header.start_address, header.end_address).all_resident
        assert memory.read(header.start_address, 4) == b"\x7fELF"
        assert not memory.readable(text.start_address)
        assert memory.pagemap(text.start_address, text.end_address).total_resident_bytes == 0
        assert memory.read(text.start_address, 16) is None
        assert memory.read_present(text.start_address, 16) == bytes(16)
        # Its whole text is back in the list all the same, with the ELF's own permissions.
        rebuilt = {m.start_address: m for m in core.mappings()}
        assert rebuilt[text.start_address].perms == "r-xp"
        # The 16 MiB of which every 16th page was touched: all in the core, zeros between.
        sparse = live.addresses["sparse"]
        assert memory.pagemap(sparse, sparse + (16 << 20)).all_resident
        assert memory.read(sparse + page, page) == bytes(page)
        first = memory.read(sparse, 8)
        assert first is not None and int.from_bytes(first, "little") == sparse ^ MAGIC
        # The deleted file, mapped read-only and never written: gcore keeps it whole.
        mapped = live.addresses["mapped"]
        assert memory.read(mapped + page, 4) == b"bbbb"
        assert memory.read(live.addresses["written"], 4) == b"WWWW"
        # A read across two segments: libc's .data runs on into its bss.
        data = next(m for m in libc_maps if "w" in m.perms)
        across = memory.read(data.end_address - 8, 16)
        assert across is not None and across == (
            live.contents[(data.start_address, data.end_address)][-8:]
            + live.contents[next(k for k in live.contents if k[0] == data.end_address)][:8]
        )


def test_build_ids(gcore: tuple[LiveProcess, CoreFile], tmp_path: Path) -> None:
    live, core = gcore
    libc = live.libc_path()
    in_core = core.mapped_build_id(libc)
    assert in_core is not None and in_core == build_id(libc)
    readelf = shutil.which("readelf")
    if readelf is not None:
        out = subprocess.run([readelf, "-n", libc], capture_output=True, text=True, check=True)
        assert f"Build ID: {in_core.hex()}" in out.stdout
    assert core.file_for(libc) == Path(libc)
    assert core.warnings == []
    # A sysroot holding another build under libc's name: found, and said not to match.
    other = tmp_path / libc.lstrip("/")
    other.parent.mkdir(parents=True)
    shutil.copyfile(next(m.path for m in live.maps if "ld-linux" in m.path), other)
    assert core.file_for(libc, sysroot=tmp_path) == other
    assert [w.kind for w in core.warnings] == ["build_id_mismatch"]
    core.warnings.clear()
    assert core.file_for("/usr/lib/nowhere/libc.so.6", sysroot=tmp_path) is None


def _prefix(source: Path, target: Path, size: int) -> Path:
    """The first ``size`` bytes of ``source``: a core cut short, as truncate(1) leaves it."""
    with source.open("rb") as src, target.open("wb") as dst:
        left = size
        while left > 0:
            copied = os.copy_file_range(src.fileno(), dst.fileno(), left)
            if copied == 0:
                break
            left -= copied
    return target


def test_a_truncated_gcore_core(gcore: tuple[LiveProcess, CoreFile], tmp_path: Path) -> None:
    """gcore writes its notes last: cut inside them, the threads and files before the cut
    are kept with a warning; cut before them, the core is refused (exit 7)."""
    live, core = gcore
    with core.path.open("rb") as raw:
        head = raw.read(EHDR.size)
        header = identify(head)
        raw.seek(header.phoff)
        headers = program_headers(raw.read(header.phnum * PHDR.size), header.phnum)
    notes = next(h for h in headers if h.type == PT_NOTE)
    assert notes.offset > max(h.offset for h in headers if h.type == PT_LOAD)
    cut = _prefix(core.path, tmp_path / "cut.core", notes.offset + notes.filesz - 100)
    try:
        with CoreFile(cut) as partial:
            assert "notes_truncated" in [w.kind for w in partial.warnings]
            assert len(partial.threads) == len(live.tasks)
        _prefix(core.path, cut, core.file_bytes // 2)
        with pytest.raises(Exception, match="notes are missing") as caught:
            CoreFile(cut)
        assert getattr(caught.value, "exit_code", None) == 7
    finally:
        cut.unlink(missing_ok=True)


# The kernel's core.


def test_kernel_core_threads_and_pid(kcore: tuple[LiveProcess, CoreFile, int]) -> None:
    live, core, crashing = kcore
    assert not core.written_by_gdb
    assert core.pid == live.pid
    assert sorted(t.tid for t in core.threads) == live.tasks
    assert core.threads[0].tid == crashing and core.threads[0].signal == signal.SIGSEGV
    assert core.process is not None
    assert (core.process.fname, core.process.psargs) == (live.comm, live.cmdline[:79])
    assert core.page_bytes == live.page_bytes
    assert core.warnings == []


def test_kernel_core_mappings_and_memory(kcore: tuple[LiveProcess, CoreFile, int]) -> None:
    live, core, _ = kcore
    expected = [
        (m.start_address, m.end_address, m.offset_bytes, m.path) for m in live.maps if m.file_backed
    ]
    assert [(f.start_address, f.end_address, f.offset_bytes, f.path) for f in core.files] == (
        expected
    )
    _check_mappings(live, core, exact_read_bit=True)
    _check_memory(live, core)


def test_what_the_kernel_keeps_and_leaves_out(kcore: tuple[LiveProcess, CoreFile, int]) -> None:
    live, core, _ = kcore
    page = live.page_bytes
    libc = [m for m in live.maps if m.path == live.libc_path()]
    with core.memory() as memory:
        header = memory.pagemap(libc[0].start_address, libc[0].end_address)
        assert header.present[0] == 1 and header.total_resident_bytes == page
        assert core.mapped_build_id(live.libc_path()) == build_id(live.libc_path())
        mapped = live.addresses["mapped"]
        assert not memory.readable(mapped)  # a file mapping never written: not in the core
        assert memory.read(live.addresses["written"], 4) == b"WWWW"
        assert memory.read(live.addresses["shared"] + 8, 8) is not None
        sparse = live.addresses["sparse"]
        assert memory.pagemap(sparse, sparse + (16 << 20)).all_resident
        assert memory.read(sparse + page, page) == bytes(page)  # a hole in the sparse file


def test_kernel_core_cut_by_rlimit_core(tmp_path: Path) -> None:
    """RLIMIT_CORE of 1 MiB: the kernel stops writing there (counting the bytes it wrote,
    not the holes it skipped). The notes come first, so the threads and files are all there;
    memory past the cut reads as absent, with a warning."""
    with kernel_core(tmp_path, 1 << 20) as (live, path, _), CoreFile(path) as core:
        assert [w.kind for w in core.warnings] == ["truncated"]
        assert sorted(t.tid for t in core.threads) == live.tasks
        assert len(core.files) == sum(1 for m in live.maps if m.file_backed)
        with core.memory() as memory:
            kept = [s for s in core.segments if s.present_bytes]
            assert kept and memory.read(kept[0].start_address, 8) is not None
            lost = [s for s in core.segments if s.present_bytes < s.end_address - s.start_address]
            stack = next(m for m in live.maps if m.path == "[stack]")
            assert memory.read(stack.start_address, 8) is None  # the last segment: cut off
            assert lost
