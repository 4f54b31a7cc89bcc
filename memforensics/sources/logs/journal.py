"""The systemd journal through the real ``journalctl``: one process for all boots, filtered
on journald's side, JSON output so that boot ids and timestamps come exact."""

from __future__ import annotations

import re
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memforensics.errors import InputDataError, TargetPermissionError, ToolingError
from memforensics.model.logrecord import KERNEL, LogRecord

# Userspace killers whose own messages we want besides the kernel's.
USERSPACE_KILLERS = ("systemd-oomd", "earlyoom")
# journald-side filter: kernel transport OR one of the killers' identifiers.
MATCHES = ("_TRANSPORT=kernel", "+", *(f"SYSLOG_IDENTIFIER={name}" for name in USERSPACE_KILLERS))
# Every line of an incident that we use (PCRE2, matched against MESSAGE). Task-table rows
# and the memcg block are included so that top tasks and cgroups survive the filter.
GREP_PATTERN = "|".join(
    (
        r"invoked oom-killer",
        r"Kill(?:ed)? process",
        r"^oom-kill:",
        r"^oom_reaper:",
        r"^Task in .* killed as a result of limit",
        r"^Tasks in .* memory\.oom\.group",
        r"^CPU: \d+ (?:UID: \d+ )?PID: \d+ Comm:",
        r"^Pid: \d+, comm:",
        r"^Tasks state",
        r"^\[ *pid *\] +uid",
        r"^\[ *\d+\] +\d+ +\d+ +\d+",
        r"^memory: usage",
        r"^Memory cgroup stats for",
        r"due to memory",
        r"for killing",
        r"sending SIG[A-Z]+ to process",
    )
)
OUTPUT_FIELDS = (
    "MESSAGE",
    "_TRANSPORT",
    "SYSLOG_IDENTIFIER",
    "_SOURCE_MONOTONIC_TIMESTAMP",
    "PRIORITY",
)
JOURNAL_DIRS = ("/var/log/journal", "/run/log/journal")
_BOOT_ID_RE = re.compile(r"^[0-9a-fA-F]{32}$")
_PERMISSION_HINT = (
    "add yourself to the 'systemd-journal' or 'adm' group (then log in again), or use sudo"
)


class BootNotFoundError(InputDataError):
    """The requested --boot is not in the journal."""

    def __init__(self, boot: str) -> None:
        super().__init__(
            f"boot {boot} is not in the journal",
            hint="list the boots with `journalctl --list-boots` (and `-D DIR` for a journal "
            "directory)",
        )
        self.boot = boot


def boot_argument(boot: str) -> list[str]:
    """journalctl arguments for ``--boot``: all (none), current (``-b 0``), an id, an offset.

    Raises ValueError for anything else.
    """
    value = boot.strip().lower()
    if value == "all":
        return []
    if value == "current":
        return ["-b", "0"]
    compact = value.replace("-", "")
    if _BOOT_ID_RE.match(compact):
        return ["-b", compact]
    if re.match(r"^[+-]?\d+$", value):
        return ["-b", value]
    raise ValueError(f"{boot!r} is not a boot (use all, current, a boot ID or an offset like -1)")


def _message_text(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) for b in value):
        # journald stores non-UTF-8 messages as byte arrays.
        return bytes(b & 0xFF for b in value).decode("utf-8", errors="replace")
    return None


def _int_field(entry: Mapping[str, Any], key: str) -> int | None:
    value = entry.get(key)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def record_from_json(entry: Mapping[str, Any], source: str) -> LogRecord | None:
    """One ``journalctl -o json`` entry as a LogRecord (None if it has no usable MESSAGE)."""
    text = _message_text(entry.get("MESSAGE"))
    if text is None:
        return None
    transport = entry.get("_TRANSPORT")
    identifier = entry.get("SYSLOG_IDENTIFIER")
    ident: str | None
    if transport == KERNEL:
        ident = KERNEL
    elif isinstance(identifier, str):
        ident = identifier
    else:
        ident = "userspace"
    realtime = _int_field(entry, "__REALTIME_TIMESTAMP")
    monotonic = _int_field(entry, "_SOURCE_MONOTONIC_TIMESTAMP")
    boot = entry.get("_BOOT_ID")
    return LogRecord(
        text=text,
        source=source,
        ident=ident,
        time=datetime.fromtimestamp(realtime / 1_000_000, tz=timezone.utc)
        if realtime is not None
        else None,
        uptime_seconds=monotonic / 1_000_000 if monotonic is not None and ident == KERNEL else None,
        boot_id=boot if isinstance(boot, str) else None,
    )


