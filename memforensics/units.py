"""Human units for byte sizes and durations: parse what users type, format what they read."""

from __future__ import annotations

import re

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtpe]?)(i?)(b?)\s*$", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6}
_BINARY_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*$", re.IGNORECASE)
_DURATION_SCALE = {"ms": 0.001, "s": 1.0, "": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def parse_size(text: str) -> int:
    """Parse ``4096``, ``512KiB``, ``1.5G`` or ``2MB`` into bytes.

    Both ``K`` and ``KiB`` mean 1024: this is about memory, where nobody means 1000.
    Raises ValueError with a readable message on anything else.
    """
    match = _SIZE_RE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (try 4096, 512KiB, 64MiB or 2GiB)")
    number, prefix, _, _ = match.groups()
    value = float(number) * (1024 ** _POWERS[prefix.lower()])
    return int(value)


def format_bytes(count: int | float | None, *, signed: bool = False) -> str:
    """Format a byte count as ``12.3 MiB``; ``None`` (unknown) as ``n/a``."""
    if count is None:
        return "n/a"
    sign = ""
    if count < 0:
        sign = "-"
        count = -count
    elif signed:
        sign = "+"
    value = float(count)
    unit = 0
    while value >= 1024 and unit < len(_BINARY_UNITS) - 1:
        value /= 1024
        unit += 1
    if unit == 0:
        return f"{sign}{int(value)} B"
    return f"{sign}{value:.1f} {_BINARY_UNITS[unit]}"


def parse_duration(text: str) -> float:
    """Parse ``30s``, ``500ms``, ``2m``, ``1h`` or a bare number of seconds into seconds."""
    match = _DURATION_RE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (try 500ms, 10s, 5m or 1h)")
    number, unit = match.groups()
    return float(number) * _DURATION_SCALE[(unit or "").lower()]


def format_duration(seconds: float) -> str:
    """Format seconds as ``14 ms`` below a second and ``2.35 s`` above."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms" if seconds >= 0.001 else f"{seconds * 1000:.2f} ms"
    return f"{seconds:.2f} s"
