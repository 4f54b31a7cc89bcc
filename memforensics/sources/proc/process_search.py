"""Finding processes by name or command line (psutil), never matching memforensics itself.

psutil is imported only here, and this module only where a command selects by name: its
import costs more than most of a short command's work.
"""

from __future__ import annotations

import contextlib
import os
import re

import psutil


def _ancestors() -> set[int]:
    pids: set[int] = set()
    with contextlib.suppress(psutil.Error):
        for parent in psutil.Process().parents():
            pids.add(parent.pid)
    return pids


def find_pids_by_name(pattern: str) -> list[int]:
    """PIDs whose name or command line matches ``pattern`` (a regex, else a literal).

    Excludes memforensics itself and its ancestors: `sudo memforensics inspect --name app`
    has "app" on the command lines of sudo and of the shell that started it.
    """
    try:
        regex = re.compile(pattern)
    except re.error:
        regex = re.compile(re.escape(pattern))
    excluded = _ancestors() | {os.getpid()}
    found: list[int] = []
    for proc in psutil.process_iter(["pid", "name", "cmdline"]):
        info = proc.info
        pid = int(info["pid"])
        if pid in excluded:
            continue
        name = info.get("name") or ""
        cmdline = " ".join(info.get("cmdline") or ())
        if regex.search(name) or (cmdline and regex.search(cmdline)):
            found.append(pid)
    return sorted(found)
