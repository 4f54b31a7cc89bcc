"""The advice's thresholds, named by what they mean, in one place: below them a figure is
not worth a sentence of advice (small heaps are not worth a warning whatever their ratios)."""

from __future__ import annotations

from memforensics.units import MiB

# A glibc heap's figure (free, releasable, mmapped, held by one arena) worth advice.
HEAP_ADVICE_MIN_BYTES = 16 * MiB
# What a foreign allocator's purge would give back, or keeps fragmented, worth advice (their
# own figures are exact, so a smaller amount is already worth naming).
ALLOCATOR_ADVICE_MIN_BYTES = MiB
# Arenas: this many, half of them with at least HIGH_FREE_RATIO free, is "too many arenas".
MANY_ARENAS = 8
HIGH_FREE_RATIO = 0.5
# A free ratio at or below this is healthy.
HEALTHY_FREE_RATIO = 0.2
# Free memory mostly in small chunks (this share): fragmentation malloc_trim cannot help.
SMALL_CHUNK_SHARE = 0.7
# mmapped chunks this share of the heap: the mmap threshold is worth a look.
MMAP_SHARE = 0.5
# Free-but-gone memory worth a sentence: at least this much and this share of the free bytes.
NOT_RESIDENT_MIN_BYTES = 16 * MiB
NOT_RESIDENT_MIN_SHARE = 0.10
# Resident free memory worth a trim suggestion.
TRIMMABLE_MIN_BYTES = 32 * MiB
TRIMMABLE_MIN_SHARE = 0.25
