"""A gdb/MI session on a live process: attach, reach a safe point, call into libc, always detach.

The rules this module enforces are those of DESIGN.md, "Touching a live process"; docs/inspect.md
explains the reasoning. In short: the thread that makes a call must not be inside glibc's
allocator (otherwise malloc is re-entered: heap corruption on a single-threaded target, a
deadlock on a multi-threaded one); if no thread is outside it, the target runs forward to an
allocator entry point (no lock held yet) within the deadline; every call is cast, bounded in time
and its result checked before use; the target is detached whatever happens and never left stopped.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from memforensics.errors import (
    DeadlineError,
    MemforensicsError,
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetError,
    ToolingError,
)
from memforensics.sources import procfs
from memforensics.sources.gdbmi import MiError, MiGdbExited, MiResult, MiTimeout, MiTransport

GDB_INSTALL_HINT = (
    "install gdb (Debian/Ubuntu: apt-get install gdb; Fedora/RHEL: dnf install gdb) "
    "or point --gdb at one"
)
# malloc_info of a process with thousands of arenas stays far below this; more is not XML we want.
MAX_XML_BYTES = 64 * 1024 * 1024
# How long cleanup may wait for gdb to abandon a call or stop a running target.
_CLEANUP_SECONDS = 3.0
# Deepest stack we look at; a thread deeper than this is treated as possibly in the allocator.
_MAX_FRAMES = 256

# Exported functions defined in glibc's malloc/malloc.c (which #includes arena.c, hooks.c and,
# since 2.34, morecore.c). Their neighbourhood in libc's .text is the allocator; see
# LibcImage.allocator_range for why the whole object file, static helpers included, is covered.
_ALLOCATOR_EXPORT_NAMES = """
    malloc free cfree realloc calloc memalign aligned_alloc valloc pvalloc posix_memalign
    malloc_trim malloc_usable_size mallinfo mallinfo2 malloc_stats mallopt malloc_info
    malloc_get_state malloc_set_state __libc_malloc __libc_free __libc_realloc __libc_calloc
    __libc_memalign __libc_valloc __libc_pvalloc __libc_mallinfo __libc_mallinfo2
    __libc_mallopt __posix_memalign __default_morecore __malloc_trim __malloc_stats
    __malloc_info __malloc_usable_size
"""
_ALLOCATOR_EXPORTS = frozenset(_ALLOCATOR_EXPORT_NAMES.split())
# Allocator entry points where a thread holds no allocator lock yet: the run-forward targets.
_ENTRY_FUNCTIONS = ("malloc", "free", "calloc", "realloc")
# libc functions the session calls, resolved to addresses in the target's own libc.
_CALLED_FUNCTIONS = ("malloc", "free", "open_memstream", "fclose", "malloc_info", "malloc_trim")
_RESOLVED_FUNCTIONS = frozenset(_CALLED_FUNCTIONS + _ENTRY_FUNCTIONS)

_STT_FUNC = 2
_STT_GNU_IFUNC = 10
_SHT_DYNSYM = 11
_SHT_GNU_VERSYM = 0x6FFFFFFF
_PT_LOAD = 1
_VERSYM_HIDDEN = 0x8000


# --- libc's exported symbols -------------------------------------------------------------


@dataclass(frozen=True)
class LibcImage:
    """Where the target's libc is mapped, its callable functions and its allocator's code."""

    path: str
    functions: dict[str, int]  # name -> absolute address in the target (default versions)
    allocator_range: tuple[int, int]  # [start, end) absolute: malloc.o's code, conservatively
    function_starts: tuple[int, ...]  # sorted absolute starts of exported functions
    function_names: tuple[str, ...]  # names parallel to function_starts

    def in_allocator(self, pc: int) -> bool:
        """True when ``pc`` lies in the allocator's code."""
        return self.allocator_range[0] <= pc < self.allocator_range[1]

    def describe(self, pc: int) -> str:
        """Nearest exported symbol at or below ``pc`` (for messages; statics are unnamed)."""
        index = bisect.bisect_right(self.function_starts, pc) - 1
        if index < 0:
            return f"{pc:#x}"
        return f"{self.function_names[index]}+{pc - self.function_starts[index]:#x}"


