"""The last heap samples of each process `collect` sampled, kept in its state directory so
that `oom --state-dir` can join an OOM kill to the heap the process died with.

The file is a recording (``memforensics/sample/1`` JSON Lines, heap lines with the totals
only), rewritten whole (temporary file and rename) after every run: at most ``KEEP``
samples per process (enough for a trend), none older than ``RETENTION``. Being a recording,
`report` and `oom --recording` read it as well.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from memforensics.entry.collect_state import state_lock
from memforensics.errors import MemforensicsError
from memforensics.model.collect import TargetResult
from memforensics.model.series import Sample
from memforensics.sources.files.atomic_file import write_atomically
from memforensics.sources.files.recording import SAMPLE_SCHEMA, read_recording

HEAP_FILE = "collect-heap-samples.jsonl"
KEEP = 12
RETENTION = timedelta(days=1)


def heap_file(state_dir: Path) -> Path:
    """Where `collect` keeps the last heap samples in ``state_dir``."""
    return state_dir / HEAP_FILE


def read_heap_samples(state_dir: Path) -> tuple[list[Sample], list[str]]:
    """The kept samples (none when the file is missing), and notes on what could not be read."""
    path = heap_file(state_dir)
    if not path.exists():
        return [], []
    try:
        return list(read_recording(path).samples), []
    except MemforensicsError as exc:
        return [], [f"{path}: {exc.message}: its heap samples are not used"]


def _line(sample: Sample) -> dict[str, Any]:
    when = sample.time.astimezone(timezone.utc) if sample.time else None
    return {
        "schema": SAMPLE_SCHEMA,
        "kind": "heap",
        "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z") if when else None,
        "pid": sample.pid,
        "process": sample.process,
        "rss_bytes": sample.rss_bytes,
        "anon_bytes": sample.anon_bytes,
        "totals": dict(sample.totals or {}),
        "free_resident_bytes": sample.free_resident_bytes,
    }


def target_sample(result: TargetResult, taken: datetime) -> Sample | None:
    """The heap sample of one collect target (None when it was down)."""
    figures = result.figures
    if figures is None:
        return None
    return Sample(
        kind="heap",
        time=taken,
        pid=result.pid,
        process=result.process,
        rss_bytes=figures.process_resident_bytes,
        totals={
            "system_bytes": figures.heap_system_bytes,
            "free_bytes": figures.heap_free_bytes,
            "in_use_bytes": figures.heap_in_use_bytes,
            "arenas": figures.heap_arenas,
        },
        pause_seconds=figures.pause_seconds,
        free_resident_bytes=figures.heap_free_resident_bytes,
    )


def kept(samples: Iterable[Sample], *, now: datetime) -> list[Sample]:
    """The samples to keep: per (pid, name) the newest ``KEEP``, none older than RETENTION."""
    per_process: dict[tuple[int | None, str], list[Sample]] = {}
    for sample in samples:
        if sample.kind != "heap" or sample.time is None or now - sample.time > RETENTION:
            continue
        per_process.setdefault((sample.pid, sample.process), []).append(sample)
    result: list[Sample] = []
    for group in per_process.values():
        group.sort(key=lambda s: s.time or now)
        result.extend(group[-KEEP:])
    result.sort(key=lambda s: s.time or now)
    return result


def update_heap_samples(
    state_dir: Path, taken: Sequence[tuple[TargetResult, datetime]], *, now: datetime
) -> list[str]:
    """Add this run's heap samples to the file; returns notes (a failure is not fatal)."""
    fresh = [s for s in (target_sample(r, when) for r, when in taken) if s is not None]
    try:
        with state_lock(state_dir):
            old, notes = read_heap_samples(state_dir)
            samples = kept([*old, *fresh], now=now)
            data = "".join(json.dumps(_line(s)) + "\n" for s in samples).encode()
            write_atomically(heap_file(state_dir), data, mode=0o600)
    except MemforensicsError as exc:
        return [f"last heap samples not saved: {exc.message}"]
    return notes
