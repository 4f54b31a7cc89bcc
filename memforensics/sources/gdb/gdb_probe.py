"""Whether a gdb puts a thread back after a call on this machine, tried once per gdb binary on
a child of our own, never on a target.

On a CPU whose XSAVE area holds AMX tile data (Sapphire Rapids and later, ~11 KiB), the
kernel takes the extended state only whole (PTRACE_SETREGSET NT_X86_XSTATE of exactly its
size); a gdb that writes back the smaller area it knows (gdb 13: AVX-512's 2,696 bytes) fails
with "Couldn't write extended state status: Bad address" and leaves the thread in the
called function's frame: the process dies when it resumes. Elsewhere no probe is made.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess

from memforensics.errors import GdbUnavailableError
from memforensics.sources.files.user_cache import cache_folder

PROBE_SECONDS = 20.0
_FINE = "fine"
_XSTATE_FAILURE = "Couldn't write extended state"
# (realpath, mtime, size) of a gdb binary -> why it cannot restore a thread (None: it can);
# kept in this user's cache too, so that a run pays for the probe once per binary and kernel.
_verdicts: dict[tuple[str, int, int], str | None] = {}


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """The CPU (as the kernel enabled it) saves AMX tile data in its XSAVE area."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("flags"):
                    return "amx_tile" in line.split()
    except OSError:
        return False
    return False


def _probe(gdb: str) -> str | None:
    """Call getpid() through ``gdb`` in a child of ours; why that failed, or None."""
    child = subprocess.Popen(["sleep", "60"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    try:
        try:
            done = subprocess.run(
                [gdb, "-nx", "-batch", "-p", str(child.pid), "-ex", "call (int)getpid()"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=PROBE_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None  # not this probe's to judge: the session reports what gdb does
        if _XSTATE_FAILURE in done.stdout + done.stderr:
            return (
                "it cannot write back this CPU's extended register state (AMX) after a "
                "call, which leaves the calling thread broken"
            )
        if f"= {child.pid}" in done.stdout and child.poll() is not None:
            return "the process it called into did not survive the call"
        return None  # no call made (not a gdb, no symbols): the session says why
    finally:
        with contextlib.suppress(OSError):
            child.kill()
        child.wait()


def _verdict_file(key: tuple[str, int, int]) -> str:
    """Where this user's cache keeps the verdict on one gdb binary, for this kernel."""
    text = f"{key}|{os.uname().release}"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    return str(cache_folder() / f"gdb-probe-{digest}")


def _remembered(key: tuple[str, int, int]) -> str | None:
    """The probe's verdict on the gdb of ``key``: from this user's cache where an earlier
    run kept it (the same binary, the same kernel), else probed now and kept (written whole:
    a temporary file renamed into place)."""
    path = _verdict_file(key)
    with contextlib.suppress(OSError, UnicodeDecodeError), open(path, encoding="utf-8") as f:
        kept = f.read(4096)
        if kept:
            return None if kept == _FINE else kept
    why = _probe(key[0])
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        temporary = f"{path}.{os.getpid()}"
        with open(temporary, "w", encoding="utf-8") as f:
            f.write(why or _FINE)
        os.replace(temporary, path)
    return why


def check_call_restores(gdb: str) -> None:
    """GdbUnavailableError (exit 5) when ``gdb`` cannot put a thread back after a call on
    this machine (see the module); the target is not touched."""
    if not cpu_has_amx():
        return
    try:
        info = os.stat(gdb)
    except OSError:
        return  # the start of gdb reports it
    key = (os.path.realpath(gdb), info.st_mtime_ns, info.st_size)
    if key not in _verdicts:
        _verdicts[key] = _remembered(key)
    why = _verdicts[key]
    if why is not None:
        raise GdbUnavailableError(
            f"{gdb} cannot make a call safely on this machine: {why}",
            hint="use a gdb that knows this CPU's register state (gdb 18 does; Debian 12's "
            "gdb 13 does not); the default read from memory needs no gdb",
        )
