"""A process's memory in bytes (RSS, anonymous, file-backed, shmem, swap, PSS, USS), from
/proc/PID/status and smaps_rollup (smaps summed where a kernel has no rollup)."""

from __future__ import annotations

from memforensics.errors import NoSuchProcessError, TargetPermissionError
from memforensics.model.process import ProcessMemory
from memforensics.sources.proc.procfs import read_text
from memforensics.sources.proc.procmaps import smaps_totals


def _kib_fields(text: str) -> dict[str, int]:
    """``Key: N kB`` lines as bytes."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        parts = value.split()
        if len(parts) == 2 and parts[1] == "kB" and parts[0].isdigit():
            fields[key.strip()] = int(parts[0]) * 1024
    return fields


def _read_rollup(pid: int) -> dict[str, int]:
    """smaps_rollup's fields in bytes ({} where it may not be read)."""
    try:
        return _kib_fields(read_text(pid, "smaps_rollup"))
    except TargetPermissionError:
        return {}
    except NoSuchProcessError:
        # status was read, so the process exists: this kernel has no smaps_rollup (< 4.14);
        # smaps has the same fields per mapping, and the rollup is their sum.
        return smaps_totals(read_text(pid, "smaps"))


def read_memory(
    pid: int, *, status: str | None = None, rollup: dict[str, int] | None = None
) -> ProcessMemory:
    """RSS, anonymous, file, shmem, swap, PSS and USS bytes of PID.

    smaps_rollup walks the page tables, so its Rss/Anonymous are exact where /proc/PID/status
    holds per-CPU counter approximations; shmem comes from status (rollup has no RSS split for
    it) and file-backed is what remains. USS = private clean + private dirty, as psutil counts it.
    ``status``: the text of /proc/PID/status the caller has just read (for the process's facts
    of the same moment), rather than read again. ``rollup``: smaps summed as smaps_rollup
    sums it (procmaps.read_smaps_and_totals), where the caller has read smaps already: the
    page tables are not walked again.
    """
    status_kib = _kib_fields(read_text(pid, "status") if status is None else status)
    if rollup is None:
        rollup = _read_rollup(pid)
    rss = rollup.get("Rss", status_kib.get("VmRSS"))
    anon = rollup.get("Anonymous", status_kib.get("RssAnon"))
    shmem = status_kib.get("RssShmem")
    file_backed: int | None = None
    if rss is not None and anon is not None:
        file_backed = max(rss - anon - (shmem or 0), 0)
    uss: int | None = None
    if "Private_Clean" in rollup and "Private_Dirty" in rollup:
        uss = rollup["Private_Clean"] + rollup["Private_Dirty"]
    return ProcessMemory(
        rss_bytes=rss,
        anon_bytes=anon,
        file_bytes=file_backed,
        shmem_bytes=shmem,
        swap_bytes=rollup.get("Swap", status_kib.get("VmSwap")),
        pss_bytes=rollup.get("Pss"),
        uss_bytes=uss,
    )
