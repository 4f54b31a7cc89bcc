"""The watchdog: a separate process that leaves the target running whoever dies.

Run as ``python -m memforensics.sources.gdb.watchdog TARGET_PID GDB_PID WAS_RUNNING
RESCUE_SECONDS`` (the session starts it through ``-c`` with the same arguments: see
watchdog_link) in its own session (the terminal's Ctrl-C and memforensics' death do not reach
it), with oom_score_adj -1000 where allowed. memforensics tells it, line by line on its stdin,
where gdb's call dummy is, the calling thread's registers, and when a call starts and ends;
``done`` is a clean finish.

* gdb dies (pidfd) while a call runs: the guardian module takes over the calling thread so
  that its return into gdb's breakpoint does not kill the target.
* memforensics dies (stdin closes without ``done``): it kills gdb so that the kernel detaches
  ptrace, rescues a call in flight the same way, then SIGCONTs the target if it was running
  before and is left in group-stop by a SIGSTOP that gdb had queued.

Only light standard modules and the guardian are imported here: it starts while gdb attaches,
on a CPU that gdb and the residency scan want too (with dataclasses, pathlib and subprocess
its start cost 38 ms of CPU, 21 without them, measured with -c). The
side of memforensics that starts it and talks to it is memforensics.sources.gdb.watchdog_link.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

# Imported at start, not when a rescue needs it: a rescue races the calling thread, which
# runs on as soon as gdb is gone (loading ctypes then took long enough for the thread to
# crash the target before the guardian could seize it, in 2 runs of 3 of the deadline test).
from memforensics.sources.gdb.guardian import finish_call

# How long the watchdog keeps resuming a target that re-enters a stop after gdb died.
_RESUME_WINDOW_SECONDS = 5.0
# A target untraced and not stopped for this long is considered safely left alone.
_CALM_SECONDS = 0.5
_POLL_SECONDS = 0.02
_GDB_DEATH_SECONDS = 5.0


def _status(pid: int) -> tuple[str | None, int]:
    """(one-letter state, TracerPid) of PID; (None, 0) when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            text = status.read()
    except OSError:
        return None, 0
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    tracer = fields.get("TracerPid", "0").strip() or "0"
    return fields.get("State", "?").strip()[:1], int(tracer)


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


class _Session:
    """What memforensics told us about the session so far."""

    def __init__(self) -> None:
        self.done = False
        self.detached = False  # gdb let go of the target cleanly
        self.in_call = False
        self.caller_tid: int | None = None
        self.saved: dict[str, int] = {}
        self.dummy_address: int | None = None
        self.dummy_byte = b""
        self.outcome = ""

    def hear(self, line: str) -> None:
        words = line.split()
        if not words:
            return
        if words[0] == "done":
            self.done = True
        elif words[0] == "detached":
            self.detached = True
        elif words[0] == "call":
            self.in_call = True
        elif words[0] == "ret":
            self.in_call = False
        elif words[0] == "entry" and len(words) == 3:
            self.dummy_address, self.dummy_byte = int(words[1], 16), bytes.fromhex(words[2])
        elif words[0] == "regs" and len(words) >= 2:
            self.caller_tid = int(words[1])
            self.saved = {k: int(v, 16) for k, _, v in (w.partition("=") for w in words[2:])}


def _rescue_call(target_pid: int, session: _Session, rescue_seconds: float) -> None:
    """gdb died while the caller ran a function: finish the call in gdb's place."""
    if not session.in_call or session.caller_tid is None or session.dummy_address is None:
        return
    session.outcome = finish_call(
        target_pid,
        session.caller_tid,
        session.saved,
        dummy_address=session.dummy_address,
        dummy_byte=session.dummy_byte,
        timeout_seconds=rescue_seconds,
    )
    session.in_call = False


def _end_gdbs_children(gdb_pid: int) -> None:
    """Kill what is left of gdb's process group once gdb itself is gone.

    As it attaches, gdb forks a copy of itself that stops itself under ptrace to probe the
    kernel's ptrace features, then kills it. gdb killed in between (by the OOM killer, say)
    leaves that copy stopped for ever, holding the target's /proc/PID/mem open. gdb leads
    its own group (it was started in its own session): the group is gdb's children only.
    """
    with contextlib.suppress(OSError):
        os.killpg(gdb_pid, signal.SIGKILL)


def _protect_from_oom_killer() -> None:
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as adj:
        adj.write("-1000")  # needs CAP_SYS_RESOURCE; best effort


def main(argv: list[str]) -> int:
    """The watchdog program (see the module docstring)."""
    target_pid, gdb_pid, was_running = int(argv[0]), int(argv[1]), argv[2] == "1"
    rescue_seconds = float(argv[3])  # watchdog_link.RESCUE_SECONDS
    _protect_from_oom_killer()
    session = _Session()
    poller = select.poll()
    poller.register(0, select.POLLIN)
    gdb_fd: int | None = None
    with contextlib.suppress(OSError):
        gdb_fd = os.pidfd_open(gdb_pid)
        poller.register(gdb_fd, select.POLLIN)
    gdb_leads_its_group = False
    with contextlib.suppress(OSError):
        gdb_leads_its_group = os.getpgid(gdb_pid) == gdb_pid
    pending = b""
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        # What memforensics said comes first: a "detached" and gdb's exit may arrive together.
        for fd, _event in sorted(events, key=lambda event: event[0] != 0):
            if fd == gdb_fd:  # gdb is gone: expected after a detach, a rescue mid-call
                if gdb_leads_its_group:
                    _end_gdbs_children(gdb_pid)
                _rescue_call(target_pid, session, rescue_seconds)
                if not session.detached:
                    # gdb died holding the target: a SIGSTOP of its attach may still land.
                    _leave_running(target_pid, was_running=was_running)
                poller.unregister(gdb_fd)
                os.close(gdb_fd)
                gdb_fd = None
                continue
            try:
                chunk = os.read(0, 65536)
            except InterruptedError:
                continue
            except OSError:
                chunk = b""
            if chunk:
                pending += chunk
                *lines, pending = pending.split(b"\n")
                for line in lines:
                    session.hear(line.decode(errors="replace"))
                continue
            if session.done:
                return 0
            # memforensics died: end gdb (the kernel detaches ptrace), rescue a call in flight.
            with contextlib.suppress(OSError):
                os.killpg(gdb_pid, signal.SIGKILL)
            if gdb_fd is not None:
                with contextlib.suppress(OSError):
                    select.select([gdb_fd], [], [], _GDB_DEATH_SECONDS)
            _rescue_call(target_pid, session, rescue_seconds)
            _leave_running(target_pid, was_running=was_running)
            return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
