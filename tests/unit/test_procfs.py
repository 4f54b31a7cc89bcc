"""procfs and the /proc/PID/mem + pagemap reader on real processes (seams only where a kernel
file must be missing: a /proc look-alike of symlinks to the real files)."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from memforensics.errors import NoSuchProcessError, TargetError
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.proc import (
    memory_figures,
    process_facts,
    process_search,
    procfs,
    procmaps,
    procmem,
    target_check,
)
from memforensics.sources.proc.procmem import PagemapUnavailableError, ProcessMemoryReader

PAGE = os.sysconf("SC_PAGE_SIZE")


def _status_bytes(key: str) -> int:
    for line in open("/proc/self/status", encoding="ascii"):  # noqa: SIM115
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} in /proc/self/status")


def test_read_memory_matches_kernel_and_psutil() -> None:
    """File-backed agrees with the kernel's own RssFile counter (read independently); USS
    agrees with psutil's (both private clean + dirty)."""
    memory = memory_figures.read_memory(os.getpid())
    assert memory.rss_bytes and memory.anon_bytes and memory.file_bytes is not None
    # status's counters are per-CPU approximations: allow a few pages per CPU either way.
    kernel_file = _status_bytes("RssFile")
    slack = 64 * PAGE * (os.cpu_count() or 1) + memory.rss_bytes // 50
    assert abs(memory.file_bytes - kernel_file) <= slack
    uss = psutil.Process().memory_full_info().uss
    assert memory.uss_bytes == pytest.approx(uss, rel=0.05)
    assert memory.pss_bytes is not None and memory.pss_bytes <= memory.rss_bytes


@pytest.mark.parametrize(
    ("flags", "grows"), [(mmap.MAP_PRIVATE, "anon"), (mmap.MAP_SHARED, "shmem")]
)
def test_read_memory_puts_new_memory_in_the_right_class(flags: int, grows: str) -> None:
    """Private anonymous memory counts as anonymous; shared anonymous memory is shmem."""
    size = 32 * 1024 * 1024
    before = memory_figures.read_memory(os.getpid())
    region = mmap.mmap(-1, size, flags=flags)
    try:
        region.write(b"x" * size)
        after = memory_figures.read_memory(os.getpid())
        grown = {
            "anon": (after.anon_bytes or 0) - (before.anon_bytes or 0),
            "shmem": (after.shmem_bytes or 0) - (before.shmem_bytes or 0),
        }
        assert grown[grows] >= size * 0.9
        assert (after.rss_bytes or 0) - (before.rss_bytes or 0) >= size * 0.9
    finally:
        region.close()


