"""malloc_info(0, ...) called in the target with no gdb, through the self-restoring call of
sources.proc.ptrace_call, its document written into memory that is on no thread's stack.

One series of calls on one held thread, every other thread held until malloc_info starts
and then let go (sources.proc.ptrace_probe.call_chain), each call returning into libc's
``__restore_rt``:

1. ``mmap(region, REGION_BYTES, PROT_READ|PROT_WRITE,
   MAP_PRIVATE|MAP_ANONYMOUS|MAP_NORESERVE|MAP_FIXED_NOREPLACE, -1, 0)``, ``region`` chosen
   in a gap of /proc/PID/maps (the top of a gap below the lowest mapping above it, never
   next to the main [stack], nor within a GiB above the brk [heap]: where the kernel's next
   mmap would go); the new mapping is then looked for in /proc/PID/maps, since a call's
   return value is not kept. A kernel before 4.17 ignores MAP_FIXED_NOREPLACE (the address
   would be a hint only, a mapping elsewhere could not be found): refused before any call.
2. ``fmemopen(region, REGION_BYTES, "w")``: a stream that writes straight into the region
   (open_memstream's FILE could not be found: glibc does not link a memory stream into
   ``_IO_list_all``, while fopencookie, under fmemopen, does, at its head). The FILE is the
   new head of libc's ``_IO_list_all`` (read before and after the call; every other thread
   is held, so nothing else opens one meanwhile), checked to be the stream on the region:
   glibc's magic in its ``_flags``, its cookie's buffer the region, its size REGION_BYTES.
3. ``setvbuf(fp, NULL, _IONBF, 0)`` (unbuffered: no stdio buffer is allocated, whose 8 KiB
   request would consolidate the caller's arena's fastbins), ``malloc_info(0, fp)`` (each
   piece of the document written straight into the region, NUL terminated when it fits),
   ``fclose(fp)`` (which frees the FILE and its cookie); the
   document is read from the region (refused when it filled it), then ``munmap(region,
   REGION_BYTES)``, and /proc/PID/maps is checked to have lost it.

A SIGKILL of our whole side at any moment leaves the target alive and running: the thread
is untouched, or calling and then restored by itself; at worst what it leaks is the region
(REGION_BYTES of address space, MAP_NORESERVE: only its touched pages, up to the document's
size, take memory) and an fmemopen FILE with its cookie (a
few hundred bytes of heap). A FILE that could not be recognised keeps the region mapped (it
might write into it), and says so. The calls allocate two small chunks (the FILE, ~500
bytes, and its cookie) in the calling thread's arena, before malloc_info reads it: that
arena's bins may differ from a dump the target took itself by those two chunks (gdb's call
also allocates a stdio buffer, whose request consolidates the fastbins); every other
arena's do not.
"""

from __future__ import annotations

import itertools
import os
import struct
from collections.abc import Generator

from memforensics.errors import TargetError
from memforensics.sources.glibc.libc_elf import LibcImage
from memforensics.sources.proc.procmaps import Mapping, read_maps
from memforensics.sources.proc.procmem import ProcessMemoryReader
from memforensics.sources.proc.ptrace_call import ScratchRef
from memforensics.sources.proc.ptrace_probe import ProbeCall

PAGE_BYTES = 4096
REGION_BYTES = 64 << 20  # the document's bound: one that fills it is refused
_PROT_READ_WRITE = 0x1 | 0x2
_MAP_FLAGS = 0x02 | 0x20 | 0x4000 | 0x100000  # PRIVATE, ANONYMOUS, NORESERVE, FIXED_NOREPLACE
_MARGIN_BYTES = 1 << 20  # left free on each side of the region
_HEAP_ROOM_BYTES = 1 << 30  # left free above the brk heap, for it to grow
_USER_TOP = (1 << 47) - PAGE_BYTES  # x86-64's 4-level user address space
_LOWEST = 1 << 32
_IO_MAGIC, _IO_MAGIC_MASK = 0xFBAD0000, 0xFFFF0000
_COOKIE_OFFSET = 216 + 8  # struct _IO_cookie_file: struct _IO_FILE_plus, then __cookie
_COOKIE = struct.Struct("<QBB6xQ")  # fmemopen_cookie_t: buffer, mybuffer, append (bools), size
_READ_FIRST_BYTES = 64 << 10
_IONBF = 2
_NEEDED = ("mmap", "munmap", "fmemopen", "setvbuf", "malloc_info", "fclose")


