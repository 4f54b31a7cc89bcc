"""What the watchdog needs to finish a call gdb abandoned: the call dummy and the caller's state.

gdb (x86-64 Linux) returns from every call it makes to a breakpoint at the program's entry
point (AT_ENTRY in /proc/PID/auxv), the one place it assumes is never executed again. The
registers gdb restores after a call are those of the caller at the safe point: we read them
once, in gdb's raw format, for the watchdog's guardian (sources/gdb/guardian.py).
"""

from __future__ import annotations

import re
import struct
from typing import Any

from memforensics.sources.gdb.user_regs import USER_REGS

_AT_ENTRY = 9
_HEX_RE = re.compile(r"0x[0-9a-fA-F]+")
_UINT128_RE = re.compile(r"uint128 = (0x[0-9a-fA-F]+)")
_SEGMENTS = {"cs", "ss", "ds", "es", "fs", "gs"}

# Registers a call may change (caller-saved or moved by gdb), by gdb's names.
SAVED_REGISTER_NAMES = frozenset(
    [name for name in USER_REGS if name not in _SEGMENTS]
    + ["mxcsr"]
    + [f"xmm{i}" for i in range(32)]
    + [f"ymm{i}h" for i in range(32)]
    + [f"zmm{i}h" for i in range(32)]
    + [f"k{i}" for i in range(8)]
)


def entry_point(pid: int) -> int | None:
    """The program's entry point (gdb's call-dummy address), from /proc/PID/auxv."""
    try:
        with open(f"/proc/{pid}/auxv", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    for offset in range(0, len(data) - 15, 16):
        kind, value = struct.unpack_from("<QQ", data, offset)
        if kind == _AT_ENTRY:
            return int(value)
    return None


def register_numbers(names_payload: dict[str, Any]) -> dict[int, str]:
    """gdb's register number -> name, for the registers the watchdog restores."""
    names = names_payload.get("register-names") or []
    return {i: str(n) for i, n in enumerate(names) if n in SAVED_REGISTER_NAMES}


def parse_register_value(text: str) -> int | None:
    """A raw value as gdb prints it: a hex number, a union ending in uint128, or {lo, hi}."""
    text = text.strip()
    union = _UINT128_RE.search(text)
    if union:
        return int(union.group(1), 16)
    if text.startswith("{"):
        parts = [int(h, 16) for h in _HEX_RE.findall(text)]
        return sum(part << (128 * i) for i, part in enumerate(parts)) if parts else None
    try:
        return int(text, 16)
    except ValueError:
        return None


def saved_registers(values_payload: dict[str, Any], numbers: dict[int, str]) -> dict[str, int]:
    """name -> value from a -data-list-register-values result."""
    saved: dict[str, int] = {}
    for entry in values_payload.get("register-values") or []:
        name = numbers.get(int(entry.get("number", -1)))
        value = parse_register_value(str(entry.get("value", "")))
        if name is not None and value is not None:
            saved[name] = value
    return saved


def guardian_line(tid: int, saved: dict[str, int]) -> str:
    """The ``regs`` line the watchdog understands."""
    return f"regs {tid} " + " ".join(f"{name}={value:x}" for name, value in saved.items())
