"""memforensics' side of the watchdog process: start it, tell it the session, dismiss it.

The watchdog itself (memforensics.sources.gdb.watchdog) is a separate program that leaves the
target running whoever dies; this module only starts it and writes to its stdin.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from memforensics.sources.gdb.reaper import reap_in_background

# The watchdog's program, run with -c: ``-m`` would first import runpy and its helpers
# (11 ms of CPU measured, about half of the watchdog's whole start).
_WATCHDOG_PROGRAM = (
    "import sys; from memforensics.sources.gdb.watchdog import main; sys.exit(main(sys.argv[1:]))"
)


def package_root() -> str:
    """The directory holding the ``memforensics`` package: the watchdog's PYTHONPATH. Found
    from this module's dotted name, so it holds wherever the module moves in the package."""
    return str(Path(__file__).resolve().parents[__name__.count(".")])


# How long a call the watchdog takes over (gdb died mid-call) may wait on a lock before it is
# unwound where it waits (guardian.finish_call); a call that runs is waited for as long as it
# runs (malloc_info of millions of chunks, malloc_trim of gigabytes).
RESCUE_SECONDS = 120.0


class Watchdog:
    """memforensics' side: start the watchdog process, tell it the session, dismiss it."""

    def __init__(self, target_pid: int, gdb_pid: int, *, was_running: bool) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        # -S: no site-packages scan (a faster start); the package is found via PYTHONPATH.
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONPATH"] = package_root()
        with contextlib.suppress(OSError):
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-S",
                    "-s",
                    "-c",
                    _WATCHDOG_PROGRAM,
                    str(target_pid),
                    str(gdb_pid),
                    "1" if was_running else "0",
                    str(RESCUE_SECONDS),
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd="/",
                start_new_session=True,  # neither the terminal's Ctrl-C nor our death kills it
                close_fds=True,
            )

    def tell(self, line: str) -> None:
        """One line of the session's state (see _Session.hear); best effort."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()

    def hand_over(self) -> None:
        """gdb did not detach cleanly (it died, or was killed as stuck): the watchdog, told
        nothing more, ends what is left of gdb and keeps the target running for its resume
        window (a SIGSTOP of gdb's attach may land well after gdb is gone)."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.close()
        reap_in_background(proc)  # never killed: it may be rescuing a call (up to 120 s)
        self._proc = None

    def dismiss(self) -> None:
        """Tell the watchdog we finished cleanly; it exits without touching anything."""
        proc = self._proc
        if proc is None or proc.stdin is None:
            return
        with contextlib.suppress(OSError):
            proc.stdin.write(b"done\n")
            proc.stdin.close()
        # It exits as soon as it reads "done" (even after our own exit): no need to wait.
        reap_in_background(proc)
        self._proc = None