def test_read_memory_counts_a_mapped_file_as_file_backed(tmp_path: Path) -> None:
    """Reading a mapped file grows file-backed RSS, not anonymous (file is not just a rest)."""
    size = 32 * 1024 * 1024
    path = tmp_path / "mapped.bin"
    path.write_bytes(b"y" * size)
    with path.open("rb") as handle:
        before = memory_figures.read_memory(os.getpid())
        region = mmap.mmap(handle.fileno(), size, prot=mmap.PROT_READ)
        try:
            touched = sum(region[offset] for offset in range(0, size, PAGE))
            after = memory_figures.read_memory(os.getpid())
        finally:
            region.close()
    assert touched == ord("y") * (size // PAGE)
    assert (after.file_bytes or 0) - (before.file_bytes or 0) >= size * 0.9
    assert abs((after.anon_bytes or 0) - (before.anon_bytes or 0)) < size * 0.1


def test_facts_of_self_and_refusal_of_self() -> None:
    facts = process_facts.read_process(os.getpid())
    assert facts.allocator.kind == "glibc"
    assert facts.glibc_version == os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # type: ignore[union-attr]
    assert procfs.process_state(os.getpid()) == "R"
    with pytest.raises(TargetError, match="memforensics itself"):
        target_check.check_target(os.getpid())


def test_facts_after_a_read_take_what_moves_from_status_and_keep_who_it_is() -> None:
    """The report's closing facts: one status text read after the heap read brings state,
    threads, tracer and uid up to date, as read_process would read them; a process that has
    exited meanwhile is read again whole (no allocator, no exe, as read_process says)."""
    child = subprocess.Popen(["sleep", "30"])
    try:
        deadline = time.monotonic() + 10
        while procfs.process_state(child.pid) != "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        facts = process_facts.read_process(child.pid)
        status = Path(f"/proc/{child.pid}/status").read_text()
        after = process_facts.facts_after(facts, status)
        assert after == process_facts.read_process(child.pid, allocator=facts.allocator)
        assert (after.state, after.threads, after.tracer_pid) == ("S", 1, 0)
        child.kill()
        while procfs.process_state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        exited = process_facts.facts_after(facts, Path(f"/proc/{child.pid}/status").read_text())
        assert exited.state == "Z" and exited.exe is None
        assert exited.allocator.detail == "no user memory"
    finally:
        child.kill()
        child.wait()


def test_no_such_process() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    for call in (procfs.process_state, memory_figures.read_memory, process_facts.read_process):
        with pytest.raises(NoSuchProcessError):
            call(child.pid)
    with pytest.raises(NoSuchProcessError):
        target_check.check_target(-5)


def test_find_pids_by_name_excludes_self_and_matches_cmdline() -> None:
    marker = "memforensics-find-me-7f3a"
    child = subprocess.Popen(["sleep", "30"])
    other = subprocess.Popen(["sh", "-c", f"sleep 30 # {marker}"])
    try:
        assert other.pid in process_search.find_pids_by_name(marker)  # matched on the command line
        assert child.pid in process_search.find_pids_by_name("^sleep$")  # matched on the name
        assert os.getpid() not in process_search.find_pids_by_name("python|pytest")
        assert process_search.find_pids_by_name("[unbalanced") == []  # a literal when not a regex
    finally:
        for proc in (child, other):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("name", ["short-sleep", "a-very-long-sleeping-program", "exactly15chars_"])
def test_process_name_is_completed_past_the_kernels_15_characters(
    tmp_path: Path, name: str
) -> None:
    """The kernel keeps 15 characters of a name; the full one comes from argv[0] when that
    starts with them, as ps and psutil show it."""
    program = tmp_path / name
    sleep = subprocess.run(["which", "sleep"], capture_output=True, text=True, check=True)
    program.symlink_to(sleep.stdout.strip())
    # Popen returns once the child has exec'd: its comm is the program's file name by now.
    child = subprocess.Popen([str(program), "30"])
    renamed = subprocess.Popen(["x" + name[:10], "30"], executable=str(program))
    try:
        assert (
            process_facts.read_process(child.pid).name == name == psutil.Process(child.pid).name()
        )
        # argv[0] does not start with the kernel's name: the kernel's 15 characters stand.
        assert process_facts.read_process(renamed.pid).name == name[:15]
        assert psutil.Process(renamed.pid).name() == name[:15]
    finally:
        for proc in (child, renamed):
            proc.kill()
            proc.wait()


def test_pagemap_counts_resident_pages_exactly() -> None:
    """Touch pages 0, 2 and 3 of a fresh mapping: whole and partial page counts follow."""
    import ctypes

    region = mmap.mmap(-1, 8 * PAGE, flags=mmap.MAP_PRIVATE)
    try:
        for page in (0, 2, 3):
            region[page * PAGE] = 1
        anchor = ctypes.c_char.from_buffer(region)
        start = ctypes.addressof(anchor)
        del anchor  # the mapping cannot close while a ctypes view of it exists
        with ProcessMemoryReader(os.getpid()) as reader:
            pages = reader.pagemap(start, start + 8 * PAGE)
        assert pages.total_resident_bytes == 3 * PAGE
        assert pages.resident_bytes(start, start + PAGE) == PAGE
        assert pages.resident_bytes(start + PAGE, start + 2 * PAGE) == 0
        # Half of page 0, none of 1, all of 2, a quarter of 3.
        span = pages.resident_bytes(start + PAGE // 2, start + 3 * PAGE + PAGE // 4)
        assert span == PAGE // 2 + PAGE + PAGE // 4
        assert pages.whole_pages_resident_bytes(start + 1, start + 4 * PAGE) == 2 * PAGE
        assert pages.whole_pages_resident_bytes(start + 1, start + 2 * PAGE - 1) == 0
    finally:
        region.close()


def _proc_like(tmp_path: Path, pid: int, names: tuple[str, ...]) -> Path:
    """A /proc look-alike holding only ``names`` of the real /proc/PID (as symlinks)."""
    (tmp_path / str(pid)).mkdir()
    for name in names:
        (tmp_path / str(pid) / name).symlink_to(f"/proc/{pid}/{name}")
    return tmp_path


def test_without_smaps_rollup_memory_is_summed_from_smaps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug (issue 9): on kernels before 4.14 (no smaps_rollup) read_memory said "no process
    with PID N" for a live process. It now sums /proc/PID/smaps, to the same figures."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while procfs.process_state(proc.pid) not in "S" and time.monotonic() < deadline:
            time.sleep(0.01)  # until exec'd and asleep: its memory no longer moves
        real = memory_figures.read_memory(proc.pid)
        names = ("status", "smaps", "stat")
        monkeypatch.setattr(procfs, "PROC", _proc_like(tmp_path, proc.pid, names))
        summed = memory_figures.read_memory(proc.pid)
    finally:
        proc.kill()
        proc.wait()
    assert summed.rss_bytes == real.rss_bytes and real.rss_bytes
    assert summed.anon_bytes == real.anon_bytes
    assert summed.uss_bytes == real.uss_bytes and summed.uss_bytes
    assert summed.swap_bytes == real.swap_bytes
    assert summed.pss_bytes is not None and real.pss_bytes is not None
    assert abs(summed.pss_bytes - real.pss_bytes) <= 64 * 1024  # rollup rounds once, we per VMA


def test_smaps_totals_of_a_scan_equal_the_kernels_smaps_rollup() -> None:
    """The totals the scan takes from its one read of smaps (so that inspect does not walk
    the page tables twice) are the kernel's smaps_rollup of a process at rest."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while procfs.process_state(proc.pid) not in "S" and time.monotonic() < deadline:
            time.sleep(0.01)
        _, totals = procmaps.read_smaps_and_totals(proc.pid)
        kernel = memory_figures.read_memory(proc.pid)
        ours = memory_figures.read_memory(proc.pid, rollup=totals)
    finally:
        proc.kill()
        proc.wait()
    assert ours.rss_bytes == kernel.rss_bytes and kernel.rss_bytes
    assert ours.anon_bytes == kernel.anon_bytes and kernel.anon_bytes
    assert ours.uss_bytes == kernel.uss_bytes
    assert ours.swap_bytes == kernel.swap_bytes
    assert ours.pss_bytes is not None and kernel.pss_bytes is not None
    assert abs(ours.pss_bytes - kernel.pss_bytes) <= 64 * 1024  # per VMA truncation


def test_gone_process_is_still_no_such_process_without_smaps_rollup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(procfs, "PROC", tmp_path)
    with pytest.raises(NoSuchProcessError):
        memory_figures.read_memory(os.getpid())


def test_unreadable_pagemap_is_unknown_not_a_guess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bug (issue 9): an unreadable pagemap counted as "all resident" in one place and "none
    resident" in another, and either produced advice. Now residency is unknown and says so."""
    monkeypatch.setattr(procmem, "PROC_ROOT", _proc_like(tmp_path, os.getpid(), ("mem",)))
    with pytest.raises(PagemapUnavailableError, match="resident is unknown"):
        ProcessMemoryReader(os.getpid())
    with pytest.raises(PagemapUnavailableError, match="resident is unknown"):
        scan_heap(os.getpid())


def test_maps_and_smaps_parsers_agree_with_the_kernels_own_totals() -> None:
    """The maps/smaps readers against the kernel, on an idle child: one mapping per maps
    line and the same mappings in smaps, the smaps entries' Rss and Anonymous summing to
    smaps_rollup's, and file_paths the file-backed paths of those mappings."""
    from memforensics.sources.proc import procmaps

    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == b"ready"
        pid = child.pid
        maps_text = Path(f"/proc/{pid}/maps").read_text()
        smaps_text = Path(f"/proc/{pid}/smaps").read_text()
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
        any_mapped, of_libc = procmaps.read_maps_of(pid, _libc_path(maps_text))
    finally:
        child.kill()
        child.wait(timeout=10)
    kernel = {
        line.split(":")[0]: int(line.split()[1]) * 1024
        for line in rollup.splitlines()[1:]
        if line.split(":")[0] in ("Rss", "Anonymous")
    }
    mappings = procmaps.parse_maps(maps_text)
    assert len(mappings) == len(maps_text.splitlines())
    entries = procmaps.parse_smaps(smaps_text)
    spans = [(m.start_address, m.end_address, m.path) for m in entries]
    assert spans == [(m.start_address, m.end_address, m.path) for m in mappings]
    assert sum(m.rss_bytes or 0 for m in entries) == kernel["Rss"]
    assert sum(m.anon_bytes or 0 for m in entries) == kernel["Anonymous"]
    assert procmaps.file_paths(maps_text) == list(
        dict.fromkeys(m.path for m in mappings if m.file_backed)
    )
    assert any_mapped and of_libc
    assert {(m.start_address, m.path) for m in of_libc} == {
        (m.start_address, m.path) for m in mappings if m.path == of_libc[0].path
    }


def _libc_path(maps_text: str) -> str:
    for line in maps_text.splitlines():
        path = line.split(None, 5)[-1].strip()
        if os.path.basename(path).startswith("libc.so"):
            return path
    raise AssertionError("no libc.so mapped")


def test_runnable_tasks_counts_busy_processes_and_a_scout_reads_with_one_thread_then() -> None:
    """With a busy loop on every CPU we may run on, the machine's runnable tasks are at least
    those loops and our own thread, so a scout of a running target (glibc_walk's reader
    threads) reads with one thread, leaving the CPUs to the target; in a stop it still may
    use two. Without the loops, some moment has a CPU idle and two readers."""
    from memforensics.sources.glibc.glibc_walk import _reader_threads

    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        assert _reader_threads(False) == _reader_threads(True) == 1
        return
    idle: list[tuple[int | None, int]] = []
    deadline = time.monotonic() + 10  # (the test session's services may be busy a moment)
    while time.monotonic() < deadline and not any(threads == 2 for _, threads in idle):
        idle.append((procfs.runnable_tasks(), _reader_threads(False)))
        time.sleep(0.005)
    assert any(threads == 2 for _, threads in idle), idle[-20:]
    assert all(runnable is not None and runnable >= 1 for runnable, _ in idle)
    loops = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                "import time\nend = time.monotonic() + 20\nwhile time.monotonic() < end: pass",
            ]
        )
        for _ in range(cpus)
    ]
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(
            psutil.Process(p.pid).status() == psutil.STATUS_RUNNING for p in loops
        ):
            time.sleep(0.01)
        busy = [(procfs.runnable_tasks(), _reader_threads(False)) for _ in range(50)]
        assert all(r is not None and r >= cpus + 1 for r, _ in busy), busy
        assert all(threads == 1 for _, threads in busy), busy
        assert _reader_threads(True) == 2
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()
