"""Reading gdb's thread and frame lists: is a thread inside glibc's allocator, and where is it.

Pure functions over MI payloads and the target's LibcImage, so the session only asks and acts.
"Inside" is decided by address (libc is stripped: a pc in _int_malloc has no name of its own).
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any

from memforensics.sources.glibc.libc_elf import LibcImage

# Deepest stack we look at; a thread deeper than this is treated as possibly in the allocator.
MAX_FRAMES = 256
_LWP_RE = re.compile(r"LWP (\d+)")


@dataclass(frozen=True)
class Frame:
    """One stack frame: its pc (a return address for callers) and gdb's name for it."""

    pc: int
    name: str  # "??" when gdb has no symbol for it


@dataclass(frozen=True)
class ThreadInfo:
    """One thread as -thread-info lists it."""

    gdb_id: str
    lwp: int | None  # the kernel's thread id
    name: str  # the thread's comm ("" if gdb did not say)
    pc: int | None  # frame 0


def frames_command(thread: str) -> str:
    """The MI command listing a thread's frames, bounded by MAX_FRAMES."""
    return f"-stack-list-frames --thread {thread} 0 {MAX_FRAMES - 1}"


def parse_threads(payload: dict[str, Any]) -> list[ThreadInfo]:
    """Threads from a -thread-info result, in gdb's order (the main thread first)."""
    threads = []
    for entry in payload.get("threads") or []:
        frame = entry.get("frame") or {}
        try:
            pc: int | None = int(str(frame.get("addr")), 16)
        except ValueError:
            pc = None
        match = _LWP_RE.search(str(entry.get("target-id", "")))
        threads.append(
            ThreadInfo(
                gdb_id=str(entry["id"]),
                lwp=int(match.group(1)) if match else None,
                name=str(entry.get("name", "")),
                pc=pc,
            )
        )
    return threads


def parse_frames(payload: dict[str, Any]) -> list[Frame]:
    """Frames from a -stack-list-frames result, innermost first."""
    frames = []
    for entry in payload.get("stack") or []:
        frame = entry.get("frame", entry) if isinstance(entry, dict) else {}
        with contextlib.suppress(ValueError, TypeError):
            frames.append(Frame(int(str(frame.get("addr")), 16), str(frame.get("func", "??"))))
    return frames


def in_allocator(libc: LibcImage, frames: list[Frame]) -> bool:
    """True when any frame is in the allocator, or when we cannot see the whole stack."""
    if not frames or len(frames) >= MAX_FRAMES:
        return True  # no frames or too deep to see the bottom: assume the worst
    for level, frame in enumerate(frames):
        # A caller frame's pc is a return address, just past its call instruction.
        pc = frame.pc if level == 0 else frame.pc - 1
        if libc.in_allocator(pc):
            return True
    return False


def _frame_words(libc: LibcImage, frame: Frame) -> str | None:
    if frame.name.startswith("<"):  # "<signal handler called>"
        return frame.name.strip("<>")
    if frame.name and frame.name != "??":
        return f"{frame.name}()"
    if libc.in_text(frame.pc):
        return f"{libc.describe(frame.pc)} in libc"
    return None


def describe_frames(libc: LibcImage, frames: list[Frame]) -> str:
    """Where a thread is, in words: the allocator function it is in, else its named frames."""
    for frame in frames:
        if libc.in_allocator(frame.pc):
            return f"{libc.describe(frame.pc)} in libc's allocator"
    named = [words for words in (_frame_words(libc, f) for f in frames[:8]) if words]
    if not frames:
        return "no frames"
    if not named:
        return f"unnamed code at {frames[0].pc:#x}"
    if len(named) == 1 or _frame_words(libc, frames[0]) is None:
        return f"in {named[0]}" if _frame_words(libc, frames[0]) else f"called from {named[0]}"
    return f"in {named[0]}, called from {named[1]}"


def describe_thread(thread: ThreadInfo) -> str:
    """'thread 2 (LWP 4321, "worker")' — gdb's number, the kernel's id and the thread's name."""
    details = [f"LWP {thread.lwp}"] if thread.lwp is not None else []
    if thread.name:
        details.append(f'"{thread.name}"')
    return (
        f"thread {thread.gdb_id} ({', '.join(details)})" if details else f"thread {thread.gdb_id}"
    )
