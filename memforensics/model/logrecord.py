"""One log message as every log source yields it: text plus what the transport knew.

A data type of the model: sources produce it, the OOM analysis consumes it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# The identifier a kernel message carries in syslog and the journal.
KERNEL = "kernel"


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One message (kernel or userspace), stripped of its transport prefix.

    ``ident`` is ``"kernel"`` for kernel messages, the syslog identifier for userspace ones
    (``systemd-oomd``, ``earlyoom``), or ``None`` when the format does not say (bare text).
    ``time`` is wall-clock UTC when known; ``uptime_seconds`` is the kernel's own timestamp
    (seconds since boot) when the log carries it. ``text`` may hold several lines: the
    journal and /dev/kmsg keep a multi-line printk as one record.
    """

    text: str
    source: str
    ident: str | None = None
    time: datetime | None = None
    uptime_seconds: float | None = None
    boot_id: str | None = None
