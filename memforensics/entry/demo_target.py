"""The child process `memforensics demo` starts: fragments glibc's heap through ctypes, then idles.

It allocates ``--buffers`` blocks of ``--size`` bytes with libc's own ``malloc`` (ctypes, so no
compiler is needed), writes every byte so the pages are resident, frees all but the last block of
each thread (that block pins the top of the heap, so glibc cannot give the memory back by
shrinking the heap from the top), prints ``ready …`` on stdout and sleeps until it is killed,
its parent dies, or ``--max-seconds`` pass. While allocating it prints ``progress DONE TOTAL``
lines so the parent can show progress. Run as ``python -m memforensics.entry.demo_target``.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence

# prctl(PR_SET_PDEATHSIG): the kernel signals us when the parent that started us goes away,
# so a demo killed with SIGKILL never leaves a 200 MB orphan behind.
_PR_SET_PDEATHSIG = 1
# prctl(PR_SET_PTRACER, parent): under Yama ptrace_scope=1 (Ubuntu's default) only ancestors may
# attach, and gdb is our sibling; naming the parent lets its descendants (gdb) trace us.
# Kernels without Yama answer EINVAL, which is harmless.
_PR_SET_PTRACER = 0x59616D61
_PROGRESS_EVERY_SECONDS = 0.1
_FILL_BYTE = 0xA5


def _load_libc() -> ctypes.CDLL:
    """libc with typed malloc/free/memset: without restype ctypes would truncate pointers."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.restype = None
    libc.free.argtypes = [ctypes.c_void_p]
    return libc


class _Fragmenter:
    """Allocates, writes and frees blocks in one or more threads, counting progress."""

    def __init__(self, libc: ctypes.CDLL, buffers: int, size_bytes: int, threads: int) -> None:
        self.libc = libc
        self.size_bytes = size_bytes
        # Spread the blocks evenly; the first threads take the remainder.
        base, extra = divmod(buffers, threads)
        self.shares = [base + (1 if i < extra else 0) for i in range(threads)]
        self.done = 0
        self.kept: list[int] = []
        self.error: str | None = None
        self._lock = threading.Lock()

    def _work(self, count: int, report_total: int | None = None) -> None:
        if count <= 0:
            return
        pointers = (ctypes.c_void_p * count)()
        step = 0
        for i in range(count):
            pointer = self.libc.malloc(self.size_bytes)
            if not pointer:
                with self._lock:
                    self.error = f"malloc({self.size_bytes}) failed after {i} blocks"
                return
            ctypes.memset(pointer, _FILL_BYTE, self.size_bytes)
            pointers[i] = pointer
            step += 1
            if step == 1024:
                with self._lock:
                    self.done += step
                step = 0
                if report_total is not None and self.done % (1024 * 16) == 0:
                    print(f"progress {self.done} {report_total}", flush=True)
        with self._lock:
            self.done += step
        # Keep the newest block: it sits next to the top chunk and pins the heap's end.
        for i in range(count - 1):
            self.libc.free(pointers[i])
        with self._lock:
            self.kept.append(int(pointers[count - 1] or 0))

    def run(self, report: bool) -> None:
        """Do the work (in threads when asked), printing progress lines while it runs."""
        total = sum(self.shares)
        if len(self.shares) == 1:
            # The classic case lives in the main arena (the brk heap): work in this thread.
            self._work(self.shares[0], report_total=total if report else None)
            return
        worker = threading.Thread(target=self._spread)
        worker.start()
        while worker.is_alive():
            worker.join(_PROGRESS_EVERY_SECONDS)
            if report:
                print(f"progress {self.done} {total}", flush=True)

    def _spread(self) -> None:
        # Each thread's first malloc gives it an arena of its own (up to glibc's arena_max).
        workers = [threading.Thread(target=self._work, args=(share,)) for share in self.shares]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m memforensics.entry.demo_target",
        description="Fragment glibc's heap with ctypes malloc/free, say ready, then idle.",
    )
    parser.add_argument("--buffers", type=int, default=200_000, help="blocks to allocate")
    parser.add_argument("--size", type=int, default=1024, help="bytes per block")
    parser.add_argument("--threads", type=int, default=1, help="threads sharing the work")
    parser.add_argument(
        "--max-seconds", type=float, default=600.0, help="exit on its own after this long"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    if args.buffers < 1 or args.size < 1 or args.threads < 1 or args.max_seconds <= 0:
        parser.error("--buffers, --size, --threads and --max-seconds must be positive")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Fragment the heap, print ``ready``, idle; returns the exit status."""
    args = _parse_args(argv)
    libc = _load_libc()
    parent_pid = os.getppid()
    libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    libc.prctl(_PR_SET_PTRACER, parent_pid, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        return 1
    started = time.monotonic()
    fragmenter = _Fragmenter(libc, args.buffers, args.size, args.threads)
    fragmenter.run(report=not args.no_progress)
    if fragmenter.error is not None:
        print(f"error {fragmenter.error}", file=sys.stderr, flush=True)
        return 1
    allocated_bytes = args.buffers * args.size
    print(
        f"ready pid={os.getpid()} buffers={args.buffers} size={args.size} "
        f"threads={args.threads} allocated_bytes={allocated_bytes} kept={len(fragmenter.kept)}",
        flush=True,
    )
    # Idle in a plain sleep: gdb then stops us in a syscall, far from the allocator.
    while time.monotonic() - started < args.max_seconds:
        time.sleep(0.5)
        if os.getppid() != parent_pid:
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