def kernel_refusal(release: str | None = None) -> str | None:
    """Why this kernel cannot make the region's mapping safely (MAP_FIXED_NOREPLACE is
    4.17's); None when it can."""
    text = release if release is not None else os.uname().release
    parts = text.split(".")
    try:
        version = (int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0))
    except (IndexError, ValueError):
        return f"kernel {text}: its version is not understood"
    if version < (4, 17):
        return f"kernel {text} has no MAP_FIXED_NOREPLACE (4.17)"
    return None


def libc_refusal(libc: LibcImage) -> str | None:
    """What ``libc`` lacks for the call (see the module); None when it has it all."""
    missing = [name for name in _NEEDED if name not in libc.functions]
    if libc.restore_rt is None:
        missing.append("__restore_rt")
    if libc.io_list_all is None:
        missing.append("_IO_list_all")
    if missing:
        return f"{libc.path} has no {', '.join(missing)}"
    return None


def choose_region(mappings: list[Mapping], size: int = REGION_BYTES) -> int | None:
    """Where ``size`` bytes can be mapped (see the module): the highest fitting start, below
    the main stack, with _MARGIN_BYTES free around it; None when no gap fits."""
    spans = sorted(mappings, key=lambda m: m.start_address)
    stack = next((m.start_address for m in spans if m.path == "[stack]"), _USER_TOP)
    best: int | None = None
    for low, high in itertools.pairwise(spans):
        if high.path == "[stack]" or high.start_address > stack:
            continue
        floor = low.end_address + (_HEAP_ROOM_BYTES if low.path == "[heap]" else _MARGIN_BYTES)
        start = (min(high.start_address, _USER_TOP) - _MARGIN_BYTES - size) & ~(PAGE_BYTES - 1)
        if start >= max(floor, _LOWEST) and (best is None or start > best):
            best = start
    return best


def region_mapped(pid: int, region: int, size: int = REGION_BYTES) -> bool:
    """/proc/PID/maps has [region, region + size) as one private anonymous read-write
    mapping (ours: the address was in a gap, checked while every thread was held)."""
    return any(
        m.start_address == region
        and m.end_address == region + size
        and m.perms.startswith("rw-p")
        and m.inode == 0
        for m in read_maps(pid)
    )


def region_overlapped(pid: int, region: int, size: int = REGION_BYTES) -> bool:
    """Anything is mapped in [region, region + size)."""
    return any(m.start_address < region + size and region < m.end_address for m in read_maps(pid))


def _word(mem: ProcessMemoryReader, address: int) -> int | None:
    data = mem.read(address, 8)
    return int.from_bytes(data, "little") if data is not None else None


def _is_our_stream(mem: ProcessMemoryReader, fp: int, region: int) -> bool:
    """``fp`` is a FILE (glibc's magic) whose fmemopen cookie writes into the region."""
    head = mem.read(fp, 4)
    if head is None or int.from_bytes(head, "little") & _IO_MAGIC_MASK != _IO_MAGIC:
        return False
    cookie = _word(mem, fp + _COOKIE_OFFSET)
    data = mem.read(cookie, _COOKIE.size) if cookie else None
    if data is None:
        return False
    buffer, mybuffer, _append, size = _COOKIE.unpack(data)
    return bool(buffer == region and mybuffer == 0 and size == REGION_BYTES)


