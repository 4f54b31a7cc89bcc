"""Library entry point for OOM kills: look everywhere a host keeps its kernel log.

``scan_default()`` reads the system journal when it has files; otherwise /dev/kmsg (this
boot) plus the syslog files /var/log/kern.log*, syslog* and messages* (rotated and compressed
ones too). A kill seen in two sources is reported once, and the scan names every source it
read and, in its notes, what it looked for and could not read. ``cli/oom.py`` and anything
that counts kills (a metrics collector with a time cursor) call this.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from pathlib import Path

from memforensics.analysis.oom_select import scan
from memforensics.errors import MemforensicsError
from memforensics.model.logrecord import LogRecord
from memforensics.model.oom import OomScan
from memforensics.sources.logs import journal
from memforensics.sources.logs.kmsg import KMSG_PATH, KmsgReader
from memforensics.sources.logs.logfile import read_text_log

LOG_DIR = "/var/log"
SYSLOG_NAMES = ("kern.log", "syslog", "messages")
# kern.log, kern.log.1, kern.log.2.gz, messages-20240101, messages-20240101.xz ...
_ROTATED_RE = re.compile(
    r"^(?P<base>kern\.log|syslog|messages)(?:\.(?P<number>\d+)|-(?P<date>\d{8}))?"
    r"(?:\.(?:gz|xz|bz2|zst))?$"
)

__all__ = ["LOG_DIR", "SYSLOG_NAMES", "OomScan", "scan_default", "syslog_files"]


def syslog_files(log_dir: str = LOG_DIR) -> list[Path]:
    """kern.log*, syslog*, messages* in ``log_dir``, each family oldest first."""
    try:
        entries = list(Path(log_dir).iterdir())
    except OSError:
        return []
    ranked: list[tuple[int, tuple[int, str], Path]] = []
    for path in entries:
        match = _ROTATED_RE.match(path.name)
        if match is None or not path.is_file():
            continue
        family = SYSLOG_NAMES.index(match.group("base"))
        if match.group("date"):
            rank = (0, match.group("date"))  # dated rotations: oldest date first
        elif match.group("number"):
            rank = (1, f"{10**9 - int(match.group('number')):010d}")  # .9 before .1
        else:
            rank = (2, "")  # the live file is the newest
        ranked.append((family, rank, path))
    ranked.sort(key=lambda item: (item[0], item[1]))
    return [path for _, _, path in ranked]


def scan_default(
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    process: str | None = None,
    journal_dirs: Sequence[str] = journal.JOURNAL_DIRS,
    log_dir: str = LOG_DIR,
    kmsg_path: str = KMSG_PATH,
) -> OomScan:
    """Every OOM kill this host logged, from wherever it keeps kernel messages.

    ``since``/``until`` bound the kill times (aware datetimes); ``process`` is a glob on the
    victim's name. ``journal_dirs``, ``log_dir`` and ``kmsg_path`` say where to look (the
    system's places by default). Raises the journal's errors (permission: exit 4; journalctl
    missing: exit 5) when the journal has files; other sources that cannot be read are named
    in the scan's notes instead.
    """
    with_files = [d for d in journal_dirs if journal.has_journal_files(d)]
    if with_files:
        directory = None if tuple(journal_dirs) == journal.JOURNAL_DIRS else with_files[0]
        reader = journal.JournalReader(directory=directory, since=since, until=until)
        result = scan(
            [(reader.source, reader.records())], since=since, until=until, process=process
        )
        return OomScan(result.events, result.sources, (*reader.notes, *result.notes))
    notes = [f"no journal files in {' or '.join(journal_dirs)}"]
    streams: list[tuple[str, Iterable[LogRecord]]] = []
    for path in syslog_files(log_dir):
        try:
            streams.append((str(path), read_text_log(str(path))))
        except MemforensicsError as exc:
            notes.append(f"skipped {exc.message}")
    if not streams:
        notes.append(f"no readable {', '.join(f'{name}*' for name in SYSLOG_NAMES)} in {log_dir}")
    kmsg = KmsgReader(path=kmsg_path)
    streams.append((kmsg.source, _kmsg_records(kmsg, notes)))
    result = scan(streams, since=since, until=until, process=process)
    if kmsg.lost_records:
        notes.append(f"{kmsg_path} overwrote records before they were read ({kmsg.lost_records}x)")
    sources = tuple(name for name in result.sources if name != kmsg.source or kmsg.opened)
    return OomScan(result.events, sources, (*notes, *result.notes))


def _kmsg_records(reader: KmsgReader, notes: list[str]) -> Iterable[LogRecord]:
    """The ring buffer's records; a missing or unreadable /dev/kmsg becomes a note."""
    try:
        yield from reader.records()
    except MemforensicsError as exc:
        notes.append(f"skipped {exc.message}")
