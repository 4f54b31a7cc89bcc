"""The ``process``, ``waterfall`` and ``residency`` objects of inspect's JSON, without rich."""

from __future__ import annotations

from typing import Any

from memforensics.model.process import HeapResidency, ProcessFacts, ProcessMemory, Waterfall


def process_json(facts: ProcessFacts, memory: ProcessMemory) -> dict[str, Any]:
    """The ``process`` object of inspect's JSON: identity, allocator and memory in bytes."""
    return {
        "pid": facts.pid,
        "name": facts.name,
        "cmdline": list(facts.cmdline),
        "uid": facts.uid,
        "threads": facts.threads,
        "state": facts.state,
        "tracer_pid": facts.tracer_pid,
        "exe": facts.exe,
        "glibc_version": facts.glibc_version,
        "libc_path": facts.libc_path,
        "allocator": facts.allocator.kind,
        "allocator_detail": facts.allocator.detail,
        "rss_bytes": memory.rss_bytes,
        "anon_bytes": memory.anon_bytes,
        "file_bytes": memory.file_bytes,
        "shmem_bytes": memory.shmem_bytes,
        "swap_bytes": memory.swap_bytes,
        "pss_bytes": memory.pss_bytes,
        "uss_bytes": memory.uss_bytes,
    }


def waterfall_json(wf: Waterfall) -> dict[str, Any]:
    """The waterfall as ``{"lines": [...], "<key>_bytes": n, "notes": [...]}``."""
    document: dict[str, Any] = {
        "lines": [
            {
                "key": line.key,
                "label": line.label,
                "bytes": line.bytes,
                "depth": line.depth,
                "estimate": line.estimate,
                "in_rss": line.in_rss,
                "kind": line.kind,
                "note": line.note,
            }
            for line in wf.lines
        ],
        "notes": list(wf.notes),
    }
    for line in wf.lines:
        document[f"{line.key}_bytes"] = line.bytes
    return document


def residency_json(res: HeapResidency) -> dict[str, Any]:
    """Per-arena residency: mapped, resident, free-resident and trimmable bytes, and method."""
    return {
        "method": res.method,
        "page_bytes": res.page_bytes,
        "heap_mapped_bytes": res.heap_mapped_bytes,
        "heap_resident_bytes": res.heap_resident_bytes,
        "mmap_chunk_bytes": res.mmap_chunk_bytes,
        "mmap_chunk_resident_bytes": res.mmap_chunk_resident_bytes,
        "stack_resident_bytes": res.stack_resident_bytes,
        "other_anon_resident_bytes": res.other_anon_resident_bytes,
        "anon_resident_bytes": res.anon_resident_bytes,
        "free_resident_bytes": res.free_resident_bytes,
        "measured_free_bytes": res.measured_free_bytes,
        "estimated_free_bytes": res.estimated_free_bytes,
        "measured_share": round(res.measured_share, 4),
        "dump_free_bytes": res.dump_free_bytes,
        "unaccounted_free_bytes": res.unaccounted_free_bytes,
        "measured_resident_free_bytes": res.measured_resident_free_bytes,
        "measured_not_resident_bytes": res.measured_not_resident_bytes,
        "trimmable_bytes": res.measured_trimmable_bytes,
        "pad_bytes": res.pad_bytes,
        "walk_seconds": round(res.walk_seconds, 3),
        "walk_budget_seconds": res.walk_budget_seconds,
        "arenas": [
            {
                "index": arena.index,
                "address": None if arena.address is None else hex(arena.address),
                "mapped_bytes": arena.mapped_bytes,
                "resident_bytes": arena.resident_bytes,
                "free_resident_bytes": arena.free_resident_bytes,
                "free_method": arena.free_method,
                "trimmable_bytes": arena.trimmable_bytes,
                "walked_chunks": arena.walked_chunks,
                "measured_free_bytes": arena.measured_free_bytes,
                "estimated_free_bytes": arena.estimated_free_bytes,
                "estimated_trimmable_bytes": arena.estimated_trimmable_bytes,
                "estimated_bins": list(arena.estimated_bins),
                "retries": arena.retries,
                "top_bytes": arena.top_bytes,
                "top_resident_bytes": arena.top_resident_bytes,
                "top_at_brk": arena.top_at_brk,
                "top_trimmable_bytes": arena.top_trimmable_bytes,
                "dump_free_bytes": arena.dump_free_bytes,
                "measured_resident_bytes": arena.measured_resident_bytes,
                "unaccounted_bytes": arena.unaccounted_bytes,
                "balanced": arena.balanced,
                "measured_share": round(arena.measured_share, 4),
                "segments": [
                    {
                        "start": hex(seg.start),
                        "mapped_bytes": seg.mapped_bytes,
                        "resident_bytes": seg.resident_bytes,
                    }
                    for seg in arena.segments
                ],
            }
            for arena in res.arenas
        ],
        "notes": list(res.notes),
    }
