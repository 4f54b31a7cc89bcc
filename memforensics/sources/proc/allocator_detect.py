"""Which allocator serves a process (glibc, musl, jemalloc, tcmalloc, mimalloc, a static
binary), with its libc's path and glibc version, from /proc/PID/maps and its executable."""

from __future__ import annotations

import os
import re
from pathlib import Path

from memforensics.model.allocator import ForeignLibrary
from memforensics.model.process import AllocatorInfo
from memforensics.sources.allocators.library import LIBRARY_PREFIXES, linked_copy
from memforensics.sources.proc.binaries import scan_binary
from memforensics.sources.proc.procfs import exe_path, proc_path, read_text
from memforensics.sources.proc.procmaps import file_paths, mapped_file

_OLD_LIBC_NAME_RE = re.compile(r"libc-(\d+\.\d+(?:\.\d+)?)\.so")


def _libc_file(pid: int, path: str, maps: str) -> tuple[Path, int | None]:
    """The mapped libc itself (map_files), else its path in the target's root, and the
    mapping's inode, found in PID's ``maps`` text: scan_binary opens it as hostile input and
    checks that inode."""
    return mapped_file(pid, path, maps=maps)


def _readable(path: Path) -> bool:
    return os.access(path, os.R_OK)


def _glibc_version(pid: int, libc_path: str, maps: str) -> str | None:
    old_name = _OLD_LIBC_NAME_RE.search(os.path.basename(libc_path))
    if old_name:
        return old_name.group(1)
    where, inode = _libc_file(pid, libc_path, maps)
    return scan_binary(where, inode=inode)[1]


def _is_glibc_libc(path: str) -> bool:
    base = os.path.basename(path)
    return base.startswith("libc.so") or bool(_OLD_LIBC_NAME_RE.match(base))


def detect_allocator(pid: int) -> AllocatorInfo:
    """Which allocator serves PID: glibc, or what replaces it (musl, jemalloc, tcmalloc, static).

    Decided from the libraries in /proc/PID/maps; a binary mapping no shared libc at all is
    static, and its /proc/PID/exe is searched for glibc's banner to say which libc it carries.
    The maps are read once: their file paths and the libc's mapping both come from that text.
    """
    maps = read_text(pid, "maps")
    paths = file_paths(maps)  # distinct file paths, in address order
    for path in paths:
        base = os.path.basename(path)
        for prefix, kind in LIBRARY_PREFIXES:
            if base.startswith(prefix) and ".so" in base:
                libc = next((p for p in paths if _is_glibc_libc(p)), None)
                return AllocatorInfo(
                    kind=kind,
                    detail=f"{kind} ({path}) replaces glibc malloc",
                    libc_path=libc,
                    glibc_version=_glibc_version(pid, libc, maps) if libc else None,
                    foreign=ForeignLibrary(kind=kind, path=path),
                )
    for path in paths:
        base = os.path.basename(path)
        # Debian's musl maps /usr/lib/x86_64-linux-musl/libc.so; Alpine's ld-musl-x86_64.so.1.
        if base.startswith(("ld-musl-", "libc.musl-")) or (
            base.startswith("libc.so") and "musl" in path
        ):
            return AllocatorInfo(kind="musl", detail=f"musl libc ({path})", libc_path=path)
    libc_path = next((p for p in paths if _is_glibc_libc(p)), None)
    if libc_path is not None:
        version = _glibc_version(pid, libc_path, maps)
        if version is None and _readable(_libc_file(pid, libc_path, maps)[0]):
            return AllocatorInfo(
                kind="unknown",
                detail=f"{libc_path} is not glibc (no glibc version banner in it)",
                libc_path=libc_path,
            )
        found = linked_copy(proc_path(pid, "exe"))
        if found is not None:
            program = exe_path(pid) or found.path
            found = ForeignLibrary(found.kind, program, found.prefix, found.serves_malloc)
            if found.serves_malloc:
                return AllocatorInfo(
                    kind=found.kind,
                    detail=f"{found.kind} linked into {program} replaces glibc malloc",
                    libc_path=libc_path,
                    glibc_version=version,
                    foreign=found,
                )
        prefixed = f"{found.prefix}-prefixed " if found is not None and found.prefix else ""
        beside = f"; beside it {prefixed}{found.kind} in {found.path}" if found else ""
        return AllocatorInfo(
            kind="glibc",
            detail=f"glibc malloc ({libc_path}){beside}",
            libc_path=libc_path,
            glibc_version=version,
            foreign=found,
        )
    interpreter = next((p for p in paths if os.path.basename(p).startswith("ld-linux")), None)
    if interpreter is not None:
        return AllocatorInfo(kind="unknown", detail=f"dynamic binary without a libc ({paths[0]})")
    exe = exe_path(pid)
    has_glibc, version = scan_binary(proc_path(pid, "exe")) if exe is not None else (False, None)
    if has_glibc:
        linked = f"glibc {version}" if version else "glibc"
        detail = f"static binary {exe} ({linked} linked in: only a shared libc's malloc is read)"
    else:
        detail = f"static binary {exe or '(unknown)'} without a shared libc"
    return AllocatorInfo(
        kind="static", detail=detail, glibc_version=version, glibc_linked_in=has_glibc
    )
