"""The one reader of /proc/PID/maps and /proc/PID/smaps: a process's mappings as data."""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from memforensics.errors import NoSuchProcessError, TargetPermissionError
from memforensics.sources.proc import smaps_ahead

_DELETED_SUFFIX = " (deleted)"


@dataclass(frozen=True)
class Mapping:
    """One line of /proc/PID/maps, with smaps' Rss/Anonymous when read from smaps."""

    start_address: int
    end_address: int
    perms: str
    offset_bytes: int
    inode: int
    path: str  # "" for anonymous memory; "[heap]", "[stack]"…; the file without " (deleted)"
    deleted: bool = False  # the file was replaced or removed on disk after it was mapped
    rss_bytes: int | None = None  # smaps only
    anon_bytes: int | None = None  # smaps only

    @property
    def size_bytes(self) -> int:
        return self.end_address - self.start_address

    @property
    def anonymous(self) -> bool:
        return self.inode == 0 and (not self.path or self.path.startswith("[anon"))

    @property
    def file_backed(self) -> bool:
        return self.path.startswith("/")


# A maps line: start-end perms offset dev inode [path]; the path may hold spaces.
_HEADER = r"([0-9a-f]+)-([0-9a-f]+) +(\S+) +([0-9a-f]+) +\S+ +(\d+)(?: +([^\n]*))?"
_MAPS_LINE = re.compile(rf"^{_HEADER}$", re.MULTILINE)
# smaps: the header lines and the two fields read from each entry; the regex skips the rest.
_FILE_PATH = re.compile(r"^[0-9a-f]+-[0-9a-f]+ +\S+ +[0-9a-f]+ +\S+ +\d+ +(/[^\n]*)$", re.MULTILINE)
_SMAPS_LINE = re.compile(rf"^(?:{_HEADER}|Rss: +(\d+) kB|Anonymous: +(\d+) kB)$", re.MULTILINE)
# The fields of smaps_rollup that memory_figures reads, as smaps gives them per mapping.
_ROLLUP_LINE = re.compile(
    r"^(Rss|Pss|Anonymous|Swap|Private_Clean|Private_Dirty): +(\d+) kB$", re.MULTILINE
)


def _mapping(
    fields: tuple[str | None, ...], rss_bytes: int | None = None, anon_bytes: int | None = None
) -> Mapping:
    """A Mapping of one header line's groups (start, end, perms, offset, inode, path)."""
    lo, hi, perms, offset, inode, raw_path = fields[:6]
    path = (raw_path or "").strip()
    deleted = path.endswith(_DELETED_SUFFIX)
    return Mapping(
        start_address=int(lo or "0", 16),
        end_address=int(hi or "0", 16),
        perms=perms or "",
        offset_bytes=int(offset or "0", 16),
        inode=int(inode or "0"),
        path=path.removesuffix(_DELETED_SUFFIX),
        deleted=deleted,
        rss_bytes=rss_bytes,
        anon_bytes=anon_bytes,
    )


def parse_maps_line(line: str) -> Mapping | None:
    """A maps/smaps header line as a Mapping; None for any other line (smaps' field lines)."""
    match = _MAPS_LINE.match(line.rstrip("\n"))
    return None if match is None else _mapping(match.groups())


def parse_maps(text: str) -> list[Mapping]:
    """Every mapping of a /proc/PID/maps text, in address order."""
    return [_mapping(match.groups()) for match in _MAPS_LINE.finditer(text)]


def file_paths(text: str) -> list[str]:
    """The distinct file paths of a /proc/PID/maps text (``Mapping.file_backed`` ones, without
    " (deleted)"), in address order: what ``parse_maps`` would give, without a Mapping per
    line (a process of thousands of threads maps thousands of stacks)."""
    paths = (p.strip().removesuffix(_DELETED_SUFFIX) for p in _FILE_PATH.findall(text))
    return list(dict.fromkeys(p for p in paths if p.startswith("/")))


def parse_smaps(text: str) -> list[Mapping]:
    """Every mapping of a /proc/PID/smaps text, with its Rss and Anonymous bytes (0 where
    the entry has no such line)."""
    mappings: list[Mapping] = []
    header: tuple[str | None, ...] | None = None
    rss_bytes = anon_bytes = 0
    for match in _SMAPS_LINE.finditer(text):
        groups = match.groups()
        if groups[0] is not None:
            if header is not None:
                mappings.append(_mapping(header, rss_bytes, anon_bytes))
            header, rss_bytes, anon_bytes = groups, 0, 0
        elif groups[6] is not None:
            rss_bytes = int(groups[6]) * 1024
        elif groups[7] is not None:
            anon_bytes = int(groups[7]) * 1024
    if header is not None:
        mappings.append(_mapping(header, rss_bytes, anon_bytes))
    return mappings


