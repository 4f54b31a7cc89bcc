"""Our own cgroup, as the kernel limits us: the directories of our cgroup and its
ancestors for a controller (v1 or v2), and the memory we may still use before our memory
cgroup's limit (a container's memory limit) has the kernel reclaim or OOM-kill us.

Paths come from /proc/self/cgroup and the cgroup mounts of /proc/self/mountinfo, so a
container's own view (a cgroup namespace, or its cgroup bind-mounted) is read as it is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

_SELF = Path("/proc/self")
_NO_LIMIT_BYTES = 1 << 60  # v1 writes "no limit" as a page-rounded LONG_MAX


def _mounts(mountinfo: str) -> list[tuple[str, str, str, frozenset[str]]]:
    """The cgroup mounts of a mountinfo text: (root, mount point, type, super options)."""
    mounts = []
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        head, tail = fields.split(), rest.split()
        if len(head) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        mounts.append((head[3], head[4], tail[0], frozenset(tail[2].split(","))))
    return mounts


def _directory(path: str, root: str, mount_point: str) -> Path | None:
    """Where the cgroup ``path`` (as /proc/PID/cgroup names it) lies under a mount of
    ``root`` at ``mount_point``; None when the mount does not hold it."""
    if root != "/" and not (path == root or path.startswith(root.rstrip("/") + "/")):
        return None
    inside = path[len(root) :] if root != "/" else path
    return Path(mount_point) / inside.lstrip("/")


def cgroup_directories(controller: str, proc: Path = _SELF) -> Iterator[tuple[Path, bool]]:
    """(directory, v2) of the cgroup of ``proc`` for ``controller`` ("cpu", "memory") and of
    each of its ancestors up to its mount's root, ours first: the v1 hierarchy that has the
    controller, and the v2 one (whose files say whether the controller is on). Nothing when
    the files cannot be read."""
    try:
        memberships = (proc / "cgroup").read_text().splitlines()
        mounts = _mounts((proc / "mountinfo").read_text())
    except OSError:
        return
    for line in memberships:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        v2 = hierarchy == "0" and controllers == ""
        if not v2 and controller not in controllers.split(","):
            continue
        for root, mount_point, kind, options in mounts:
            if (kind == "cgroup2") != v2 or (not v2 and controller not in options):
                continue
            directory = _directory(path, root, mount_point)
            if directory is None:
                continue
            top = Path(mount_point)
            while True:
                yield directory, v2
                if directory == top or top not in directory.parents:
                    break
                directory = directory.parent


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return _NO_LIMIT_BYTES
    try:
        return int(text)
    except ValueError:
        return None


def _inactive_file_bytes(directory: Path, v2: bool) -> int:
    """Page cache the kernel reclaims first (counted in the usage, not in use)."""
    wanted = "inactive_file" if v2 else "total_inactive_file"
    try:
        for line in (directory / "memory.stat").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == wanted:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


class MemoryLimits:
    """The memory limits of our cgroup and its ancestors, read once; ``headroom_bytes()``
    then reads only the usage of the cgroups that have one. For a read of seconds, which
    asks for its room once an arena: a limit set or changed after this was made is not
    seen (the usage always is)."""

    __slots__ = ("_limited",)

    def __init__(self, proc: Path = _SELF) -> None:
        self._limited: list[tuple[Path, bool, int]] = []  # (directory, v2, limit bytes)
        for directory, v2 in cgroup_directories("memory", proc):
            limit = _read_int(directory / ("memory.max" if v2 else "memory.limit_in_bytes"))
            if limit is not None and limit < _NO_LIMIT_BYTES:
                self._limited.append((directory, v2, limit))

    def headroom_bytes(self) -> int | None:
        """Bytes our cgroup, and each ancestor, may still grow by before its memory limit:
        the least over them of the limit less the usage (the inactive page cache, which the
        kernel reclaims first, not counted as used); None when no limit is set or no usage
        can be read."""
        least: int | None = None
        for directory, v2, limit in self._limited:
            used = _read_int(directory / ("memory.current" if v2 else "memory.usage_in_bytes"))
            if used is None:
                continue
            room = max(0, limit - max(0, used - _inactive_file_bytes(directory, v2)))
            least = room if least is None else min(least, room)
        return least


def memory_headroom_bytes(proc: Path = _SELF) -> int | None:
    """MemoryLimits(proc).headroom_bytes(): the limits and the usage read now."""
    return MemoryLimits(proc).headroom_bytes()