def _libc_mapping(pid: int, libc_path: str) -> tuple[int, int, bool]:
    """(load address of the file's offset 0, inode, deleted?) from /proc/PID/maps."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise NoSuchProcessError(f"PID {pid} exited") from exc
    for line in maps.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5]
        deleted = path.endswith(" (deleted)")
        if path.removesuffix(" (deleted)") != libc_path or int(parts[2], 16) != 0:
            continue
        return int(parts[0].split("-")[0], 16), int(parts[4]), deleted
    raise NotGlibcMallocError(f"PID {pid} does not map {libc_path}")


def load_libc_image(pid: int, libc_path: str) -> LibcImage:
    """Read the exported functions of the libc mapped into PID (before attaching: no pause).

    The file is read through /proc/PID/root, so a target in a container is served by its own
    libc; an inode that differs from the mapping's (libc upgraded under a running process)
    is refused, because calling addresses from the wrong file would crash the target.
    """
    base, inode, deleted = _libc_mapping(pid, libc_path)
    candidates = [Path(f"/proc/{pid}/root") / libc_path.lstrip("/"), Path(libc_path)]
    data: bytes | None = None
    for candidate in candidates:
        with contextlib.suppress(OSError):
            if not deleted and candidate.stat().st_ino == inode:
                data = candidate.read_bytes()
                break
    if data is None:
        raise TargetError(
            f"the libc mapped into PID {pid} ({libc_path}) is no longer on disk as mapped "
            "(upgraded or deleted since the process started)",
            hint="restart the process to inspect it; calling into a different libc is unsafe",
        )
    return _parse_libc(data, base, libc_path)


def _parse_libc(data: bytes, base: int, path: str) -> LibcImage:
    """Parse ELF64 little-endian dynamic symbols; see load_libc_image."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ToolingError(f"{path} is not a 64-bit little-endian ELF file; unsupported")
    phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", data, 0x36)
    load_vaddrs = []
    for i in range(phnum):
        p_type, _flags, _offset, p_vaddr = struct.unpack_from("<IIQQ", data, phoff + i * phentsize)
        if p_type == _PT_LOAD:
            load_vaddrs.append(p_vaddr)
    bias = base - (min(load_vaddrs) & ~0xFFF) if load_vaddrs else base
    sections = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)
    ]
    dynsym = next((s for s in sections if s[1] == _SHT_DYNSYM), None)
    if dynsym is None:
        raise NotGlibcMallocError(f"{path} has no dynamic symbol table")
    versym = next((s for s in sections if s[1] == _SHT_GNU_VERSYM), None)
    strtab = sections[dynsym[6]]
    str_offset = strtab[4]
    count = dynsym[5] // 24
    symbols: list[tuple[int, int, str]] = []  # (start, size, name), all versions
    functions: dict[str, int] = {}
    for i in range(count):
        name_off, info, _other, shndx, value, size = struct.unpack_from(
            "<IBBHQQ", data, dynsym[4] + i * 24
        )
        if info & 0xF not in (_STT_FUNC, _STT_GNU_IFUNC) or shndx == 0 or value == 0:
            continue
        end = data.index(b"\0", str_offset + name_off)
        name = data[str_offset + name_off : end].decode(errors="replace")
        start = value + bias
        symbols.append((start, size, name))
        hidden = False
        if versym is not None:
            (version,) = struct.unpack_from("<H", data, versym[4] + i * 2)
            hidden = bool(version & _VERSYM_HIDDEN)  # an old compat version, not the default
        if name in _RESOLVED_FUNCTIONS and not hidden and info & 0xF == _STT_FUNC:
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
        functions=functions,
        allocator_range=(min(range_start, low), max(range_end, high)),
        function_starts=tuple(s for s, _ in ordered),
        function_names=tuple(n for _, n in ordered),
    )


# --- the watchdog that outlives us ------------------------------------------------------

# Runs as `python -I -S -c` in its own session. It waits for EOF on stdin: "done" first means a
# clean finish. Anything else means memforensics died (SIGKILL, OOM kill) with gdb possibly
# attached: kill gdb so the kernel detaches ptrace, then SIGCONT the target if it was running
# before and is left in group-stop by a SIGSTOP that gdb had queued.
_WATCHDOG_CODE = r"""
import os, signal, sys, time
target, gdb, was_running = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
seen = b""
while True:
    try:
        chunk = os.read(0, 64)
    except InterruptedError:
        continue
    except OSError:
        break
    if not chunk:
        break
    seen += chunk
if b"done" in seen:
    sys.exit(0)
try:
    os.killpg(gdb, signal.SIGKILL)
except OSError:
    pass
def status():
    try:
        with open("/proc/%d/status" % target) as handle:
            text = handle.read()
    except OSError:
        return None, None
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return fields.get("State", "?").strip()[:1], int(fields.get("TracerPid", "0").strip() or 0)
deadline = time.monotonic() + 5.0
calm_since = None
while time.monotonic() < deadline:
    state, tracer = status()
    if state is None:
        break
    if tracer == 0 and was_running and state == "T":
        os.kill(target, signal.SIGCONT)
        calm_since = None
    elif tracer == 0:
        calm_since = calm_since or time.monotonic()
        if time.monotonic() - calm_since > 0.5:
            break
    time.sleep(0.02)
"""


