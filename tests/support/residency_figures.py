"""The figures of a residency read that two reads of one idle heap must give alike."""

from __future__ import annotations

from memforensics.model.process import HeapResidency


def walk_figures(residency: HeapResidency) -> list[tuple[object, ...]]:
    """Per arena: index, how its free bytes were found, chunks walked, free bytes measured,
    free bytes resident, bytes malloc_trim would give back."""
    return [
        (
            row.index,
            row.free_method,
            row.walked_chunks,
            row.measured_free_bytes,
            row.free_resident_bytes,
            row.trimmable_bytes,
        )
        for row in residency.arenas
    ]
