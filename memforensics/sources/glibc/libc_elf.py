"""The target's own libc, read from its ELF dynamic symbols: callable addresses, allocator range.

Read before attaching, so it costs the target no pause. The image must be the very file that
is mapped (checked by inode, or read through /proc/PID/map_files when it was replaced on disk):
calling addresses taken from another build would crash the target.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from memforensics.errors import NotGlibcMallocError, TargetError, TargetExitedError, ToolingError
from memforensics.sources.proc.procmaps import Mapping, read_maps

# Exported functions defined in glibc's malloc/malloc.c (which #includes arena.c, hooks.c and,
# since 2.34, morecore.c). Their neighbourhood in libc's .text is the allocator; see
# LibcImage.allocator_range for why the whole object file, static helpers included, is covered.
# Not malloc_get_state/malloc_set_state: compat stubs since 2.25 that no program calls, which
# glibc 2.31 places far from malloc.o in .text; counting them stretched the "allocator" over
# half of libc, sleep() and nanosleep() included, so no thread was ever at a safe point.
_ALLOCATOR_EXPORT_NAMES = """
    malloc free cfree realloc calloc memalign aligned_alloc valloc pvalloc posix_memalign
    malloc_trim malloc_usable_size mallinfo mallinfo2 malloc_stats mallopt malloc_info
    __libc_malloc __libc_free __libc_realloc __libc_calloc
    __libc_memalign __libc_valloc __libc_pvalloc __libc_mallinfo __libc_mallinfo2
    __libc_mallopt __posix_memalign __default_morecore __malloc_trim __malloc_stats
    __malloc_info __malloc_usable_size
"""
_ALLOCATOR_EXPORTS = frozenset(_ALLOCATOR_EXPORT_NAMES.split())
# Allocator entry points where a thread holds no allocator lock yet: the run-forward targets.
ENTRY_FUNCTIONS = ("malloc", "free", "calloc", "realloc")
# libc functions the session calls, resolved to addresses in the target's own libc.
# (usleep parks the calling thread while the others run and we read the XML: see gdb.py.)
_CALLED_FUNCTIONS = (
    "malloc",
    "free",
    "open_memstream",
    "fclose",
    "malloc_info",
    "malloc_trim",
    "usleep",
)
_RESOLVED_FUNCTIONS = frozenset(_CALLED_FUNCTIONS + ENTRY_FUNCTIONS)

_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_SHT_DYNSYM = 11
_SHT_GNU_VERSYM = 0x6FFFFFFF
_PT_LOAD = 1
_PF_X = 1
_RESTORE_RT = bytes.fromhex("48c7c00f0000000f05")  # __restore_rt: mov $0xf,%rax; syscall
_VERSYM_HIDDEN = 0x8000
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym
_FUNCTION_KINDS = frozenset((_STT_FUNC, _STT_GNU_IFUNC))


@dataclass(frozen=True)
class LibcImage:
    """Where the target's libc is mapped, its callable functions and its allocator's code."""

    path: str
    # libc's signal-return trampoline (the call without gdb returns through it; see
    # sources.proc.ptrace_call); None when not found exactly once.
    restore_rt: int | None
    functions: dict[str, int]  # name -> absolute address in the target (default versions)
    allocator_range: tuple[int, int]  # [start, end) absolute: malloc.o's code, conservatively
    function_starts: tuple[int, ...]  # sorted absolute starts of exported functions
    function_names: tuple[str, ...]  # names parallel to function_starts
    text_range: tuple[int, int] = (0, 0)  # [first exported function, end of the last one)
    # The file at ``path`` is no longer the mapped one: the mapped image, for gdb to read.
    replaced_on_disk: bool = False
    image: bytes | None = field(default=None, repr=False)

    def in_allocator(self, pc: int) -> bool:
        """True when ``pc`` lies in the allocator's code."""
        return self.allocator_range[0] <= pc < self.allocator_range[1]

    def in_text(self, pc: int) -> bool:
        """True when ``pc`` lies among libc's exported functions."""
        return self.text_range[0] <= pc < self.text_range[1]

    def describe(self, pc: int) -> str:
        """Nearest exported symbol at or below ``pc`` (for messages; statics are unnamed)."""
        index = bisect.bisect_right(self.function_starts, pc) - 1
        if index < 0:
            return f"{pc:#x}"
        return f"{self.function_names[index]}+{pc - self.function_starts[index]:#x}"


