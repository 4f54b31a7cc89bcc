"""The watchdog: a separate process that leaves the target running if memforensics is killed.

Run as ``python -m memforensics.sources.watchdog TARGET_PID GDB_PID WAS_RUNNING`` in its own
session (the terminal's Ctrl-C and memforensics' death do not reach it). It reads its stdin,
a pipe from memforensics, until EOF: ``done`` first means a clean finish and it exits touching
nothing. Anything else means memforensics died (SIGKILL, OOM kill) with gdb possibly attached:
it kills gdb so that the kernel detaches ptrace, then SIGCONTs the target if it was running
before and is left in group-stop by a SIGSTOP that gdb had queued.

Only the standard library is imported here: it starts while the target still runs, but a
quick start keeps the whole inspect short.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# How long the watchdog keeps resuming a target that re-enters a stop after gdb died.
_RESUME_WINDOW_SECONDS = 5.0
# A target untraced and not stopped for this long is considered safely left alone.
_CALM_SECONDS = 0.5
_POLL_SECONDS = 0.02


def _status(pid: int) -> tuple[str | None, int]:
    """(one-letter state, TracerPid) of PID; (None, 0) when it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None, 0
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    tracer = fields.get("TracerPid", "0").strip() or "0"
    return fields.get("State", "?").strip()[:1], int(tracer)


def _read_until_eof(fd: int) -> bytes:
    seen = b""
    while True:
        try:
            chunk = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return seen
        if not chunk:
            return seen
        seen += chunk


def _leave_running(target_pid: int, *, was_running: bool) -> None:
    """Resume a target left in T by a SIGSTOP gdb had queued, until it stays calm."""
    deadline = time.monotonic() + _RESUME_WINDOW_SECONDS
    calm_since: float | None = None
    while time.monotonic() < deadline:
        state, tracer = _status(target_pid)
        if state is None:
            return
        if tracer == 0 and was_running and state == "T":
            with contextlib.suppress(OSError):
                os.kill(target_pid, signal.SIGCONT)
            calm_since = None
        elif tracer == 0:
            calm_since = calm_since or time.monotonic()
            if time.monotonic() - calm_since > _CALM_SECONDS:
                return
        time.sleep(_POLL_SECONDS)


def main(argv: list[str]) -> int:
    """The watchdog program (see the module docstring)."""
    target_pid, gdb_pid, was_running = int(argv[0]), int(argv[1]), argv[2] == "1"
    if b"done" in _read_until_eof(0):
        return 0
    with contextlib.suppress(OSError):
        os.killpg(gdb_pid, signal.SIGKILL)
    _leave_running(target_pid, was_running=was_running)
    return 0


class Watchdog:
    """memforensics' side: start the watchdog process, dismiss it on a clean finish."""

    def __init__(self, target_pid: int, gdb_pid: int, *, was_running: bool) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        # -S: no site-packages scan (a faster start); the package is found via PYTHONPATH.
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env["PYTHONPATH"] = package_root
        with contextlib.suppress(OSError):
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-S",
                    "-s",
                    "-m",
                    "memforensics.sources.watchdog",
                    str(target_pid),
                    str(gdb_pid),
                    "1" if was_running else "0",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=env,
                cwd="/",
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
