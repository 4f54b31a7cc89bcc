"""One line of saved log text -> LogRecord, for every text shape we read: dmesg (plain, -T,
-x, iso, caller ids), syslog/kern.log/messages (with or without a year or hostname),
journalctl short/short-precise/short-iso/short-monotonic/json/verbose/export in any locale,
raw /dev/kmsg records.

Most shapes are one line per message; journalctl's verbose and export outputs spread one
entry over several lines, so ``LineParser`` keeps a little state between adjacent lines.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from memforensics.model.logrecord import KERNEL, LogRecord
from memforensics.sources.logs import kmsg
from memforensics.sources.logs.logtime import parse_ctime, parse_iso, parse_syslog_date

_UPTIME_RE = re.compile(r"^\[\s*(\d+\.\d+)\](?:\[\s*[TC]\d+\])? ?")
_CTIME_RE = re.compile(r"^\[([^\]]*?\d{1,2}:\d{2}:\d{2}[^\]]*)\](?:\[\s*[TC]\d+\])? ?")
_CALLER_RE = re.compile(r"^\[\s*[TC]\d+\] ?")
_DMESG_X_RE = re.compile(
    r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|local\d)\s*:"
    r"(?:emerg|alert|crit|err|warn|notice|info|debug)\s*: ?"
)
# "Mar  5 11:22:33 host ident[pid]: ", journalctl short(-precise) in any locale (ja_JP and
# ko_KR print the month as " 3月" with a leading space), optionally a year before the month or
# after the clock, optionally no hostname.
_SYSLOG_RE = re.compile(
    r"^\s*(?:(?P<year0>\d{4}) )?(?P<month>\S+)\s+(?P<day>\d{1,2})\s+"
    r"(?P<clock>\d{1,2}:\d{2}:\d{2}(?:\.\d+)?) (?:(?P<year1>\d{4}) )?(?:(?P<host>\S+) )??"
    r"(?P<ident>[^\s\[\]:]+)(?:\[\d+\])?: ?"
)
_ISO_SYSLOG_RE = re.compile(
    r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?) (?:(\S+) )??"
    r"([^\s\[\]:]+)(?:\[\d+\])?: ?"
)
# journalctl -o short-full: "Fri 2024-05-10 14:52:39 UTC host ident[pid]: " (the zone is an
# abbreviation: UTC is exact, others are read as local time).
_SHORT_FULL_RE = re.compile(
    r"^[^\W\d]+\.? (?P<stamp>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?) (?P<zone>[A-Z]{2,5}) "
    r"(?:(?P<host>\S+) )??(?P<ident>[^\s\[\]:]+)(?:\[\d+\])?: ?"
)
_ISO_DMESG_RE = re.compile(r"^(\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2},\d+[+-]\d{2}:?\d{2}) ")
# The facilities dmesg -x prints first (_DMESG_X_RE).
_FACILITIES = (
    "kern",
    "user",
    "mail",
    "daemon",
    "auth",
    "syslog",
    "lpr",
    "news",
    "uucp",
    "cron",
    "ftp",
    "local",
)
_KERNEL_IDENTS = frozenset({KERNEL, "vmunix", "genunix"})
# "ident[pid]: " (or "kernel: ") after a short-monotonic uptime stamp.
_USERSPACE_RE = re.compile(r"^(?:([A-Za-z][\w.@-]*)\[\d+\]|(kernel)): ")


def _strip_kernel_prefix(text: str) -> tuple[str, float | None]:
    """Remove a ``[  123.456789]`` uptime (and printk caller id) that syslog kept."""
    match = _UPTIME_RE.match(text)
    if match:
        return text[match.end() :], float(match.group(1))
    caller = _CALLER_RE.match(text)
    if caller:
        return text[caller.end() :], None
    return text, None


def _json_record(line: str, source: str) -> LogRecord | None:
    try:
        entry = json.loads(line)
    except ValueError:
        return None
    if not isinstance(entry, dict):
        return None
    from memforensics.sources.logs.journal import record_from_json  # same layer; avoids a cycle

    return record_from_json(entry, source)


def parse_line(line: str, source: str, reference: datetime) -> LogRecord | None:
    """Parse one saved log line in any supported format; None for lines that carry nothing."""
    if not line:
        return None
    first = line[0]
    if first == "{":
        return _json_record(line, source)
    if first.isdigit():
        numbered = _numbered_line(line, source)
        if numbered is not None:
            return numbered
    if first == "[":
        bracketed = _bracketed_line(line, source)
        if bracketed is not None:
            return bracketed
    if first.isalpha() and not line.startswith(_FACILITIES):
        # The commonest shape (kern.log, syslog, messages, journalctl short) first. Where it
        # matches, the two tried before it below cannot: short-full's second word is a
        # date, not a day, and dmesg -x lines start with a facility.
        syslog = _SYSLOG_RE.match(line)
        if syslog:
            return _syslog_match(syslog, line, source, reference)
    full = _SHORT_FULL_RE.match(line) if first.isalpha() else None
    if full:
        stamp_text = full.group("stamp").replace(" ", "T")
        if full.group("zone") in ("UTC", "GMT"):
            stamp_text += "Z"
        return _syslog_record(
            line[full.end() :], source, full.group("ident"), parse_iso(stamp_text)
        )
    dmesg_x = _DMESG_X_RE.match(line)
    if dmesg_x:
        rest = line[dmesg_x.end() :]
        inner = parse_line(rest, source, reference) if rest[:1] == "[" else None
        return inner or LogRecord(rest, source, KERNEL)
    syslog = _SYSLOG_RE.match(line)
    if syslog:
        return _syslog_match(syslog, line, source, reference)
    return LogRecord(line, source, None)


def _numbered_line(line: str, source: str) -> LogRecord | None:
    """A line that starts with a digit: a /dev/kmsg record, dmesg's or syslog's ISO time."""
    record = kmsg.parse_record(line)
    if record is not None:
        ident, text = kmsg.split_userspace(record)
        return LogRecord(text, source, ident, None, record.uptime_seconds)
    iso = _ISO_DMESG_RE.match(line)
    if iso:
        text, uptime = _strip_kernel_prefix(line[iso.end() :])
        return LogRecord(text, source, KERNEL, parse_iso(iso.group(1)), uptime)
    iso_syslog = _ISO_SYSLOG_RE.match(line)
    if iso_syslog:
        return _syslog_record(
            line[iso_syslog.end() :],
            source,
            iso_syslog.group(3),
            parse_iso(iso_syslog.group(1)),
        )
    return None


def _bracketed_line(line: str, source: str) -> LogRecord | None:
    """A line that starts with ``[``: dmesg's uptime (journalctl's short-monotonic too,
    userspace behind it) or dmesg -T's ctime."""
    uptime_match = _UPTIME_RE.match(line)
    if uptime_match:
        text = line[uptime_match.end() :]
        uptime = float(uptime_match.group(1))
        # journalctl -o short-monotonic puts userspace lines behind an uptime too.
        userspace = _USERSPACE_RE.match(text)
        if userspace and userspace.group(1) is not None:
            return LogRecord(text[userspace.end() :], source, userspace.group(1), None, uptime)
        if userspace:
            text = text[userspace.end() :]
        return LogRecord(text, source, KERNEL, None, uptime)
    ctime = _CTIME_RE.match(line)
    if ctime:
        return LogRecord(line[ctime.end() :], source, KERNEL, parse_ctime(ctime.group(1)))
    return None


