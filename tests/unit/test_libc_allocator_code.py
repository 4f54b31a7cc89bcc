"""What counts as "inside the allocator" for a call's moment (call_moment.unsafe_moment) and a
held read (arena_hold.in_allocator): malloc.o's code, and the system-call wrappers the
allocator calls to move its memory. A single-threaded process takes no arena lock, so a thread
stopped in sbrk between sysmalloc's request and its top's update is known only by where it
stands. Read from this test's own libc: the oracle is its symbol table, read separately."""

from __future__ import annotations

import os

from memforensics.sources.glibc.libc_elf import load_libc_image
from memforensics.sources.proc.elf_dynsym import function_symbols, read_mapped_file
from memforensics.sources.proc.procmaps import read_smaps


def test_the_allocators_wrappers_count_as_inside_it_and_other_code_does_not() -> None:
    pid = os.getpid()
    path = next(m.path for m in read_smaps(pid) if m.path and "/libc.so" in m.path)
    libc = load_libc_image(pid, path)
    mapped = read_mapped_file(pid, path)
    wanted = frozenset({"sbrk", "brk", "mmap", "munmap", "madvise", "clock_gettime", "write"})
    found = function_symbols(mapped.data, mapped.base, path, wanted).defaults
    sizes = {
        name: size for start, size, name in function_symbols(mapped.data, mapped.base, path).symbols
    }
    for name in ("sbrk", "brk", "mmap", "munmap", "madvise"):
        start = found[name]
        # Its first and last instruction bytes, where a stop lands before or after the call.
        assert libc.in_allocator(start), name
        assert libc.in_allocator(start + sizes[name] - 1), name
    assert libc.in_allocator(libc.functions["malloc"])
    for name in ("clock_gettime", "write"):
        assert not libc.in_allocator(found[name]), name
