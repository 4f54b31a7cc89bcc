"""The one reader of /proc/PID/maps and /proc/PID/smaps: a process's mappings as data."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from memforensics.errors import NoSuchProcessError, TargetPermissionError

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


def parse_maps_line(line: str) -> Mapping | None:
    """A maps/smaps header line as a Mapping; None for any other line (smaps' field lines)."""
    head = line.split(None, 5)
    if len(head) < 5 or "-" not in head[0] or head[0].endswith(":"):
        return None
    lo, _, hi = head[0].partition("-")
    try:
        start, end = int(lo, 16), int(hi, 16)
        offset, inode = int(head[2], 16), int(head[4])
    except ValueError:
        return None
    path = head[5].strip() if len(head) > 5 else ""
    deleted = path.endswith(_DELETED_SUFFIX)
    return Mapping(
        start_address=start,
        end_address=end,
        perms=head[1],
        offset_bytes=offset,
        inode=inode,
        path=path.removesuffix(_DELETED_SUFFIX),
        deleted=deleted,
    )


def parse_maps(text: str) -> list[Mapping]:
    """Every mapping of a /proc/PID/maps text, in address order."""
    return [m for m in map(parse_maps_line, text.splitlines()) if m is not None]


def parse_smaps(text: str) -> list[Mapping]:
    """Every mapping of a /proc/PID/smaps text, with its Rss and Anonymous bytes."""
    mappings: list[Mapping] = []
    current: Mapping | None = None
    rss_bytes = anon_bytes = 0

    def close() -> None:
        if current is not None:
            mappings.append(
                Mapping(**{**current.__dict__, "rss_bytes": rss_bytes, "anon_bytes": anon_bytes})
            )

    for line in text.splitlines():
        if line.startswith("Rss:"):
            rss_bytes = int(line.split()[1]) * 1024
        elif line.startswith("Anonymous:"):
            anon_bytes = int(line.split()[1]) * 1024
        elif line[:1].isdigit() or line[:1] in "abcdef":
            mapping = parse_maps_line(line)
            if mapping is not None:
                close()
                current, rss_bytes, anon_bytes = mapping, 0, 0
    close()
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


def read_smaps(pid: int) -> list[Mapping]:
    """The mappings of a live process with Rss/Anonymous (walks the page tables)."""
    return parse_smaps(_read_proc_text(pid, "smaps"))


def replaced_file(pid: int, path: str) -> Path | None:
    """/proc/PID/map_files entry of ``path`` when the mapped file was replaced on disk since.

    A library upgraded under a running process shows as "(deleted)": the file now at the path
    is another build (or nothing), while map_files still opens the mapped one (needs root).
    None when the mapping is not deleted, or the entry cannot be read.
    """
    with contextlib.suppress(NoSuchProcessError, TargetPermissionError):
        for mapping in read_maps(pid):
            if mapping.path == path and mapping.deleted:
                entry = Path(
                    f"/proc/{pid}/map_files/{mapping.start_address:x}-{mapping.end_address:x}"
                )
                return entry if os.access(entry, os.R_OK) else None
    return None
