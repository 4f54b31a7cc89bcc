"""The target's state as checked after a call into it went wrong (timed out, raised a signal,
gdb failed mid-call): never assumed. A context manager around the call appends to the error
what /proc and the target's memory show once our side let go: whether the process lives, its
state, whether anything still traces it, and each arena's mutex (a call interrupted inside
malloc_info or malloc_trim can leave one held, and the process's next malloc then deadlocks).
The calling thread's registers are not compared with their values before the call: the
sentence says so rather than claim the thread was restored.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from memforensics.errors import (
    DeadlineError,
    HeapCorruptionError,
    MemforensicsError,
    NoSuchProcessError,
    TargetPermissionError,
)
from memforensics.sources.glibc.heapmaps import scan_heap
from memforensics.sources.proc import procfs
from memforensics.sources.proc.procmem import ProcessMemoryReader

_SETTLE_SECONDS = 2.0  # how long a tracer may take to let go before the state is read
_STATE_WORDS = {"R": "running", "S": "asleep", "D": "in an uninterruptible wait"}
_STATE_WORDS |= {"T": "stopped", "t": "stopped by a tracer", "Z": "a zombie"}


def verified_state(pid: int, libc_path: str | None) -> str:
    """One sentence: what was checked of ``pid`` after the call (see the module)."""
    deadline = time.monotonic() + _SETTLE_SECONDS
    try:
        while procfs.tracer_pid(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        state = procfs.process_state(pid)
        tracer = procfs.tracer_pid(pid)
    except NoSuchProcessError:
        return f"checked after the call: PID {pid} is gone (it died)"
    said = f"checked after the call: PID {pid} is {_STATE_WORDS.get(state, state)} (state {state})"
    said += f", still traced by PID {tracer}" if tracer else ", traced by nothing"
    try:
        scan = scan_heap(pid, libc_path=libc_path, arenas_only=True, budget_seconds=0.5)
        addresses = [(n, a.address) for n, a in enumerate(scan.arenas) if a.address is not None]
        held: list[str] = []
        with ProcessMemoryReader(pid) as mem:
            for number, address in addresses:
                word = mem.read(address, 4)
                if word is None or int.from_bytes(word, "little"):
                    held.append(f"arena {number}" + (" (main_arena)" if number == 0 else ""))
    except (MemforensicsError, OSError):
        return said + "; its arena mutexes could not be read"
    if held:
        said += f"; {', '.join(held)} mutex HELD: its next malloc there will wait for ever"
    else:
        said += f"; all {len(addresses)} arena mutexes free"
    return said + "; the calling thread's registers were not compared with before the call"


@contextlib.contextmanager
def checked_after_call(pid: int, libc_path: str | None) -> Iterator[None]:
    """Run a call (gdb's or ours); a failure of it, or any timeout (gdb detached after a
    deadline), gets the target's verified state added to its message. Errors that say no
    call was made pass unchanged."""
    try:
        yield
    except (NoSuchProcessError, TargetPermissionError, HeapCorruptionError):
        raise
    except MemforensicsError as exc:
        text = exc.message.lower()
        if "nothing was called" in text:
            raise
        if isinstance(exc, DeadlineError) or any(w in text for w in ("call", "signal", "unwound")):
            exc.message = f"{exc.message}; {verified_state(pid, libc_path)}"
            exc.args = (exc.message,)
        raise
