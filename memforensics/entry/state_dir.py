"""Where `collect` keeps its state by default: the one definition, importable by `oom`
without the state's reading and writing machinery."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

STATE_DIR_ENV = "MEMFORENSICS_STATE_DIR"
SYSTEM_STATE_DIR = Path("/var/lib/memforensics")


def default_state_dir(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """Where `collect` keeps its state when no directory is given.

    In order: $MEMFORENSICS_STATE_DIR; $STATE_DIRECTORY (systemd's StateDirectory=, its
    first entry); for root /var/lib/memforensics; for anyone else
    $XDG_STATE_HOME/memforensics (when absolute), else ~/.local/state/memforensics.
    """
    env = os.environ if environ is None else environ
    explicit = env.get(STATE_DIR_ENV, "")
    if explicit:
        return Path(explicit)
    systemd = env.get("STATE_DIRECTORY", "").split(":")[0]
    if systemd:
        return Path(systemd)
    if (os.geteuid() if euid is None else euid) == 0:
        return SYSTEM_STATE_DIR
    xdg = env.get("XDG_STATE_HOME", "")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / "memforensics"
    home = env.get("HOME") or os.path.expanduser("~")
    return Path(home) / ".local" / "state" / "memforensics"


def existing_default_state_dir() -> Path | None:
    """The state directory `oom` reads without ``--state-dir``: default_state_dir(), when
    it exists."""
    path = default_state_dir()
    return path if path.is_dir() else None