def _libc_mapping(pid: int, libc_path: str) -> Mapping:
    """The mapping of the libc file's offset 0 in PID (its load address and inode)."""
    mappings = read_maps(pid)
    if not mappings:  # only a process that is exiting (its memory already gone) maps nothing
        raise TargetExitedError(f"PID {pid} exited while being inspected", pid=pid)
    for mapping in mappings:
        if mapping.path == libc_path and mapping.offset_bytes == 0:
            return mapping
    raise NotGlibcMallocError(f"PID {pid} does not map {libc_path}", pid=pid)


def _read_mapped_file(pid: int, mapping: Mapping) -> bytes:
    """The very file behind ``mapping``, through /proc/PID/map_files (needs CAP_SYS_ADMIN).

    The kernel keeps a replaced or deleted file alive while it is mapped; map_files opens
    that inode, not whatever now sits at the path. The inode is checked all the same.
    """
    entry = f"/proc/{pid}/map_files/{mapping.start_address:x}-{mapping.end_address:x}"
    with open(entry, "rb") as handle:
        if os.fstat(handle.fileno()).st_ino != mapping.inode:
            raise OSError(0, "the mapped file's inode differs from the mapping's")
        return handle.read()


def load_libc_image(pid: int, libc_path: str) -> LibcImage:
    """Read the exported functions of the libc mapped into PID (before attaching: no pause).

    The file is read through /proc/PID/root, so a target in a container is served by its own
    libc, when its inode is still the mapping's. When libc was upgraded or deleted on disk
    since the process started (maps says "(deleted)"), the mapped image is read through
    /proc/PID/map_files instead; only when that cannot be read either is the target refused,
    because calling addresses taken from another build would crash it.
    """
    mapping = _libc_mapping(pid, libc_path)
    candidates = [Path(f"/proc/{pid}/root") / libc_path.lstrip("/"), Path(libc_path)]
    for candidate in candidates:
        with contextlib.suppress(OSError):
            if not mapping.deleted and candidate.stat().st_ino == mapping.inode:
                return _parse_libc(candidate.read_bytes(), mapping.start_address, libc_path)
    try:
        data = _read_mapped_file(pid, mapping)
    except OSError as exc:
        why = exc.strerror or str(exc)
        if isinstance(exc, PermissionError):
            why = "reading /proc/PID/map_files needs root (CAP_SYS_ADMIN)"
        raise TargetError(
            f"the libc mapped into PID {pid} ({libc_path}) was replaced or deleted on disk "
            f"since the process started, and the mapped image cannot be read: {why}",
            hint="run as root to read the mapped image, or restart the process; calling "
            "into a different libc would crash it",
            pid=pid,
        ) from exc
    return replace(
        _parse_libc(data, mapping.start_address, libc_path), image=data, replaced_on_disk=True
    )


def _restore_rt(data: bytes, loads: Sequence[tuple[int, int, int, int]], bias: int) -> int | None:
    """``__restore_rt``'s address in the target: its 9 bytes (``mov $15, %rax; syscall``:
    rt_sigreturn), found exactly once in an executable segment of the image; a static
    function, so no symbol names it. None unless found exactly once."""
    first = data.find(_RESTORE_RT)
    if first < 0 or data.find(_RESTORE_RT, first + 1) >= 0:
        return None
    for flags, offset, vaddr, filesz in loads:
        if flags & _PF_X and offset <= first < offset + filesz:
            return bias + vaddr + (first - offset)
    return None


