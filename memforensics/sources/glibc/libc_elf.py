"""The target's own libc, read from its ELF dynamic symbols: callable addresses, allocator range.

Read before attaching, so it costs the target no pause. The image must be the very file that
is mapped (checked by inode, or read through /proc/PID/map_files when it was replaced on disk):
calling addresses taken from another build would crash the target. Its parse is kept under the
SHA-256 of those very bytes (files/digest_cache), relative to where it is mapped: the same
bytes give the same symbols, so a libc parsed once (in this process, or by an earlier run) is
not parsed again.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from memforensics.errors import NotGlibcMallocError
from memforensics.sources.census.symbols import dynamic_symbols
from memforensics.sources.files.digest_cache import DigestCache, digest_of
from memforensics.sources.proc.elf_dynsym import function_symbols, read_mapped_file

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
# The system-call wrappers the allocator calls to grow, shrink and trim its memory (sysmalloc
# and systrim through sbrk; mmapped chunks; heaps of thread arenas). A thread stopped inside
# one, before or after its system call, is as much inside the allocator as one in malloc.o:
# the arena is half changed (its top not yet moved to the new break), and a single-threaded
# process takes no lock to say so.
_ALLOCATOR_WRAPPERS = frozenset(
    {"__sbrk", "sbrk", "__brk", "brk", "__mmap", "mmap", "mmap64", "__munmap", "munmap"}
    | {"__mprotect", "mprotect", "__madvise", "madvise", "__mremap", "mremap"}
)
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
# Functions the self-restoring malloc_info (sources.glibc.called_malloc_info) calls besides
# those; not required of a libc (an old or odd one just cannot be read that way).
OPTIONAL_FUNCTIONS = ("mmap", "munmap", "fmemopen", "setvbuf")
# libc's list of open FILEs: the head is the stream opened last (fopencookie links it there).
_DATA_SYMBOLS = frozenset(("_IO_list_all",))

_PF_X = 1
_RESTORE_RT = bytes.fromhex("48c7c00f0000000f05")  # __restore_rt: mov $0xf,%rax; syscall
_POP3_RET = bytes.fromhex("5b5d415cc3")  # pop %rbx; pop %rbp; pop %r12; ret


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
    # Three pops and a return, in libc's code: how a call without gdb passes a 7th to 9th
    # argument on the stack (sources.proc.ptrace_call); None when not found.
    pop3_ret: int | None = None
    # The address of libc's ``_IO_list_all`` (the head of its open FILEs); None when absent.
    io_list_all: int | None = None
    # [start, end) of each system-call wrapper the allocator calls (_ALLOCATOR_WRAPPERS).
    wrapper_ranges: tuple[tuple[int, int], ...] = ()

    def in_allocator(self, pc: int) -> bool:
        """True when ``pc`` lies in the allocator's code, or in a system-call wrapper it
        calls (sbrk, mmap, munmap, mprotect, madvise, mremap; called by the program itself
        too: then this is only more careful)."""
        if self.allocator_range[0] <= pc < self.allocator_range[1]:
            return True
        return any(start <= pc < end for start, end in self.wrapper_ranges)

    def in_text(self, pc: int) -> bool:
        """True when ``pc`` lies among libc's exported functions."""
        return self.text_range[0] <= pc < self.text_range[1]

    def describe(self, pc: int) -> str:
        """Nearest exported symbol at or below ``pc`` (for messages; statics are unnamed)."""
        index = bisect.bisect_right(self.function_starts, pc) - 1
        if index < 0:
            return f"{pc:#x}"
        return f"{self.function_names[index]}+{pc - self.function_starts[index]:#x}"


def load_libc_image(pid: int, libc_path: str) -> LibcImage:
    """Read the exported functions of the libc mapped into PID (before attaching: no pause).

    The file is read through /proc/PID/root, so a target in a container is served by its own
    libc, when its inode is still the mapping's. When libc was upgraded or deleted on disk
    since the process started (maps says "(deleted)"), the mapped image is read through
    /proc/PID/map_files instead; only when that cannot be read either is the target refused,
    because calling addresses taken from another build would crash it.
    """
    mapped = read_mapped_file(pid, libc_path)
    image = parse_libc(mapped.data, mapped.base, libc_path)
    if mapped.replaced_on_disk:
        return replace(image, image=mapped.data, replaced_on_disk=True)
    return image


_PARSED = DigestCache("libc-image")
_ADDRESS_LIMIT = 1 << 63  # an address, relative to the mapping, is within this either way


def parse_libc(data: bytes, base: int, path: str) -> LibcImage:
    """_parse_libc's image of ``data`` mapped at ``base``, from the parse kept for these bytes
    where there is one that holds up (_from_document), else parsed now and kept."""
    digest = digest_of(data)
    document = _PARSED.get(digest)
    image = _from_document(document, base, path) if document is not None else None
    if image is None:
        image = _parse_libc(data, base, path)
        _PARSED.put(digest, _to_document(image, base))
    return image


def _to_document(image: LibcImage, base: int) -> dict[str, object]:
    """What _from_document makes ``image`` of again: its addresses relative to ``base``."""

    def relative(address: int | None) -> int | None:
        return None if address is None else address - base

    return {
        "restore_rt": relative(image.restore_rt),
        "pop3_ret": relative(image.pop3_ret),
        "io_list_all": relative(image.io_list_all),
        "functions": {name: address - base for name, address in image.functions.items()},
        "allocator_range": [address - base for address in image.allocator_range],
        "text_range": [address - base for address in image.text_range],
        "function_starts": [address - base for address in image.function_starts],
        "function_names": list(image.function_names),
        "wrapper_ranges": [[start - base, end - base] for start, end in image.wrapper_ranges],
    }


