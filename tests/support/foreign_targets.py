"""Targets whose malloc is served by another allocator (jemalloc, tcmalloc, mimalloc) through
LD_PRELOAD, and that allocator's own statistics about them: the oracle that memforensics'
figures for such processes are checked against.

The target is tests/targets/foreign_alloc.c: THREADS threads each malloc BLOCKS blocks of
BLOCK_BYTES, write them, free all but every KEEP_EVERY-th and stay alive; the test then asks it,
over its stdin, for the allocator's figures, the bytes it keeps, or more kept blocks.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from tests.support.targets import Target, compile_target, running

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
# Each answer is one short line; a target that takes longer than this to give it is hung
# (``more`` scales this by the number of blocks it writes).
COMMAND_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True)
class AllocatorLibrary:
    """The Debian package that ships an allocator and the shared library LD_PRELOAD names."""

    package: str
    library: Path


ALLOCATOR_LIBRARIES: Mapping[str, AllocatorLibrary] = MappingProxyType(
    {
        "jemalloc": AllocatorLibrary("libjemalloc2", LIBDIR / "libjemalloc.so.2"),
        "tcmalloc": AllocatorLibrary("libtcmalloc-minimal4", LIBDIR / "libtcmalloc_minimal.so.4"),
        # The package ships libmimalloc.so.2.0 and its SONAME link libmimalloc.so.2.
        "mimalloc": AllocatorLibrary("libmimalloc2.0", LIBDIR / "libmimalloc.so.2"),
    }
)
# The allocator foreign_alloc reports when none of the others is preloaded.
GLIBC = "glibc"


def allocator_skip_reason(name: str) -> str | None:
    """Why a target cannot run under allocator ``name`` here (naming the Debian package to
    install), or None when its library is present. ``glibc`` needs no library."""
    if name == GLIBC:
        return None
    entry = ALLOCATOR_LIBRARIES[name]
    if not entry.library.exists():
        return f"{entry.library} is missing: install the Debian package {entry.package}"
    return None


class ForeignTarget:
    """A running foreign_alloc process and its command channel (one line out, one line in).

    Every method raises RuntimeError when the target answers ``error ...``, answers
    something else than the command's reply, exits, or stays silent past the deadline.
    """

    def __init__(self, target: Target, allocator: str, block_bytes: int) -> None:
        self.target = target
        self.allocator = allocator
        self.block_bytes = block_bytes
        self._pending = b""

    @property
    def pid(self) -> int:
        return self.target.pid

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.target.proc

    def alive(self) -> bool:
        return self.target.alive()

    def _read_line(self, timeout_seconds: float) -> str:
        """One line from stdout within the deadline, by select() and os.read(): never a
        blocking readline() that would hang the suite on a wedged target."""
        stdout = self.target.proc.stdout
        assert stdout is not None
        fd = stdout.fileno()
        deadline = time.monotonic() + timeout_seconds
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"target {self.pid} did not answer within {timeout_seconds:g} s")
            readable, _, _ = select.select([fd], [], [], min(left, 0.5))
            if not readable:
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                code = self.target.proc.poll()
                raise RuntimeError(f"target {self.pid} closed its stdout (exit status {code})")
            self._pending += chunk
        raw, self._pending = self._pending.split(b"\n", 1)
        return raw.decode(errors="replace").strip()

    def command(self, line: str, *, timeout_seconds: float = COMMAND_TIMEOUT_SECONDS) -> str:
        """Send one command line and return the one line the target answers."""
        stdin = self.target.proc.stdin
        assert stdin is not None, "the target was started without a command pipe"
        try:
            stdin.write(line.encode() + b"\n")
            stdin.flush()
        except BrokenPipeError as error:
            raise RuntimeError(f"target {self.pid} is gone ({self.target.proc.poll()})") from error
        answer = self._read_line(timeout_seconds)
        if answer.startswith("error"):
            raise RuntimeError(f"target {self.pid} refused {line!r}: {answer}")
        return answer

    def figures(self) -> dict[str, Any]:
        """The preloaded allocator's own statistics, taken by the target in one go.

        Always has ``allocator`` (jemalloc, tcmalloc, mimalloc or glibc), ``ok`` (false when
        one of the allocator's statistics calls failed) and ``malloc_library`` (the file that
        defines the malloc the target calls). Then, per allocator:

        - jemalloc: ``allocated``, ``active``, ``metadata``, ``resident``, ``mapped``,
          ``retained`` (bytes, after an ``epoch`` refresh), ``narenas``, ``page``, and
          ``pdirty``/``pmuzzy`` (pages, summed over the ``arenas_read`` arenas that have
          statistics);
        - tcmalloc: the MallocExtension property names (``generic.current_allocated_bytes``,
          ``generic.heap_size``, ``tcmalloc.pageheap_free_bytes``, ...), in bytes;
        - mimalloc: the eight ``mi_process_info`` outputs (``elapsed_msecs``,
          ``current_rss``, ``current_commit``, ``peak_commit``, ...) and ``version``.
        """
        answer = self.command("figures")
        figures: dict[str, Any] = json.loads(answer)
        return figures

    def kept_bytes(self) -> int:
        """The bytes of every block the target holds (its threads' and ``more``'s)."""
        return self._number("keep", "kept")

    def more(self, blocks: int) -> int:
        """Have the main thread malloc, write and keep ``blocks`` more blocks; the total kept
        bytes afterwards."""
        # Writing blocks is fast, but under a loaded machine 1 s per 10,000 is generous.
        timeout = COMMAND_TIMEOUT_SECONDS + blocks / 10_000
        return self._number(f"more {blocks}", "more", timeout_seconds=timeout)

    def _number(
        self, line: str, word: str, *, timeout_seconds: float = COMMAND_TIMEOUT_SECONDS
    ) -> int:
        answer = self.command(line, timeout_seconds=timeout_seconds)
        head, _, value = answer.partition(" ")
        if head != word or not value.isdigit():
            raise RuntimeError(f"target {self.pid} answered {line!r} with {answer!r}")
        return int(value)


def foreign_alloc_binary() -> Path:
    """tests/targets/foreign_alloc.c, compiled (cached); -ldl for dlsym on glibc < 2.34."""
    return compile_target("foreign_alloc", "-ldl")


@contextlib.contextmanager
def foreign_target(
    allocator: str,
    blocks: int,
    block_bytes: int,
    keep_every: int,
    threads: int,
    env: dict[str, str] | None = None,
) -> Iterator[ForeignTarget]:
    """Run foreign_alloc with ``allocator`` (a key of ALLOCATOR_LIBRARIES, or ``glibc`` for
    no preload) behind malloc, and ``env`` (MALLOC_CONF …) added to its environment; yields
    once every thread has fragmented its heap, kills the target in ``finally``. The caller
    checks ``allocator_skip_reason`` first."""
    # Set even for glibc: an inherited LD_PRELOAD (a sanitizer, a profiler) must not decide
    # which malloc the target gets.
    preload = "" if allocator == GLIBC else str(ALLOCATOR_LIBRARIES[allocator].library)
    argv = [foreign_alloc_binary(), blocks, block_bytes, keep_every, threads]
    with running(
        [str(arg) for arg in argv],
        env={"LD_PRELOAD": preload, **(env or {})},
        stdin=subprocess.PIPE,
    ) as target:
        yield ForeignTarget(target, allocator, block_bytes)
