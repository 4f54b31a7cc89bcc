"""Helper processes we are done with, reaped in a background thread instead of waited for."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading


def reap_in_background(
    process: subprocess.Popen[bytes], *, grace_seconds: float | None = None
) -> None:
    """Let ``process`` exit on its own, then reap it; with ``grace_seconds``, kill its group
    if it overstays them (gdb); without, never (the watchdog: it may be finishing a call that
    gdb left in the target, for as long as that call takes).

    Only for a process whose work is over or that finishes it alone: its exit takes tens of
    milliseconds the command need not wait for. The thread is a daemon, so it never delays
    our own exit; an orphan then exits unaided.
    """

    def reap() -> None:
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    threading.Thread(target=reap, name=f"memforensics-reap-{process.pid}", daemon=True).start()
