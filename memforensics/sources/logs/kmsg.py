"""The live kernel ring buffer through /dev/kmsg, and the parsing of its record format.

Record format (Documentation/ABI/testing/dev-kmsg): ``prio,seq,usec,flags[,caller=T42];text``
followed by optional `` KEY=value`` continuation lines; non-printable bytes are ``\\xNN``.
Times: usec is the kernel's printk clock since boot; like ``dmesg -T`` we add the boot time
(now on CLOCK_REALTIME minus CLOCK_BOOTTIME), which drifts after suspend/resume.
"""

from __future__ import annotations

import errno
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

from memforensics.errors import TargetPermissionError, ToolingError
from memforensics.model.logrecord import KERNEL, LogRecord

KMSG_PATH = "/dev/kmsg"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
# One record is at most ~8 KiB (PRINTK_MESSAGE_MAX 2048 + dict); a short buffer gives EINVAL.
_READ_BYTES = 16384
_HEADER_RE = re.compile(r"^(\d+),(\d+),(\d+),[^;]*;")
_ESCAPE_RE = re.compile(r"\\x([0-9a-fA-F]{2})")


@dataclass(frozen=True, slots=True)
class KmsgRecord:
    """One parsed /dev/kmsg record header and its unescaped text."""

    priority: int
    facility: int
    sequence: int
    uptime_seconds: float
    text: str


def unescape(text: str) -> str:
    """Undo /dev/kmsg's ``\\xNN`` escaping (newlines inside one record come as ``\\x0a``)."""
    if "\\x" not in text:
        return text
    return _ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), text)


def parse_record(line: str) -> KmsgRecord | None:
    """Parse ``prio,seq,usec,flags;text``; None for continuation lines or anything else."""
    match = _HEADER_RE.match(line)
    if not match:
        return None
    level_facility = int(match.group(1))
    return KmsgRecord(
        priority=level_facility & 7,
        facility=level_facility >> 3,
        sequence=int(match.group(2)),
        uptime_seconds=int(match.group(3)) / 1_000_000,
        text=unescape(line[match.end() :]),
    )


_USERSPACE_RE = re.compile(r"^([^\s\[:]+)(?:\[\d+\])?: ")


def split_userspace(record: KmsgRecord) -> tuple[str, str]:
    """(ident, text): facility 0 is the kernel; others are userspace writes to /dev/kmsg
    (``systemd[1]: …``) whose ident we take from the text (``"userspace"`` if it has none,
    so that it is never mistaken for a kernel message)."""
    if record.facility == 0:
        return KERNEL, record.text
    match = _USERSPACE_RE.match(record.text)
    if match:
        return match.group(1), record.text[match.end() :]
    return "userspace", record.text


def boot_id() -> str | None:
    """This boot's id as the journal writes it (32 hex digits, no dashes), if readable."""
    try:
        return Path(BOOT_ID_PATH).read_text().strip().replace("-", "")
    except OSError:
        return None


def boot_time() -> datetime:
    """Wall-clock time of boot: CLOCK_REALTIME minus CLOCK_BOOTTIME (what ``dmesg -T`` uses)."""
    now = time.clock_gettime(time.CLOCK_REALTIME)
    since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    return datetime.fromtimestamp(now - since_boot, tz=timezone.utc)


@dataclass
class KmsgReader:
    """Reads every record currently in the ring buffer, oldest first, without blocking."""

    path: str = KMSG_PATH
    lost_records: int = 0
    opened: bool = False

    @property
    def source(self) -> str:
        """The name its records carry: ``kmsg``, or ``kmsg:PATH`` for another device."""
        return "kmsg" if self.path == KMSG_PATH else f"kmsg:{self.path}"

    def records(self) -> Iterator[LogRecord]:
        """Yield the buffer's records as LogRecords (kernel ident, this boot's id)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        except FileNotFoundError as exc:
            raise ToolingError(
                f"{self.path} does not exist",
                hint="this container has no kernel log device; read saved dmesg output, "
                "or run on the host",
            ) from exc
        except PermissionError as exc:
            raise TargetPermissionError(
                f"cannot read {self.path}: permission denied",
                hint="kernel.dmesg_restrict=1 needs root or CAP_SYSLOG (sudo), "
                "or read the journal instead",
            ) from exc
        self.opened = True
        this_boot = boot_id()
        booted_at = boot_time()
        try:
            while True:
                try:
                    raw = os.read(fd, _READ_BYTES)
                except BlockingIOError:
                    return  # EAGAIN: we have read everything that was there
                except OSError as exc:
                    if exc.errno == errno.EPIPE:
                        # The ring buffer overwrote records before we read them; go on.
                        self.lost_records += 1
                        continue
                    if exc.errno == errno.EPERM:
                        raise TargetPermissionError(
                            f"cannot read {self.path}: permission denied",
                            hint="kernel.dmesg_restrict=1 needs root or CAP_SYSLOG (sudo)",
                        ) from exc
                    raise ToolingError(f"reading {self.path} failed: {exc.strerror}") from exc
                if not raw:
                    return
                header = raw.decode("utf-8", errors="replace").split("\n", 1)[0]
                record = parse_record(header)
                if record is None:
                    continue
                ident, text = split_userspace(record)
                yield LogRecord(
                    text=text,
                    source=self.source,
                    ident=ident,
                    time=booted_at + timedelta(seconds=record.uptime_seconds),
                    uptime_seconds=record.uptime_seconds,
                    boot_id=this_boot,
                )
        finally:
            os.close(fd)