def _from_document(document: object, base: int, path: str) -> LibcImage | None:
    """The LibcImage a kept document describes, mapped at ``base``; None where it is not one
    _to_document wrote for a libc _parse_libc accepts (any field of the wrong kind, starts
    out of order, a required function missing): the caller parses again."""

    def address(value: object) -> bool:
        return type(value) is int and -_ADDRESS_LIMIT < value < _ADDRESS_LIMIT

    def pair(value: object) -> bool:
        return isinstance(value, list) and len(value) == 2 and all(address(v) for v in value)

    if not isinstance(document, dict) or set(document) != _DOCUMENT_KEYS:
        return None
    functions, starts, names = (
        document["functions"],
        document["function_starts"],
        document["function_names"],
    )
    wrappers = document["wrapper_ranges"]
    if not (
        all(v is None or address(v) for v in map(document.get, _OPTIONAL_ADDRESSES))
        and isinstance(functions, dict)
        and all(type(k) is str and address(v) for k, v in functions.items())
        and functions.keys() >= _RESOLVED_FUNCTIONS
        and isinstance(starts, list)
        and all(address(v) for v in starts)
        and all(a < b for a, b in itertools.pairwise(starts))
        and isinstance(names, list)
        and len(names) == len(starts)
        and all(type(name) is str for name in names)
        and pair(document["allocator_range"])
        and pair(document["text_range"])
        and isinstance(wrappers, list)
        and all(pair(w) for w in wrappers)
    ):
        return None

    def absolute(value: int | None) -> int | None:
        return None if value is None else value + base

    return LibcImage(
        path=path,
        restore_rt=absolute(document["restore_rt"]),
        pop3_ret=absolute(document["pop3_ret"]),
        io_list_all=absolute(document["io_list_all"]),
        functions={name: offset + base for name, offset in functions.items()},
        allocator_range=(
            document["allocator_range"][0] + base,
            document["allocator_range"][1] + base,
        ),
        text_range=(document["text_range"][0] + base, document["text_range"][1] + base),
        function_starts=tuple(offset + base for offset in starts),
        function_names=tuple(names),
        wrapper_ranges=tuple((start + base, end + base) for start, end in wrappers),
    )


_OPTIONAL_ADDRESSES = ("restore_rt", "pop3_ret", "io_list_all")
_DOCUMENT_KEYS = frozenset(_OPTIONAL_ADDRESSES).union(
    ("functions", "allocator_range", "text_range", "function_starts", "function_names"),
    ("wrapper_ranges",),
)


def _in_code(found: int, loads: Sequence[tuple[int, int, int, int]], bias: int) -> int | None:
    """The address of file offset ``found`` when an executable segment maps it, else None."""
    for flags, offset, vaddr, filesz in loads:
        if flags & _PF_X and offset <= found < offset + filesz:
            return bias + vaddr + (found - offset)
    return None


def _restore_rt(data: bytes, loads: Sequence[tuple[int, int, int, int]], bias: int) -> int | None:
    """``__restore_rt``'s address in the target: its 9 bytes (``mov $15, %rax; syscall``:
    rt_sigreturn), found exactly once in an executable segment of the image; a static
    function, so no symbol names it. None unless found exactly once."""
    first = data.find(_RESTORE_RT)
    if first < 0 or data.find(_RESTORE_RT, first + 1) >= 0:
        return None
    return _in_code(first, loads, bias)


def _pop3_ret(data: bytes, loads: Sequence[tuple[int, int, int, int]], bias: int) -> int | None:
    """The first ``pop %rbx; pop %rbp; pop %r12; ret`` in an executable segment (a
    function's epilogue; decoded from its first byte it is these four instructions,
    wherever it sits among the original ones)."""
    found = data.find(_POP3_RET)
    while found >= 0:
        address = _in_code(found, loads, bias)
        if address is not None:
            return address
        found = data.find(_POP3_RET, found + 1)
    return None


def _parse_libc(data: bytes, base: int, path: str) -> LibcImage:
    """Parse ELF64 little-endian dynamic symbols; see load_libc_image."""
    found = function_symbols(data, base, path, _RESOLVED_FUNCTIONS | frozenset(OPTIONAL_FUNCTIONS))
    symbols = list(found.symbols)
    functions = found.defaults
    missing = sorted(name for name in _RESOLVED_FUNCTIONS if name not in functions)
    if missing:
        raise NotGlibcMallocError(f"{path} does not export {', '.join(missing)}: not glibc")
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
        restore_rt=_restore_rt(data, found.loads, found.bias),
        pop3_ret=_pop3_ret(data, found.loads, found.bias),
        functions=functions,
        allocator_range=(min(range_start, low), max(range_end, high)),
        function_starts=tuple(s for s, _ in ordered),
        function_names=tuple(n for _, n in ordered),
        text_range=(symbols[0][0], max(s + size for s, size, _n in symbols)),
        wrapper_ranges=tuple(
            sorted({(s, s + size) for s, size, n in symbols if n in _ALLOCATOR_WRAPPERS and size})
        ),
        io_list_all=dynamic_symbols(data, base, _DATA_SYMBOLS).get("_IO_list_all"),
    )