def has_journal_files(directory: str | None) -> bool:
    """Whether any ``*.journal`` file exists where journalctl will look."""
    roots = [directory] if directory else list(JOURNAL_DIRS)
    for root in roots:
        path = Path(root)
        try:
            if any(path.rglob("*.journal")) or any(path.rglob("*.journal~")):
                return True
        except OSError:
            # Unreadable directory: journalctl will say so (and we map that to exit 4).
            return True
    return False


@dataclass
class JournalReader:
    """Runs journalctl once and yields its matching entries as LogRecords.

    ``notes`` collects what a user should know (no journal at all, grep unsupported).
    """

    directory: str | None = None
    boot: str = "all"
    since: datetime | None = None
    until: datetime | None = None
    journalctl: str = "journalctl"
    use_grep: bool = True
    notes: list[str] = field(default_factory=list)

    @property
    def source(self) -> str:
        return f"journal:{self.directory}" if self.directory else "journal"

    def argv(self) -> list[str]:
        """The exact journalctl command line this reader runs."""
        args = [
            self.journalctl,
            "--no-pager",
            "--all",
            "--output=json",
            f"--output-fields={','.join(OUTPUT_FIELDS)}",
        ]
        if self.directory:
            args.append(f"--directory={self.directory}")
        args += boot_argument(self.boot)
        if self.since is not None:
            args.append(f"--since=@{self.since.timestamp():.6f}")
        if self.until is not None:
            args.append(f"--until=@{self.until.timestamp():.6f}")
        if self.use_grep:
            args += ["--case-sensitive=true", f"--grep={GREP_PATTERN}"]
        args += list(MATCHES)
        return args

    def records(self) -> Iterator[LogRecord]:
        """Run journalctl and yield records; raises the documented errors on failure."""
        import shutil  # here, not at the top, like subprocess: start-up of `oom --file` counts

        executable = shutil.which(self.journalctl)
        if executable is None:
            raise ToolingError(
                f"{self.journalctl} not found",
                hint="install systemd's journalctl, or read saved text logs or the kernel "
                "ring buffer instead",
            )
        if not has_journal_files(self.directory):
            where = self.directory or " or ".join(JOURNAL_DIRS)
            self.notes.append(f"no journal files found in {where}: nothing to scan")
            return
        returncode, stderr = yield from self._run()
        if self._check(returncode, stderr):
            returncode, stderr = yield from self._run()
            self._check(returncode, stderr)

    def _run(self) -> Generator[LogRecord, None, tuple[int, str]]:
        import json
        import subprocess
        import tempfile  # here, not at the top: start-up time of `oom --file` counts

        with tempfile.TemporaryFile() as errors:
            proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=errors,
            )
            assert proc.stdout is not None
            finished = False
            try:
                for raw in proc.stdout:
                    try:
                        entry = json.loads(raw)
                    except ValueError:
                        continue
                    if isinstance(entry, dict):
                        record = record_from_json(entry, self.source)
                        if record is not None:
                            yield record
                finished = True
            finally:
                proc.stdout.close()
                if not finished and proc.poll() is None:
                    proc.kill()  # our consumer stopped early (Ctrl-C, error): don't leave it
                returncode = proc.wait()
            errors.seek(0)
            stderr = errors.read().decode("utf-8", errors="replace")
        return returncode, stderr

    def _check(self, returncode: int, stderr: str) -> bool:
        """Raise the documented error for a failed run; True if it must run again."""
        lowered = stderr.lower()
        if "pattern matching" in lowered and self.use_grep:
            # journalctl built without PCRE2: filter on our side instead.
            self.use_grep = False
            self.notes.append("journalctl has no --grep support; filtered by memforensics")
            return True
        if "not available" in lowered and "boot" in lowered:
            raise BootNotFoundError(self.boot)
        if "permission denied" in lowered or "insufficient permissions" in lowered:
            raise TargetPermissionError(
                f"cannot read the journal: {_first_line(stderr)}", hint=_PERMISSION_HINT
            )
        if "not seeing messages from other users and the system" in lowered:
            raise TargetPermissionError(
                "cannot read the system journal (kernel messages live there)",
                hint=_PERMISSION_HINT,
            )
        if returncode != 0:
            raise ToolingError(
                f"journalctl failed (exit {returncode}): {_first_line(stderr) or 'no message'}",
                hint="check the journal files with `journalctl --verify`",
            )
        return False


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""
