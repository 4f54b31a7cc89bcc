"""A fake /proc/PID directory holding only what the cgroup readers look at."""

from __future__ import annotations

from pathlib import Path


def fake_proc(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    """A directory with ``cgroup`` and ``mountinfo`` files of those texts."""
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text(mountinfo)
    return proc