class _Watchdog:
    """A tiny process that leaves the target running if memforensics is killed mid-way."""

    def __init__(self, target_pid: int, gdb_pid: int, *, was_running: bool) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        with contextlib.suppress(OSError):
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _WATCHDOG_CODE,
                    str(target_pid),
                    str(gdb_pid),
                    "1" if was_running else "0",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,  # neither the terminal's Ctrl-C nor our death kills it
                close_fds=True,
            )

    def dismiss(self) -> None:
        """Tell the watchdog we finished cleanly; it exits without touching anything."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.write(b"done\n")
            proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=2.0)
        self._proc = None


# --- signals ------------------------------------------------------------------------------


class TerminatedError(KeyboardInterrupt):
    """SIGTERM or SIGHUP arrived during a session; raised so that cleanup runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"terminated by {signal.Signals(signum).name}")
        self.signum = signum
        self.exit_status = 128 + signum  # the shell's convention for death by a signal


_SHIELDED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise TerminatedError(signum)


@contextlib.contextmanager
def _deferred_signals() -> Iterator[None]:
    """Hold Ctrl-C/SIGTERM while cleaning up; they are delivered (and raise) afterwards."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _SHIELDED_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# --- the session ----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Frame:
    pc: int
    name: str


@dataclass(frozen=True)
class Capture:
    """One malloc_info document taken from a live process."""

    xml: bytes
    pause_seconds: float
    safe_point: str


def _mi_quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _find_gdb(gdb_path: str | None) -> str:
    if gdb_path is not None:
        if os.sep in gdb_path:
            if os.path.isfile(gdb_path) and os.access(gdb_path, os.X_OK):
                return gdb_path
            raise ToolingError(
                f"gdb not found or not executable at {gdb_path}", hint=GDB_INSTALL_HINT
            )
        found = shutil.which(gdb_path)
        if found is None:
            raise ToolingError(f"{gdb_path} not found on PATH", hint=GDB_INSTALL_HINT)
        return found
    found = shutil.which("gdb")
    if found is None:
        raise ToolingError("gdb is not installed (not found on PATH)", hint=GDB_INSTALL_HINT)
    return found


class GdbSession:
    """Attach to PID under gdb/MI, reach a safe point, make calls, always detach."""

    def __init__(
        self,
        pid: int,
        *,
        timeout_seconds: float = 10.0,
        gdb_path: str | None = None,
        log: Callable[[str], None] | None = None,
        allow_stopped: bool = False,
    ) -> None:
        self.pid = pid
        self.timeout_seconds = timeout_seconds
        self.gdb_path = gdb_path
        self.allow_stopped = allow_stopped
        self.safe_point = "not reached"
        self._log = log
        self._mi: MiTransport | None = None
        self._watchdog: _Watchdog | None = None
        self._libc: LibcImage | None = None
        self._attach_started: float | None = None
        self._detached_at: float | None = None
        self._attached = False
        self._running = False  # the target was resumed by -exec-continue and not stopped yet
        self._was_running = True
        self._breakpoints: list[str] = []
        self._old_handlers: dict[int, Any] = {}
        self._target_exited = False
        self._call_abandoned = False  # a call was interrupted: make no further calls

    # -- public API --------------------------------------------------------------------------

    @property
    def pause_seconds(self) -> float:
        """How long the target was stopped (attach to detach; until now while attached)."""
        if self._attach_started is None:
            return 0.0
        end = self._detached_at if self._detached_at is not None else time.monotonic()
        return end - self._attach_started

    @property
    def attached(self) -> bool:
        """True while gdb holds the target."""
        return self._attached

    def __enter__(self) -> GdbSession:
        self._install_signal_handlers()
        try:
            with _gdb_failures(self.pid):
                self._start()
        except BaseException:
            self._cleanup()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._cleanup()

    def malloc_info(self) -> bytes:
        """The target's ``malloc_info(0, fp)`` XML, written to an in-memory stream in the target.

        ``open_memstream`` keeps the document in the target's own heap (no file anywhere, so a
        target in another mount namespace works and nothing is left behind); the buffer is read
        back through gdb and freed. Every value a call returns is checked before it is used.
        """
        with _gdb_failures(self.pid):
            return self._malloc_info()

    def _malloc_info(self) -> bytes:
        libc = self._require_safe()
        fn = libc.functions
        cell = self._call(f"(long)((void *(*)(unsigned long)){fn['malloc']:#x})(16)")
        if cell == 0:
            raise TargetError(f"malloc(16) failed in PID {self.pid}: the target is out of memory")
        stream = 0
        buffer = 0
        try:
            # char *ptr; size_t size; for open_memstream(&ptr, &size), both zeroed first.
            self._command(f"-data-write-memory-bytes {cell:#x} {'00' * 16}")
            stream = self._call(
                f"(long)((void *(*)(char **, unsigned long *)){fn['open_memstream']:#x})"
                f"((char **){cell:#x}, (unsigned long *){cell + 8:#x})"
            )
            if stream == 0:
                raise TargetError(f"open_memstream failed in PID {self.pid} (out of memory?)")
            status = self._call(
                f"(int)((int (*)(int, void *)){fn['malloc_info']:#x})(0, {stream:#x})"
            )
            closed = self._call(f"(int)((int (*)(void *)){fn['fclose']:#x})({stream:#x})")
            stream = 0
            buffer, size_bytes = self._read_words(cell)
            if status != 0:
                raise TargetError(f"malloc_info returned {status} in PID {self.pid}")
            if closed != 0:
                raise TargetError(
                    f"fclose of the memory stream returned {closed} in PID {self.pid}"
                )
            if buffer == 0:
                raise TargetError(f"the memory stream of PID {self.pid} has no buffer")
            if not 0 < size_bytes <= MAX_XML_BYTES:
                raise TargetError(f"malloc_info wrote an implausible {size_bytes} bytes")
            xml = self._read_memory(buffer, size_bytes)
        finally:
            if stream:
                self._best_effort_call(f"(int)((int (*)(void *)){fn['fclose']:#x})({stream:#x})")
                with contextlib.suppress(MemforensicsError):
                    buffer, _ = self._read_words(cell)
            if buffer:
                self._best_effort_call(f"(((void (*)(void *)){fn['free']:#x})({buffer:#x}), 0)")
            self._best_effort_call(f"(((void (*)(void *)){fn['free']:#x})({cell:#x}), 0)")
        if not xml.startswith(b"<malloc"):
            raise TargetError(
                f"malloc_info of PID {self.pid} did not write a <malloc> document",
                hint="rerun with -v to see what the target returned",
            )
        return xml

    def malloc_trim(self, pad_bytes: int = 0) -> int:
        """``(int)malloc_trim(pad_bytes)`` at the safe point: 1 if memory was released, else 0."""
        if pad_bytes < 0:
            raise ValueError("pad_bytes must not be negative")
        with _gdb_failures(self.pid):
            libc = self._require_safe()
            address = libc.functions["malloc_trim"]
            return self._call(f"(int)((int (*)(unsigned long)){address:#x})({pad_bytes})")

    # -- attach and safe point ---------------------------------------------------------------

    def _start(self) -> None:
        gdb = _find_gdb(self.gdb_path)
        facts = procfs.check_target(self.pid, allow_stopped=self.allow_stopped)
        self._was_running = facts.state not in ("T", "t")
        if facts.libc_path is None:
            raise NotGlibcMallocError(f"PID {self.pid} maps no shared glibc")
        self._libc = load_libc_image(self.pid, facts.libc_path)
        # Signals wait while the helper processes start, so that none is left unrecorded.
        with _deferred_signals():
            try:
                self._mi = MiTransport([gdb, "-nx", "-nh", "-q", "-i=mi"], log=self._log)
            except OSError as exc:
                raise ToolingError(
                    f"cannot run {gdb}: {exc.strerror}", hint=GDB_INSTALL_HINT
                ) from exc
            self._watchdog = _Watchdog(self.pid, self._mi.pid, was_running=self._was_running)
        self._configure_gdb()
        self._attach()
        self._reach_safe_point()

    def _configure_gdb(self) -> None:
        """Settings that keep the stop short and the calls safe (all before attaching)."""
        settings = [
            "-gdb-set mi-async on",  # accept -exec-interrupt while the target runs forward
            "-gdb-set pagination off",
            "-gdb-set confirm off",
            "-gdb-set auto-solib-add off",  # read no library's symbols except libc's
            "-gdb-set debuginfod enabled off",  # never fetch debug info over the network
            '-interpreter-exec console "set debug-file-directory"',  # no separate debug files
            '-interpreter-exec console "set auto-load off"',
            "-gdb-set unwindonsignal on",  # an interrupted call is unwound, not left half-done
            "-gdb-set print thread-events off",
            "-gdb-set non-stop off",
            # Without libthread_db gdb still stops and lists every thread (it attaches each
            # LWP from /proc/PID/task); loading it and libc's symbols for it doubled the pause.
            '-interpreter-exec console "set libthread-db-search-path /nonexistent"',
            # Read the executable's symbols now, while the target still runs, not after attach.
            f"-file-exec-and-symbols /proc/{self.pid}/exe",
            # Signals the program gets while we work are delivered to it without stopping gdb:
            # a stop would make gdb unwind our call half-way (unwindonsignal), possibly with an
            # arena mutex held. Faults still stop, so a call that faults is unwound instead of
            # killing the target.
            '-interpreter-exec console "handle all nostop noprint pass"',
            '-interpreter-exec console "handle SIGSEGV SIGBUS SIGFPE SIGILL SIGABRT SIGSYS stop"',
        ]
        if not self._was_running:
            # A target someone else stopped (--allow-stopped) re-enters its group stop as soon
            # as a thread runs our call; swallow that SIGSTOP during calls, and queue one for
            # the detach (see _detach) so that the target is left stopped as it was.
            settings.append('-interpreter-exec console "handle SIGSTOP nostop noprint nopass"')
        mi = self._mi_or_fail()
        # Sent all at once and then collected: gdb's start-up dominates, not the round trips.
        try:
            tokens = [(mi.send(setting), setting) for setting in settings]
            for token, setting in tokens:
                try:
                    mi.wait_result(token, timeout_seconds=max(self.timeout_seconds, 10.0))
                except MiError as exc:
                    raise ToolingError(
                        f"gdb rejected {setting!r}: {exc}", hint=GDB_INSTALL_HINT
                    ) from exc
        except MiGdbExited as exc:
            raise ToolingError(
                f"{mi.program} exited at start-up: not a working gdb with MI support",
                hint=GDB_INSTALL_HINT,
            ) from exc
        except MiTimeout as exc:
            raise ToolingError(
                f"{mi.program} did not answer gdb/MI commands", hint=GDB_INSTALL_HINT
            ) from exc

    def _attach(self) -> None:
        mi = self._mi_or_fail()
        self._attach_started = time.monotonic()
        try:
            self._command(f"-target-attach {self.pid}")
        except MiError as exc:
            self._attach_started = None
            raise procfs.diagnose_attach_failure(self.pid, str(exc)) from exc
        self._attached = True
        try:
            mi.wait_async(
                lambda r: r.get("message") == "stopped", timeout_seconds=self.timeout_seconds
            )
        except MiTimeout as exc:
            raise DeadlineError(f"gdb did not stop PID {self.pid} in time after attaching") from exc
        libc = self._libc_or_fail()
        # thread_db already reads libc's symbols on glibc >= 2.34; this is a no-op then.
        pattern = os.path.basename(libc.path).replace(".", "\\\\.")
        with contextlib.suppress(MiError):
            self._command(f'-interpreter-exec console "sharedlibrary {pattern}"')

    def _reach_safe_point(self) -> None:
        """Select a thread outside the allocator, running the target forward if needed."""
        libc = self._libc_or_fail()
        deadline = (self._attach_started or time.monotonic()) + self.timeout_seconds
        stacks: dict[str, list[_Frame]] = {}
        for thread, frame0 in self._threads():
            if frame0 is not None and libc.in_allocator(frame0):
                stacks[thread] = [_Frame(frame0, "")]  # inside already: no need to unwind
                continue
            frames = self._frames(thread)
            stacks[thread] = frames
            if not self._in_allocator(frames):
                self._select(thread)
                where = self._describe_frames(frames)
                self.safe_point = f"thread {thread} outside the allocator ({where})"
                return
        busy = ", ".join(
            f"thread {tid} in {self._describe_frames(frames)}" for tid, frames in stacks.items()
        )
        entry = {libc.functions[name]: name for name in _ENTRY_FUNCTIONS}
        for address in entry:
            result = self._command(f"-break-insert *{address:#x}")
            self._breakpoints.append(str(result.payload.get("bkpt", {}).get("number", "")))
        try:
            while True:
                stopped = self._run_until_stop(deadline, busy)
                reason = str(stopped.get("reason", ""))
                if reason.startswith("exited"):
                    self._target_exited = True
                    raise NoSuchProcessError(f"PID {self.pid} exited while memforensics waited")
                thread = str(stopped.get("thread-id", ""))
                frame = stopped.get("frame") or {}
                pc = int(str(frame.get("addr", "0")), 16)
                if reason != "breakpoint-hit" or pc not in entry or not thread:
                    continue  # a signal or another event: keep running forward
                frames = self._frames(thread)
                if len(frames) < 2 or self._in_allocator(frames[1:]):
                    continue  # the allocator calling itself (e.g. realloc -> malloc)
                self._delete_breakpoints()
                self._select(thread)
                self.safe_point = (
                    f"thread {thread} at the entry of {entry[pc]}() after running forward "
                    f"{(time.monotonic() - (self._attach_started or 0)) * 1000:.0f} ms"
                )
                return
        finally:
            if self._breakpoints and not self._running:
                self._delete_breakpoints()

    def _run_until_stop(self, deadline: float, busy: str) -> dict[str, Any]:
        mi = self._mi_or_fail()
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            self._give_up(busy)
        mi.drain_async()
        self._command("-exec-continue")
        self._running = True
        try:
            record = mi.wait_async(
                lambda r: r.get("message") == "stopped", timeout_seconds=remaining
            )
        except MiTimeout:
            self._stop_running()
            self._give_up(busy)
        self._running = False
        payload: dict[str, Any] = record.get("payload") or {}
        return payload

    def _give_up(self, busy: str) -> None:
        raise DeadlineError(
            f"no safe point in PID {self.pid} within {self.timeout_seconds:g} s: every thread "
            f"stayed inside the allocator ({busy}); nothing was called",
        )

    def _stop_running(self) -> None:
        """Stop a target that runs forward (all-stop), so that it can be detached."""
        mi = self._mi_or_fail()
        if not self._running:
            return
        try:
            self._command("-exec-interrupt", timeout_seconds=_CLEANUP_SECONDS)
            mi.wait_async(lambda r: r.get("message") == "stopped", timeout_seconds=_CLEANUP_SECONDS)
            self._running = False
        except (MiError, MiTimeout):
            mi.interrupt()
            mi.wait_async(lambda r: r.get("message") == "stopped", timeout_seconds=_CLEANUP_SECONDS)
            self._running = False

    def _select(self, thread: str) -> None:
        """Make ``thread`` the caller; the others keep running while it calls (see docs)."""
        self._command(f"-thread-select {thread}")
        # scheduler-locking off: other threads run during each call. One of them may hold an
        # arena mutex (or stdio's list lock) that malloc_info/open_memstream needs; stopped,
        # it would deadlock the call, running it releases it as in any multi-threaded program.
        # It also keeps the pause the process feels down to the attach and the detach.
        self._command("-gdb-set scheduler-locking off")

    def _threads(self) -> list[tuple[str, int | None]]:
        """(gdb thread id, pc of frame 0) of every thread, the main thread first."""
        result = self._command("-thread-info")
        threads = []
        for entry in result.payload.get("threads") or []:
            frame = entry.get("frame") or {}
            try:
                pc: int | None = int(str(frame.get("addr")), 16)
            except ValueError:
                pc = None
            threads.append((str(entry["id"]), pc))
        return threads

    @staticmethod
    def _frames_command(thread: str) -> str:
        return f"-stack-list-frames --thread {thread} 0 {_MAX_FRAMES - 1}"

    def _frames(self, thread: str) -> list[_Frame]:
        return self._parse_frames(self._command(self._frames_command(thread)))

    @staticmethod
    def _parse_frames(result: MiResult) -> list[_Frame]:
        frames = []
        for entry in result.payload.get("stack") or []:
            frame = entry.get("frame", entry) if isinstance(entry, dict) else {}
            with contextlib.suppress(ValueError, TypeError):
                frames.append(_Frame(int(str(frame.get("addr")), 16), str(frame.get("func", "??"))))
        return frames

    def _in_allocator(self, frames: list[_Frame]) -> bool:
        libc = self._libc_or_fail()
        if not frames or len(frames) >= _MAX_FRAMES:
            return True  # no frames or too deep to see the bottom: assume the worst
        for level, frame in enumerate(frames):
            # A caller frame's pc is a return address, just past its call instruction.
            pc = frame.pc if level == 0 else frame.pc - 1
            if libc.in_allocator(pc):
                return True
        return False

    def _describe_frames(self, frames: list[_Frame]) -> str:
        libc = self._libc_or_fail()
        for frame in frames:
            if libc.in_allocator(frame.pc):
                return libc.describe(frame.pc)
        return frames[0].name if frames else "no frames"

    def _delete_breakpoints(self) -> None:
        if self._breakpoints:
            numbers = " ".join(n for n in self._breakpoints if n)
            self._breakpoints = []
            if numbers:
                self._command(f"-break-delete {numbers}", timeout_seconds=_CLEANUP_SECONDS)

    # -- calls ---------------------------------------------------------------------------------

    def _require_safe(self) -> LibcImage:
        if not self._attached or self._running:
            raise ToolingError("the gdb session is not attached at a safe point")
        if self._call_abandoned:
            raise DeadlineError(f"an earlier call into PID {self.pid} did not return; no more")
        return self._libc_or_fail()

    def _call(self, expression: str) -> int:
        """Evaluate a cast call in the target under the deadline and return its integer value."""
        result = self._command(f"-data-evaluate-expression {_mi_quote(expression)}", call=True)
        value = str(result.payload.get("value", "")).split()[0] if result.payload else ""
        try:
            return int(value, 0)
        except ValueError as exc:
            raise ToolingError(f"gdb returned {value!r} for {expression}") from exc

    def _best_effort_call(self, expression: str) -> None:
        with contextlib.suppress(MemforensicsError, MiError, MiTimeout, MiGdbExited):
            # After an abandoned call a lock may be held: cleaning up could hang the same way.
            if self._attached and not self._running and not self._call_abandoned:
                self._call(expression)

    def _read_words(self, address: int) -> tuple[int, int]:
        data = self._read_memory(address, 16)
        first, second = struct.unpack("<QQ", data)
        return first, second

    def _read_memory(self, address: int, size_bytes: int) -> bytes:
        result = self._command(f"-data-read-memory-bytes {address:#x} {size_bytes}")
        chunks = sorted(
            result.payload.get("memory") or [], key=lambda block: int(str(block["begin"]), 16)
        )
        data = b"".join(bytes.fromhex(str(block.get("contents", ""))) for block in chunks)
        if len(data) != size_bytes:
            raise TargetError(
                f"could read only {len(data)} of {size_bytes} bytes at {address:#x} "
                f"in PID {self.pid}"
            )
        return data

    def _command(
        self, text: str, *, timeout_seconds: float | None = None, call: bool = False
    ) -> MiResult:
        """Run one MI command under a deadline, turning gdb's failures into our errors."""
        mi = self._mi_or_fail()
        timeout = self.timeout_seconds if timeout_seconds is None else timeout_seconds
        token = mi.send(text)
        try:
            return mi.wait_result(token, timeout_seconds=timeout)
        except MiTimeout as exc:
            if call:
                # unwindonsignal: gdb abandons the call and restores the thread's registers.
                self._call_abandoned = True
                mi.interrupt()
                with contextlib.suppress(MiError, MiTimeout, MiGdbExited):
                    mi.wait_result(token, timeout_seconds=_CLEANUP_SECONDS)
            raise DeadlineError(
                f"a call into PID {self.pid} did not return within {timeout:g} s; "
                "it was interrupted and unwound"
                if call
                else f"gdb did not answer {text.split(maxsplit=1)[0]} within {timeout:g} s"
            ) from exc
        except MiGdbExited as exc:
            self._attached = False
            if not _pid_alive(self.pid):
                self._target_exited = True
                raise NoSuchProcessError(f"PID {self.pid} exited during the session") from exc
            raise ToolingError(
                f"gdb exited unexpectedly during {text.split(maxsplit=1)[0]}"
            ) from exc
        except MiError as exc:
            message = str(exc)
            if not _pid_alive(self.pid) or "has exited" in message or "not being run" in message:
                self._target_exited = True
                self._attached = False
                raise NoSuchProcessError(f"PID {self.pid} exited during the session") from exc
            if call and "signaled while in a function called from GDB" in message:
                raise TargetError(
                    f"the call into PID {self.pid} raised a signal; gdb unwound it: "
                    f"{message.splitlines()[0]}"
                ) from exc
            raise ToolingError(f"gdb: {message.splitlines()[0] if message else 'error'}") from exc

    # -- cleanup -------------------------------------------------------------------------------

    def _cleanup(self) -> None:
        """Detach whatever happened; never leave the target stopped. Signals wait until done."""
        with _deferred_signals():
            try:
                self._detach()
            finally:
                if self._mi is not None:
                    self._mi.close()
                self._restore_target_state()
                if self._watchdog is not None:
                    self._watchdog.dismiss()
                    self._watchdog = None
                self._restore_signal_handlers()

    def _detach(self) -> None:
        mi = self._mi
        # Detach also when the attach's answer never arrived (interrupted while waiting).
        if mi is None or not mi.alive() or self._attach_started is None or self._target_exited:
            self._mark_detached()
            return
        try:
            for token in list(mi.in_flight):
                mi.interrupt()  # an abandoned call: gdb unwinds it (unwindonsignal)
                with contextlib.suppress(MiError):
                    mi.wait_result(token, timeout_seconds=_CLEANUP_SECONDS)
            if self._running:
                self._stop_running()
            with contextlib.suppress(MiError):
                self._delete_breakpoints()
            if not self._was_running:
                # Leave a stopped target stopped: SIGSTOP is delivered as gdb lets go.
                with contextlib.suppress(MiError):
                    self._command('-interpreter-exec console "handle SIGSTOP nostop noprint pass"')
                    self._command('-interpreter-exec console "queue-signal SIGSTOP"')
            self._command("-target-detach", timeout_seconds=_CLEANUP_SECONDS)
        except (MiError, MiTimeout, MiGdbExited, MemforensicsError):
            # gdb is stuck or gone: closing it kills it and the kernel detaches ptrace;
            # _restore_target_state then resumes the target if it was left stopped.
            pass
        finally:
            self._mark_detached()

    def _mark_detached(self) -> None:
        if self._attach_started is not None and self._detached_at is None:
            self._detached_at = time.monotonic()
        self._attached = False

    def _restore_target_state(self) -> None:
        """A target that was running must not stay in T (stopped) after we let go of it."""
        if not self._was_running or self._attach_started is None:
            return
        for _ in range(5):
            try:
                state = procfs.process_state(self.pid)
            except MemforensicsError:
                return
            if state != "T":
                return
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGCONT)
            time.sleep(0.01)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in (signal.SIGTERM, signal.SIGHUP):
            with contextlib.suppress(ValueError, OSError):
                self._old_handlers[signum] = signal.signal(signum, _raise_terminated)

    def _restore_signal_handlers(self) -> None:
        for signum, handler in self._old_handlers.items():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(signum, handler)
        self._old_handlers = {}

    def _mi_or_fail(self) -> MiTransport:
        if self._mi is None:
            raise ToolingError("gdb is not running")
        return self._mi

    def _libc_or_fail(self) -> LibcImage:
        if self._libc is None:
            raise ToolingError("the target's libc was not read")
        return self._libc


