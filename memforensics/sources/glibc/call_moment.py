"""When a call into glibc's allocator may be made without gdb (through the self-restoring
frame of sources.proc.ptrace_call): on what machine and process at all, and at which moment
of a hold. Shared by the direct malloc_trim (entry.trimmers.direct) and the malloc_info call
that stands in for a refused read (entry.readers.call); the gdb path (sources.gdb.gdb) asks
the same of the arenas' mutexes before its calls."""

from __future__ import annotations

import os

from memforensics.errors import MemforensicsError, NoSuchProcessError
from memforensics.sources.glibc.arena_hold import in_allocator
from memforensics.sources.glibc.heapmaps import arena_addresses
from memforensics.sources.glibc.libc_elf import LibcImage
from memforensics.sources.proc.procmem import ProcessMemoryReader
from memforensics.sources.proc.ptrace_call import shadow_stack_enabled
from memforensics.sources.proc.ptrace_hold import ThreadHold


def direct_unavailable(pid: int) -> str | None:
    """Why the allocator cannot be called without gdb in ``pid``; None when it can."""
    if os.uname().machine != "x86_64":
        return "calls without gdb are made on x86-64 only"
    if shadow_stack_enabled(pid):
        return "the process runs with a shadow stack (CET)"
    return None


def arena_mutexes(pid: int, libc_path: str) -> list[int]:
    """Each arena's address (its mutex is its first word), from a quick look at the heap
    (heapmaps.arena_addresses); none when that fails (the moment then rests on the threads'
    program counters)."""
    try:
        return arena_addresses(pid, libc_path)
    except NoSuchProcessError:
        raise
    except (MemforensicsError, OSError):
        return []


def unsafe_moment(
    hold: ThreadHold, libc: LibcImage, mutexes: list[int], mem: ProcessMemoryReader
) -> bool:
    """A thread of ``hold`` is inside the allocator (its code, or a system call it makes), or
    an arena's mutex (at each of ``mutexes``) is held: no call now."""
    counters = hold.program_counters
    if any(tid not in counters or in_allocator(libc, *counters[tid]) for tid in hold.thread_ids):
        return True
    for address in mutexes:
        word = mem.read(address, 4)
        if word is None or int.from_bytes(word, "little"):
            return True
    return False