def _parse_libc(data: bytes, base: int, path: str) -> LibcImage:
    """Parse ELF64 little-endian dynamic symbols; see load_libc_image."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ToolingError(f"{path} is not a 64-bit little-endian ELF file; unsupported")
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    loads = []  # (flags, offset, vaddr, filesz) of each PT_LOAD
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, phoff + i * phentsize
        )
        if p_type == _PT_LOAD:
            loads.append((p_flags, p_offset, p_vaddr, p_filesz))
    bias = base - (min(load[2] for load in loads) & ~0xFFF) if loads else base
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    dynsym = next((s for s in sections if s[1] == _SHT_DYNSYM), None)
    if dynsym is None:
        raise NotGlibcMallocError(f"{path} has no dynamic symbol table")
    versym = next((s for s in sections if s[1] == _SHT_GNU_VERSYM), None)
    strtab = sections[dynsym[6]]
    str_offset = strtab[4]
    # One pass over the table with struct.iter_unpack (libc has ~3,000 dynamic symbols: a
    # read of each field by unpack_from cost 6.5 ms, before the attach, of every inspect).
    table = memoryview(data)[dynsym[4] : dynsym[4] + dynsym[5] // 24 * 24]
    versions: Sequence[int] = ()
    if versym is not None:
        versions = memoryview(data)[versym[4] : versym[4] + dynsym[5] // 24 * 2].cast("H")
    symbols: list[tuple[int, int, str]] = []  # (start, size, name), all versions
    functions: dict[str, int] = {}
    name_end = data.index  # a name without its NUL is a broken file: ValueError, as before
    for i, (name_off, info, _other, shndx, value, size) in enumerate(_SYMBOL.iter_unpack(table)):
        kind = info & 0xF
        if kind not in _FUNCTION_KINDS or shndx == 0 or value == 0:
            continue
        begin = str_offset + name_off
        name = data[begin : name_end(b"\0", begin)].decode(errors="replace")
        start = value + bias
        symbols.append((start, size, name))
        # A hidden version is an old compat symbol, not the default one a caller links to.
        hidden = bool(versions[i] & _VERSYM_HIDDEN) if versions else False
        if name in _RESOLVED_FUNCTIONS and not hidden and kind == _STT_FUNC:
            functions[name] = start
    missing = sorted(name for name in _RESOLVED_FUNCTIONS if name not in functions)
    if missing:
        raise NotGlibcMallocError(f"{path} does not export {', '.join(missing)}: not glibc")
    symbols.sort()
    allocator = [(s, e) for s, e, n in symbols if n in _ALLOCATOR_EXPORTS]
    low = min(s for s, _ in allocator)
    high = max(s + size for s, size in allocator)
    # Widen to the neighbouring non-allocator exports: malloc.o's static functions
    # (_int_malloc, _int_free, sysmalloc, malloc_consolidate, arena_get2, tcache_init …) sit
    # between them in .text but have no exported symbol in a stripped libc. Anything unnamed
    # that is caught as well only makes us more careful, never less.
    before = [s + size for s, size, n in symbols if n not in _ALLOCATOR_EXPORTS and s < low]
    after = [s for s, _size, n in symbols if n not in _ALLOCATOR_EXPORTS and s >= high]
    range_start = max(before) if before else low
    range_end = min(after) if after else high
    starts: dict[int, str] = {}
    for start, _size, name in symbols:
        starts.setdefault(start, name)
    ordered = sorted(starts.items())
    return LibcImage(
        path=path,
        restore_rt=_restore_rt(data, loads, bias),
        functions=functions,
        allocator_range=(min(range_start, low), max(range_end, high)),
        function_starts=tuple(s for s, _ in ordered),
        function_names=tuple(n for _, n in ordered),
        text_range=(symbols[0][0], max(s + size for s, size, _n in symbols)),
    )
