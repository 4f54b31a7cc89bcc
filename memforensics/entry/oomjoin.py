"""OOM kills joined to the heap they died with: heap samples from `watch` recordings and from
the last heap samples `collect` keeps in its state directory, matched to a scan's kills by
the rule of analysis/oom_join.py (same pid and name, the last sample before the kill, at most
an hour before it, no sign of pid reuse in between)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from memforensics.analysis.oom_join import join_kill
from memforensics.entry.collect_heap import heap_file, read_heap_samples
from memforensics.model.oom import HeapAtKill, OomEvent, OomScan
from memforensics.model.series import Sample, SeriesEvent
from memforensics.sources.files.recording import read_recording


@dataclass
class HeapHistory:
    """Heap samples and recorded events from one source (a recording or a state file)."""

    source: str
    samples: list[Sample] = field(default_factory=list)
    events: list[SeriesEvent] = field(default_factory=list)


def load_histories(
    recordings: Sequence[str | os.PathLike[str]] = (), state_dir: Path | None = None
) -> tuple[list[HeapHistory], list[str]]:
    """Read the recordings (exit 7 on a file that is not one) and the state directory's
    heap samples (a missing or unreadable file is a note)."""
    histories: list[HeapHistory] = []
    notes: list[str] = []
    for path in recordings:
        recording = read_recording(path)
        histories.append(HeapHistory(str(path), list(recording.samples), list(recording.events)))
        notes.extend(recording.notes)
    if state_dir is not None:
        samples, state_notes = read_heap_samples(state_dir)
        notes.extend(state_notes)
        if not samples and not state_notes:
            notes.append(
                f"no heap samples kept in {state_dir} (collect writes {heap_file(state_dir).name})"
            )
        histories.append(HeapHistory(str(heap_file(state_dir)), samples))
    return histories, notes


def join_event(event: OomEvent, histories: Sequence[HeapHistory]) -> HeapAtKill | None:
    """The latest heap sample any history has for this kill (None when none fits)."""
    best: HeapAtKill | None = None
    anon = event.anon_rss_bytes if event.killer != "earlyoom" else event.rss_bytes
    for history in histories:
        joined = join_kill(
            history.samples,
            pid=event.pid,
            process=event.process,
            killed=event.time,
            anon_rss_bytes=anon,
            source=history.source,
            events=history.events,
        )
        if joined is not None and (best is None or joined.seconds_before < best.seconds_before):
            best = joined
    return best


def join_scan(
    scan: OomScan, histories: Sequence[HeapHistory], notes: Sequence[str] = ()
) -> OomScan:
    """``scan`` with every kill that fits joined to its last heap sample."""
    heap = {}
    for index, event in enumerate(scan.events):
        joined = join_event(event, histories)
        if joined is not None:
            heap[index] = joined
    return replace(scan, notes=(*scan.notes, *notes), heap=heap)