def _syslog_match(syslog: re.Match[str], line: str, source: str, reference: datetime) -> LogRecord:
    year = syslog.group("year0") or syslog.group("year1")
    stamp = parse_syslog_date(
        syslog.group("month"),
        syslog.group("day"),
        syslog.group("clock"),
        reference,
        year=int(year) if year else None,
    )
    return _syslog_record(line[syslog.end() :], source, syslog.group("ident"), stamp)


def _syslog_record(text: str, source: str, ident: str, stamp: datetime | None) -> LogRecord:
    if "#0" in text:
        # rsyslog escapes control characters: a multi-line printk arrives with #012.
        text = text.replace("#012", "\n").replace("#011", "\t")
    if ident in _KERNEL_IDENTS:
        stripped, uptime = _strip_kernel_prefix(text)
        return LogRecord(stripped, source, KERNEL, stamp, uptime)
    return LogRecord(text, source, ident, stamp)


# journalctl -o verbose: "Thu 2024-05-09 14:52:38.123456 CEST [s=…;i=…;b=<boot>;m=…;t=<µs>;…]"
# (t= in hex) then "    FIELD=value" lines; the t= field is the exact realtime stamp.
_VERBOSE_HEADER_RE = re.compile(
    r"^\S.*\[s=[0-9a-f]+;i=[0-9a-f]+;b=([0-9a-f]{32});m=[0-9a-f]+;t=([0-9a-f]+);"
)
_FIELD_RE = re.compile(r"^ *([A-Z_][A-Z0-9_]*)=(.*)$")
# journalctl -o export: a field whose value holds a newline is "NAME\n<le64 length><data>\n".
_BINARY_FIELD_RE = re.compile(r"^[A-Z_][A-Z0-9_]*$")