def _read_proc_text(pid: int, name: str) -> str:
    try:
        with open(f"/proc/{pid}/{name}", "rb") as handle:
            return handle.read().decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError) as exc:
        raise NoSuchProcessError(f"no process with PID {pid}", pid=pid) from exc
    except PermissionError as exc:
        raise TargetPermissionError(
            f"cannot read /proc/{pid}/{name}: permission denied", pid=pid
        ) from exc


def read_maps(pid: int) -> list[Mapping]:
    """The mappings of a live process (cheap: no page-table walk)."""
    return parse_maps(_read_proc_text(pid, "maps"))


def mappings_of(text: str, path: str) -> list[Mapping]:
    """The mappings of ``path`` in a /proc/PID/maps text: only the lines that name the path
    are parsed."""
    lines = [line for line in text.splitlines() if path in line]
    return [m for m in map(parse_maps_line, lines) if m is not None and m.path == path]


def read_maps_of(pid: int, path: str) -> tuple[bool, list[Mapping]]:
    """(whether PID maps anything at all, its mappings of ``path``)."""
    text = _read_proc_text(pid, "maps")
    return bool(text.strip()), mappings_of(text, path)


def read_smaps(pid: int) -> list[Mapping]:
    """The mappings of a live process with Rss/Anonymous (walks the page tables)."""
    return parse_smaps(_read_proc_text(pid, "smaps"))


def smaps_totals(text: str) -> dict[str, int]:
    """Rss, Pss, Anonymous, Swap, Private_Clean and Private_Dirty of a /proc/PID/smaps text
    summed over its mappings, in bytes: what smaps_rollup says of that moment (each mapping's
    Pss truncated to a kB; a field no mapping has is absent)."""
    totals: dict[str, int] = {}
    for key, kib in _ROLLUP_LINE.findall(text):
        totals[key] = totals.get(key, 0) + int(kib) * 1024
    return totals


def read_smaps_and_totals(pid: int) -> tuple[list[Mapping], dict[str, int]]:
    """read_smaps and smaps_totals of one read: one walk of the page tables, where a read
    of smaps and of smaps_rollup makes two (~90 ms each for 8 GiB resident). The text read
    ahead while the command was imported (smaps_ahead), where there is one for ``pid``."""
    text = smaps_ahead.take(pid)
    if text is None:
        text = _read_proc_text(pid, "smaps")
    return parse_smaps(text), smaps_totals(text)


def replaced_file(pid: int, path: str) -> Path | None:
    """/proc/PID/map_files entry of ``path`` when the mapped file was replaced on disk since.

    A library upgraded under a running process shows as "(deleted)": the file now at the path
    is another build (or nothing), while map_files still opens the mapped one (needs root).
    None when the mapping is not deleted, or the entry cannot be read.
    """
    with contextlib.suppress(NoSuchProcessError, TargetPermissionError):
        for mapping in read_maps_of(pid, path)[1]:
            if mapping.deleted:
                entry = Path(
                    f"/proc/{pid}/map_files/{mapping.start_address:x}-{mapping.end_address:x}"
                )
                return entry if os.access(entry, os.R_OK) else None
    return None


def mapped_file(pid: int, path: str, *, maps: str | None = None) -> tuple[Path, int | None]:
    """Where to read the file PID maps at ``path``, and the mapping's inode (None when PID
    maps no such file): the mapped file itself through /proc/PID/map_files where readable
    (root), else the path as the target's root sees it, to be opened as hostile input and
    checked against the inode (regular_file). ``maps``: PID's /proc/PID/maps text, where the
    caller has it already."""
    with contextlib.suppress(NoSuchProcessError, TargetPermissionError):
        mappings = read_maps_of(pid, path)[1] if maps is None else mappings_of(maps, path)
        if mappings:
            first = mappings[0]
            entry = Path(f"/proc/{pid}/map_files/{first.start_address:x}-{first.end_address:x}")
            if os.access(entry, os.R_OK):
                return entry, first.inode
            inside = Path(f"/proc/{pid}/root") / path.lstrip("/")
            return (inside if os.access(inside, os.R_OK) else Path(path)), first.inode
    return Path(path), None
