"""A dead process's mappings as /proc/PID/maps listed them, as far as its core can tell,
rebuilt from the core's PT_LOAD segments and its NT_FILE note.

What a core cannot tell, and what is put in its place:
- private or shared: not recorded, so every mapping is 'p';
- inodes: not recorded; a file-backed mapping gets FILE_INODE_UNKNOWN (-1: not 0, which
  means anonymous, and never equal to a real inode, so nothing mistakes a file on disk today
  for the one that was mapped); anonymous ones get 0, as in maps;
- names of special mappings: [vdso] (the auxv's AT_SYSINFO_EHDR), [stack] (the mapping that
  holds the auxv's AT_EXECFN string, else the main thread's stack pointer) and [vsyscall]
  (its fixed x86-64 address) are named; [heap] is not, because nothing in a core marks it
  (``heap_range_hint`` guesses it), nor are the kernel's [vvar] pages (which only the kernel
  writes, read-only): both look like anonymous memory, as Mapping.anonymous sees it.
- permissions: from p_flags. gdb's gcore sets PF_R on every segment it writes (a PROT_NONE
  reserve of a malloc arena shows as 'r--p'); the kernel writes the real protection.
"""

from __future__ import annotations

import itertools
import os
import re
from collections.abc import Callable, Sequence

from memforensics.sources.core.corememory import CoreSegment
from memforensics.sources.core.corenotes import MappedFile
from memforensics.sources.core.elf64 import PF_R, PF_W, PF_X
from memforensics.sources.proc.procmaps import Mapping

FILE_INODE_UNKNOWN = -1
VSYSCALL_ADDRESS = 0xFFFFFFFFFF600000  # x86-64's legacy vsyscall page, always here
# The kernel puts the start of brk at a random page within this distance above the end of
# the executable's bss (1 GiB on current x86-64 kernels, 32 MiB on older ones).
BRK_RANDOM_RANGE_BYTES = 1 << 30
# Where x86-64 puts brk when the program run is the dynamic loader itself (``ld.so PROGRAM``,
# as a program is run on another glibc): at ELF_ET_DYN_BASE (2/3 of the 47-bit address space,
# fs/binfmt_elf.c), randomised as above, away from the loader mapped at the mmap base.
LOADER_BRK_BASE = 0x7FFFFFFFF000 // 3 * 2
_LOADER_NAME = re.compile(r"ld-(linux[\w.-]*\.so(\.\d+)*|\d+\.\d+\.so)$")  # or ld-2.NN.so


def perms_text(flags: int) -> str:
    """'rwxp'-style permissions of p_flags (always 'p': a core does not say 's')."""
    return (
        ("r" if flags & PF_R else "-")
        + ("w" if flags & PF_W else "-")
        + ("x" if flags & PF_X else "-")
        + "p"
    )


def core_mappings(
    segments: Sequence[CoreSegment],
    files: Sequence[MappedFile],
    *,
    names: Sequence[tuple[int, str]],
    file_perms: Callable[[MappedFile, int], str],
) -> list[Mapping]:
    """One Mapping per PT_LOAD, cut where NT_FILE entries begin or end inside it, plus one
    per stretch of an NT_FILE entry that no PT_LOAD covers (gdb's gcore writes no segment
    for a file mapping it does not dump, the kernel writes an empty one).

    ``segments`` and ``files`` are sorted by address, each without overlaps. ``names``:
    (an address, a name) for special anonymous mappings, given to the one holding the
    address. ``file_perms(entry, address)``: permissions of file-backed memory no PT_LOAD
    covers.
    """
    points = sorted(
        {s.start_address for s in segments}
        | {s.end_address for s in segments}
        | {f.start_address for f in files}
        | {f.end_address for f in files}
    )
    mappings: list[Mapping] = []
    segment_index = file_index = 0
    for low, high in itertools.pairwise(points):
        while segment_index < len(segments) and segments[segment_index].end_address <= low:
            segment_index += 1
        while file_index < len(files) and files[file_index].end_address <= low:
            file_index += 1
        segment = None
        if segment_index < len(segments) and segments[segment_index].start_address <= low:
            segment = segments[segment_index]
        entry = None
        if file_index < len(files) and files[file_index].start_address <= low:
            entry = files[file_index]
        if entry is not None:
            mappings.append(
                Mapping(
                    start_address=low,
                    end_address=high,
                    perms=perms_text(segment.flags) if segment else file_perms(entry, low),
                    offset_bytes=entry.offset_bytes + low - entry.start_address,
                    inode=FILE_INODE_UNKNOWN,
                    path=entry.path,
                    deleted=entry.deleted,
                )
            )
        elif segment is not None:
            name = next((n for at, n in names if low <= at < high), "")
            mappings.append(Mapping(low, high, perms_text(segment.flags), 0, 0, name))
    return mappings


def heap_range_hint(mappings: Sequence[Mapping], executable: str | None) -> tuple[int, int] | None:
    """[start, end) of the mapping that most likely was [heap]: the first anonymous writable
    mapping above the executable's end (and above its bss, the anonymous mapping right after
    it), with a gap between, within the kernel's brk randomisation range.

    Where the executable is the dynamic loader (``ld.so PROGRAM``: the kernel ran the loader,
    which mapped the program), the kernel put brk at LOADER_BRK_BASE instead: the first such
    mapping within the randomisation range above it.

    A guess, not a fact: None without a known executable or such a mapping. It misses the
    heap of a process run without address randomisation (its heap follows the bss with no
    gap, and the two may be one mapping), and the heap of a static executable that has none.
    """
    if not executable:
        return None
    ends = [m.end_address for m in mappings if m.path == executable]
    if not ends:
        return None
    if _LOADER_NAME.match(os.path.basename(executable)) and max(ends) > LOADER_BRK_BASE:
        return _first_anonymous_above(mappings, LOADER_BRK_BASE)
    return _first_anonymous_above(mappings, max(ends))


def _first_anonymous_above(mappings: Sequence[Mapping], above: int) -> tuple[int, int] | None:
    """heap_range_hint's search from ``above`` (the end of the executable, or the loader's
    brk base): the bss right there skipped, the next anonymous writable mapping taken when
    it starts within BRK_RANDOM_RANGE_BYTES, else None."""
    for mapping in mappings:
        if mapping.start_address < above:
            continue
        anonymous_rw = not mapping.path and mapping.perms.startswith("rw")
        if mapping.start_address == above and anonymous_rw:
            above = mapping.end_address  # the bss: anonymous memory right after the file
        elif anonymous_rw and mapping.start_address - above < BRK_RANDOM_RANGE_BYTES:
            return mapping.start_address, mapping.end_address
        else:
            return None
    return None