def read_document(mem: ProcessMemoryReader, region: int) -> bytes:
    """The NUL-terminated document at ``region``, read in growing pieces (a few KiB per
    arena: the first piece holds most; pages it never reached read as zeros). TargetError
    when it fills the region."""
    pid = mem.pid
    parts: list[bytes] = []
    offset, piece = 0, _READ_FIRST_BYTES
    while offset < REGION_BYTES:
        data = mem.read_present(region + offset, min(piece, REGION_BYTES - offset))
        end = data.find(b"\0")
        if end >= 0:
            if offset + end >= REGION_BYTES - 1:
                break
            return b"".join([*parts, data[:end]])
        parts.append(data)
        offset += len(data)
        piece *= 2
    raise TargetError(
        f"PID {pid}: malloc_info's document is larger than {REGION_BYTES >> 20} MiB; refused",
        pid=pid,
    )


class MallocInfoChain:
    """The series of calls of the module, for ptrace_probe.call_chain (``calls``); after it,
    ``region`` says where the region was (for the report of what a failure left)."""

    def __init__(self, pid: int, libc: LibcImage) -> None:
        self.pid = pid
        self._functions = libc.functions
        self._io_list_all = libc.io_list_all or 0
        self.region: int | None = None
        self.leaked: list[str] = []  # what a failure part-way left in the target

    def calls(self) -> Generator[ProbeCall, bytes, bytes]:
        with ProcessMemoryReader(self.pid) as mem:
            return (yield from self._calls(mem))

    def _calls(self, mem: ProcessMemoryReader) -> Generator[ProbeCall, bytes, bytes]:
        pid, fn = self.pid, self._functions
        region = choose_region(read_maps(pid))
        if region is None:
            raise TargetError(f"PID {pid} has no gap in its address space for the call", pid=pid)
        self.region = region
        self.leaked = [f"a {REGION_BYTES >> 20} MiB mapping at {region:#x}"]
        yield ProbeCall(
            fn["mmap"], (region, REGION_BYTES, _PROT_READ_WRITE, _MAP_FLAGS, -1, 0), b""
        )
        if not region_mapped(pid, region):
            self.leaked = []
            if region_overlapped(pid, region):  # not the mapping asked for: leave it be
                raise TargetError(f"PID {pid}: the region at {region:#x} is not ours", pid=pid)
            raise TargetError(f"PID {pid}: mmap made no mapping for the call", pid=pid)
        failure: TargetError | None = None
        keep_region = False
        document = b""
        try:
            before = _word(mem, self._io_list_all)
            if before is None:
                raise TargetError(f"PID {pid}: libc's _IO_list_all could not be read", pid=pid)
            self.leaked.append("an fmemopen FILE on it")
            yield ProbeCall(fn["fmemopen"], (region, REGION_BYTES, ScratchRef(0)), b"w\0")
            fp = _word(mem, self._io_list_all)
            if fp == before:
                self.leaked.pop()
                raise TargetError(f"PID {pid}: fmemopen opened no stream", pid=pid)
            if fp is None or not _is_our_stream(mem, fp, region):
                keep_region = True  # a FILE we do not know may point into it
                raise TargetError(
                    f"PID {pid}: the newest FILE is not recognised as the stream on our "
                    f"region; it and the region at {region:#x} are left as they are",
                    pid=pid,
                )
            yield ProbeCall(fn["setvbuf"], (fp, 0, _IONBF, 0), b"")
            # The long call: the other threads run meanwhile (malloc_info takes each arena's
            # lock; a walk of millions of chunks need not stop the whole process). Nothing
            # after it needs them held: fclose and munmap act on what only we know of.
            yield ProbeCall(fn["malloc_info"], (0, fp), b"", others_run=True)
            yield ProbeCall(fn["fclose"], (fp,), b"")
            self.leaked.pop()
            document = read_document(mem, region)
        except TargetError as exc:
            failure = exc
        if not keep_region:
            yield ProbeCall(fn["munmap"], (region, REGION_BYTES), b"")
            # Our mapping, exactly, is what must be gone: the other threads run by now, and
            # one of them may map something of its own into the gap the moment it is free.
            if region_mapped(pid, region):
                raise TargetError(
                    f"PID {pid}: munmap left the region at {region:#x} mapped", pid=pid
                )
            self.leaked = []
        if failure is not None:
            raise failure
        return document
