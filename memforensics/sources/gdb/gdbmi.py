"""A token-matched gdb/MI transport: send a command, wait for its own result under a deadline.

pygdbmi's ``GdbController.write()`` returns once gdb has been quiet for 0.2 s rather than when
the command is done (cs01/pygdbmi#104), and it cannot interrupt gdb (#97). This transport keeps
pygdbmi's record parser but owns the gdb process: every command carries a numeric token, and we
wait for the ``^done``/``^running``/``^error`` record with that token; async records such as
``*stopped`` are queued for whoever waits on them. gdb runs in its own session (process group) so
the terminal's Ctrl-C reaches memforensics only; ``interrupt()`` signals gdb ourselves.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import signal
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pygdbmi import gdbmiparser

from memforensics.sources.gdb.reaper import reap_in_background

# A malloc_info document of a process with hundreds of arenas is a few MiB as hex; one line of
# MI output is never longer than what we read back, so this is only a sanity bound.
_MAX_LINE_BYTES = 256 * 1024 * 1024


# The register lists the session reads for the watchdog (call_context.py): with the vector
# registers, whose raw values gdb prints as unions of every view, the values line is ~25 KB,
# which pygdbmi parsed in ~6 ms of a 12 ms total per inspect. These two shapes are read here.
_REGISTER_LIST = re.compile(r"(\d+)\^done,register-(values|names)=\[(.*)\]\Z", re.DOTALL)
_REGISTER_VALUE = re.compile(r'\{number="(\d+)",value="([^"\\]*)"\}')
_REGISTER_NAME = re.compile(r'"([^"\\]*)"')


# Where an MI result or async record may begin inside a line: a result with its token; an
# async record without one (the digits before "*stopped" in "...libc.so.6*stopped" are the
# broken text's, and gdb sends its async records untokened).
_RECORD_START = re.compile(r"(?:\d*\^|[*=+])[a-z][a-z-]*(?=,|$)")


def parse_line(line: str) -> dict[str, Any]:
    """pygdbmi's record of one line of gdb/MI output, never an exception. gdb interrupted
    mid-line may leave a console record unterminated and the next record glued to it
    (``~"0x7f... in __write_nocancel () from ...libc.so.6*stopped,reason=...``), which
    pygdbmi refuses: the first record found after the broken text is parsed instead (the
    text is console output, lost), or the line is kept as plain output."""
    try:
        return parse_register_list(line) or gdbmiparser.parse_response(line)
    except (ValueError, IndexError, KeyError):
        pass
    for match in _RECORD_START.finditer(line, 1):
        try:
            record: dict[str, Any] = gdbmiparser.parse_response(line[match.start() :])
        except (ValueError, IndexError, KeyError):
            continue
        if record.get("type") in ("result", "notify"):
            return record
    return {"type": "output", "message": None, "payload": line, "stream": "stdout"}


def parse_register_list(line: str) -> dict[str, Any] | None:
    """The record pygdbmi makes of a ``register-values`` or ``register-names`` result line,
    or None for any other line, and for a list with anything this does not read back
    exactly (escapes, other fields): pygdbmi then reads it."""
    match = _REGISTER_LIST.match(line)
    if match is None:
        return None
    token, kind, body = match.groups()
    entries: list[Any]
    if kind == "values":
        pairs = _REGISTER_VALUE.findall(body)
        entries = [{"number": number, "value": value} for number, value in pairs]
        rebuilt = ",".join(f'{{number="{number}",value="{value}"}}' for number, value in pairs)
    else:
        entries = _REGISTER_NAME.findall(body)
        rebuilt = ",".join(f'"{name}"' for name in entries)
    if rebuilt != body:
        return None
    return {
        "type": "result",
        "message": "done",
        "payload": {f"register-{kind}": entries},
        "token": int(token),
    }


class MiError(Exception):
    """gdb answered a command with ``^error``; ``str()`` is gdb's message."""


class MiTimeout(Exception):
    """gdb did not answer (or did not report the awaited event) before the deadline."""


class MiGdbExited(Exception):
    """gdb's process ended (or closed its output) while we were waiting for it."""


@dataclass
class MiResult:
    """The result record of one command plus the console text gdb printed for it."""

    message: str
    payload: dict[str, Any]
    console: list[str] = field(default_factory=list)


class MiTransport:
    """Drive one gdb process over MI: ``command()`` sends, waits for the matching result."""

    def __init__(
        self, process: subprocess.Popen[bytes], *, log: Callable[[str], None] | None = None
    ) -> None:
        """Drive ``process``, a gdb started with ``-i=mi`` and pipes (gdb_spawn.start_gdb)."""
        self._log = log
        self.program = str(process.args[0]) if isinstance(process.args, list) else "gdb"
        self._next_token = 1
        self._partial: list[bytes] = []  # pieces of the line still being received
        self._partial_bytes = 0
        self._lines: deque[str] = deque()
        self._async: deque[dict[str, Any]] = deque()
        self._eof = False
        self.in_flight: set[int] = set()  # tokens sent whose result has not arrived
        self.process = process
        assert self.process.stdout is not None
        self._fd = self.process.stdout.fileno()
        os.set_blocking(self._fd, False)

    @property
    def pid(self) -> int:
        """gdb's process id."""
        return self.process.pid

    def alive(self) -> bool:
        """True while gdb's process has not exited."""
        return self.process.poll() is None

    def command(self, text: str, *, timeout_seconds: float) -> MiResult:
        """Send one MI command and return its result record; raise MiError on ``^error``."""
        return self.wait_result(self.send(text), timeout_seconds=timeout_seconds)

    def send(self, text: str) -> int:
        """Send one MI command prefixed with a fresh token and return the token."""
        token = self._next_token
        self._next_token += 1
        self._send(f"{token}{text}")
        self.in_flight.add(token)
        return token

    def wait_result(self, token: int, *, timeout_seconds: float) -> MiResult:
        """Wait for the result record carrying ``token``; raise MiError on ``^error``."""
        deadline = time.monotonic() + timeout_seconds
        console: list[str] = []
        while True:
            record = self._next_record(deadline)
            kind = record.get("type")
            if kind == "result" and record.get("token") in self.in_flight:
                self.in_flight.discard(record["token"])
                if record["token"] != token:
                    continue  # the late answer of an abandoned command
                payload = record.get("payload") or {}
                if record.get("message") == "error":
                    raise MiError(str(payload.get("msg", "unknown gdb error")))
                return MiResult(str(record.get("message")), payload, console)
            if kind in ("console", "log") and isinstance(record.get("payload"), str):
                console.append(record["payload"])
            elif kind == "notify":
                self._async.append(record)

    def wait_async(
        self, predicate: Callable[[dict[str, Any]], bool], *, timeout_seconds: float
    ) -> dict[str, Any]:
        """Return the first queued or arriving async record for which ``predicate`` holds."""
        deadline = time.monotonic() + timeout_seconds
        while True:
            while self._async:
                record = self._async.popleft()
                if predicate(record):
                    return record
            record = self._next_record(deadline)
            if record.get("type") == "notify":
                self._async.append(record)

    def drain_async(self) -> None:
        """Forget queued async records (e.g. stale ``*stopped`` before a new resume)."""
        self._async.clear()

    def interrupt(self) -> None:
        """SIGINT gdb itself: it stops a running target or abandons an inferior call."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signal.SIGINT)

    def close(self, *, grace_seconds: float = 1.0, wait: bool = True) -> None:
        """Ask gdb to exit, then make sure it is gone (SIGKILL after the grace period).

        ``wait=False`` once gdb holds nothing of the target (a clean detach): its exit is
        then reaped in the background, and the same grace period applies there.
        """
        if self.alive():
            with contextlib.suppress(OSError, MiGdbExited):  # it may die as we ask
                self._send("-gdb-exit")
            if not wait:
                self._close_streams()
                reap_in_background(self.process, grace_seconds=grace_seconds)
                return
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=grace_seconds)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self._close_streams()

    def _close_streams(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    # --- internals -------------------------------------------------------------------------

    def _send(self, line: str) -> None:
        if self._log is not None:
            self._log(f"-> {line}")
        stdin = self.process.stdin
        if stdin is None or not self.alive():
            raise MiGdbExited("gdb is not running")
        try:
            stdin.write(line.encode() + b"\n")
        except BrokenPipeError as exc:
            raise MiGdbExited("gdb closed its input") from exc

    def _next_record(self, deadline: float) -> dict[str, Any]:
        """Parse the next MI line, reading from gdb until ``deadline``."""
        while True:
            while self._lines:
                line = self._lines.popleft()
                if self._log is not None:
                    self._log(f"<- {line}")
                record = parse_line(line)
                if record.get("type") == "done":  # the "(gdb)" prompt
                    continue
                return record
            self._fill(deadline)

    def _fill(self, deadline: float) -> None:
        if self._eof:
            raise MiGdbExited("gdb exited")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise MiTimeout("gdb did not answer in time")
        readable, _, _ = select.select([self._fd], [], [], remaining)
        if not readable:
            raise MiTimeout("gdb did not answer in time")
        try:
            chunk = os.read(self._fd, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            self._eof = True
            if self._partial:
                self._lines.append(b"".join(self._partial).decode(errors="replace"))
                self._partial, self._partial_bytes = [], 0
                return
            raise MiGdbExited("gdb exited")
        # Only the new chunk is searched for line ends, and a long line is joined once when it
        # ends: the work stays linear in what gdb sends however long its lines are.
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            piece = chunk[start:end]
            if self._partial:
                piece = b"".join((*self._partial, piece))
                self._partial, self._partial_bytes = [], 0
            self._lines.append(piece.rstrip(b"\r").decode(errors="replace"))
            start = end + 1
        if start < len(chunk):
            self._partial.append(chunk[start:])
            self._partial_bytes += len(chunk) - start
            if self._partial_bytes > _MAX_LINE_BYTES:
                raise MiGdbExited("gdb sent an implausibly long line")
