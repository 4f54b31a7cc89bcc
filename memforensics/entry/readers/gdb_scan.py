"""The gdb way's residency scan of a live process, in a worker thread beside its gdb session:
the scan reads /proc while gdb attaches and calls, and the session's figures wait for it only
at the end."""

from __future__ import annotations

import threading

from memforensics.entry.readers.gdb_background import QuietGate, lower_thread_priority
from memforensics.model.heapscan import HeapScan
from memforensics.sources.glibc.heapmaps import WALK_BUDGET_SECONDS, scan_heap


class BackgroundScan:
    """``scan_heap`` in a worker thread, started now, joined when its figures are needed.

    The scan reads only /proc (pagemap and memory, never ptrace), so it may run while gdb
    holds the target: both then take the time of the slower one, not of the two in turn.
    Its copies and its chunk loop run without the GIL (the C walker), so the thread driving
    gdb is not held up. A failed capture leaves the thread to end within its time budget.
    """

    def __init__(
        self, pid: int, *, libc_path: str | None, budget_seconds: float = WALK_BUDGET_SECONDS
    ) -> None:
        # The scan parks between arenas while gdb attaches and detaches (gdb_background.QuietGate).
        self.gate = QuietGate()
        self._scan: HeapScan | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run,
            args=(pid, libc_path, budget_seconds),
            name=f"memforensics-scan-{pid}",
            daemon=True,  # an interrupted command must not wait for the walk to end
        )
        self._thread.start()

    def _run(self, pid: int, libc_path: str | None, budget_seconds: float) -> None:
        lower_thread_priority()
        try:
            with self.gate.worker():
                self._scan = scan_heap(
                    pid,
                    libc_path=libc_path,
                    budget_seconds=budget_seconds,
                    pause=self.gate.checkpoint,
                )
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc

    def result(self) -> HeapScan:
        """The scan's figures, once it ends; its error, raised here, if it failed."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        if self._scan is None:
            raise AssertionError("a scan thread that ended neither returned nor raised")
        return self._scan