class LineParser:
    """Parses the lines of one text log in order; carries journalctl verbose/export entries.

    ``gap()`` says the next line is not adjacent to the last one (the prefilter skipped lines);
    ``finish()`` returns a message still being collected at the end.
    """

    def __init__(self, source: str, reference: datetime) -> None:
        self.source = source
        self.reference = reference
        self._fields: dict[str, str] = {}
        self._in_entry = False
        self._binary: list[str] | None = None

    @property
    def collecting(self) -> bool:
        """Inside a multi-line journal export value: every line counts."""
        return self._binary is not None

    def gap(self) -> LogRecord | None:
        """The next line does not follow the last one; returns a message cut short there."""
        record = self._flush_binary()
        self._fields = {}
        self._in_entry = False
        return record

    def finish(self) -> LogRecord | None:
        return self._flush_binary()

    def parse(self, line: str) -> LogRecord | None:
        """The record this line completes, if any."""
        if self._binary is not None:
            if line and not _FIELD_RE.match(line) and not _BINARY_FIELD_RE.match(line):
                # The first line starts with the 8-byte length of the binary value.
                self._binary.append(line if self._binary else line[8:])
                return None
            record = self._flush_binary()
            self._field_line(line)
            return record
        if not line:
            self._fields = {}
            self._in_entry = False
            return None
        if ("=" in line[:48] and _FIELD_RE.match(line)) or (
            self._in_entry and _BINARY_FIELD_RE.match(line)
        ):
            # An export or verbose field, also where the prefilter's window starts mid-entry.
            self._in_entry = True
            return self._field_line(line.lstrip(" "))
        verbose = _VERBOSE_HEADER_RE.match(line) if " [s=" in line else None
        if verbose:
            self._fields = {
                "_BOOT_ID": verbose.group(1),
                "__REALTIME_TIMESTAMP": str(int(verbose.group(2), 16)),
            }
            self._in_entry = True
            return None
        return parse_line(line, self.source, self.reference)

    def _field_line(self, line: str) -> LogRecord | None:
        if _BINARY_FIELD_RE.match(line):
            if line == "MESSAGE":
                self._binary = []
            return None
        field = _FIELD_RE.match(line)
        if field is None:
            return None
        name, value = field.groups()
        if name == "MESSAGE":
            return self._entry_record(value)
        self._fields[name] = value
        return None

    def _flush_binary(self) -> LogRecord | None:
        if self._binary is None:
            return None
        text = "\n".join(self._binary)
        self._binary = None
        return self._entry_record(text) if text else None

    def _entry_record(self, text: str) -> LogRecord:
        fields = self._fields
        ident: str | None = None
        if fields.get("_TRANSPORT") == KERNEL:
            ident = KERNEL
        elif "SYSLOG_IDENTIFIER" in fields:
            ident = fields["SYSLOG_IDENTIFIER"]
        realtime = fields.get("__REALTIME_TIMESTAMP", "")
        time = (
            datetime.fromtimestamp(int(realtime) / 1_000_000, tz=timezone.utc)
            if realtime.isdigit()
            else None
        )
        boot = fields.get("_BOOT_ID")
        return LogRecord(text, self.source, ident, time, None, boot)