@contextlib.contextmanager
def _gdb_failures(pid: int) -> Iterator[None]:
    """Transport failures that escaped a finer handler become the project's errors."""
    try:
        yield
    except MiGdbExited as exc:
        if not _pid_alive(pid):
            raise NoSuchProcessError(f"PID {pid} exited during the session") from exc
        raise ToolingError(f"gdb exited unexpectedly: {exc}", hint=GDB_INSTALL_HINT) from exc
    except MiTimeout as exc:
        raise DeadlineError(f"gdb did not answer in time while working on PID {pid}") from exc
    except MiError as exc:
        if not _pid_alive(pid):
            raise NoSuchProcessError(f"PID {pid} exited during the session") from exc
        raise ToolingError(f"gdb: {str(exc).splitlines()[0] if str(exc) else 'error'}") from exc


def _pid_alive(pid: int) -> bool:
    try:
        state = procfs.process_state(pid)
    except MemforensicsError:
        return False
    return state not in ("Z", "X")


def capture_malloc_info(
    pid: int,
    *,
    timeout_seconds: float = 10.0,
    gdb_path: str | None = None,
    log: Callable[[str], None] | None = None,
    allow_stopped: bool = False,
) -> Capture:
    """Attach, take one malloc_info document at a safe point, detach: the whole inspect dance."""
    session = GdbSession(
        pid,
        timeout_seconds=timeout_seconds,
        gdb_path=gdb_path,
        log=log,
        allow_stopped=allow_stopped,
    )
    with session:
        xml = session.malloc_info()
    return Capture(xml=xml, pause_seconds=session.pause_seconds, safe_point=session.safe_point)
