"""The processes a command is pointed at: the PIDs given, and those matching each ``--name``."""

from __future__ import annotations

from collections.abc import Sequence

from memforensics.errors import NoSuchProcessError


def resolve_targets(pids: Sequence[int], names: Sequence[str]) -> list[tuple[int, bool]]:
    """(pid, explicit) for the PIDs given and those matching each name, without repeats.

    ``explicit`` is False for a match by name: such a process may come and go (a backend
    exiting mid-run), and callers skip it with a note instead of failing the run.
    """
    found: dict[int, bool] = dict.fromkeys(pids, True)
    if names:
        from memforensics.sources.proc import process_search  # psutil: only when selecting by name
    for name in names:
        matches = process_search.find_pids_by_name(name)
        if not matches:
            raise NoSuchProcessError(
                f"no process matches --name {name!r}",
                hint="check the name with `pgrep -a NAME`; it is a regex over name and cmdline",
            )
        for pid in matches:
            found.setdefault(pid, False)
    return list(found.items())
