"""A target that holds its main arena's lock on command: many_arenas's "stall"."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
from pathlib import Path

from tests.support.targets import compile_target


class StallTarget:
    """many_arenas with a pipe for commands and a small (4 KiB) stderr pipe: its "stall"
    command starts a thread that holds the main arena's mutex inside malloc_stats() until
    that pipe is drained."""

    def __init__(self, blocks: int = 200000) -> None:
        binary = compile_target("many_arenas")
        self.err_read, err_write = os.pipe()
        fcntl.fcntl(err_write, fcntl.F_SETPIPE_SZ, 4096)
        self.proc = subprocess.Popen(
            [str(binary), "1", str(blocks), "24"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err_write,
            start_new_session=True,
        )
        os.close(err_write)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        assert line.startswith("ready"), line

    @property
    def pid(self) -> int:
        return self.proc.pid

    def say(self, command: str) -> str:
        """Send a command to the main thread and return its one-line answer."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().decode().strip()

    def drain_stderr(self) -> None:
        os.set_blocking(self.err_read, False)
        with contextlib.suppress(BlockingIOError):
            while os.read(self.err_read, 65536):
                pass

    def status(self) -> dict[str, str]:
        fields = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        return fields

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        os.close(self.err_read)
