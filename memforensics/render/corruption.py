"""A corrupt heap's report: each failed check in glibc's words (terminal, the
``memforensics/heap-corrupt/1`` JSON document, a self-contained HTML page), and the figures of
every bin that did read back consistently, marked incomplete."""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

from memforensics.model.heapscan import ArenaScan, HeapScan
from memforensics.units import format_bytes

if TYPE_CHECKING:
    from rich.console import RenderableType

    from memforensics.errors import HeapCorruptionError
    from memforensics.model.corruption import HeapCorruption

SCHEMA = "memforensics/heap-corrupt/1"


def finding_json(finding: HeapCorruption) -> dict[str, Any]:
    """One failed check as the document lists it."""
    return {
        "arena": finding.arena,
        "arena_address": f"{finding.arena_address:#x}",
        "bin": finding.bin,
        "chunk_address": f"{finding.chunk_address:#x}",
        "check": finding.check,
        "detail": finding.detail,
    }


def _complete(arena: ArenaScan) -> bool:
    """Every bin of the arena was read, none corrupt: its walk neither stopped early (the
    read's time, the pages it may copy) nor left a bin unmeasured."""
    return (
        arena.walked
        and not arena.budget_reached
        and not arena.unmeasured_bins
        and not arena.corruption
    )


def _not_read(arena: ArenaScan) -> str:
    """The bins of the arena not measured, in a few words."""
    listed = ", ".join(str(index) for index in arena.unmeasured_bins)
    if not arena.walked:
        return "all"
    if arena.budget_reached:
        return f"{listed}, and the rest" if listed else "the rest (its walk stopped early)"
    return listed or "-"


def _arenas_json(scan: HeapScan | None) -> list[dict[str, Any]]:
    if scan is None:
        return []
    return [
        {
            "index": number,
            "address": None if arena.address is None else f"{arena.address:#x}",
            "is_main": arena.is_main,
            "complete": _complete(arena),
            "system_bytes": arena.system_bytes,
            "measured_free_bytes": arena.free_bytes,
            "measured_chunks": arena.chunks,
            "bins": [
                {"bin": index, "chunks": chunks, "chunk_bytes": total}
                for index, chunks, total in arena.bins
            ],
            "unmeasured_bins": list(arena.unmeasured_bins),
            "top_bytes": arena.top_bytes,
        }
        for number, arena in enumerate(scan.arenas)
    ]


def corruption_document(error: HeapCorruptionError) -> dict[str, Any]:
    """The JSON document of a heap found corrupt (docs/json.md)."""
    scan = error.partial if isinstance(error.partial, HeapScan) else None
    return {
        "schema": SCHEMA,
        "pid": error.pid,
        "corrupt": True,
        "complete": False,
        "message": error.message,
        "corruption": [finding_json(finding) for finding in error.findings],
        "arenas": _arenas_json(scan),
        "called_into_target": False,
    }


def render_corruption(error: HeapCorruptionError) -> RenderableType:
    """The terminal report: one line per failed check, then what was measured per arena."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[RenderableType] = [
        Text(f"PID {error.pid}: the heap is CORRUPT; nothing was called into it", style="bold"),
    ]
    findings = Table(box=None, pad_edge=False, title="checks that failed", title_justify="left")
    for column in ("arena", "bin", "chunk", "check (glibc's words)", "what was read"):
        findings.add_column(column, overflow="fold")
    for finding in error.findings:
        findings.add_row(
            str(finding.arena),
            finding.bin,
            f"{finding.chunk_address:#x}",
            finding.check,
            finding.detail,
        )
    parts.append(findings)
    scan = error.partial if isinstance(error.partial, HeapScan) else None
    if scan is not None:
        measured = Table(
            box=None,
            pad_edge=False,
            title="measured before the corruption (incomplete: corrupt and unread bins left out)",
            title_justify="left",
        )
        for column in ("arena", "address", "free measured", "chunks", "bins read", "not read"):
            measured.add_column(column, justify="right" if column != "address" else "left")
        for number, arena in enumerate(scan.arenas):
            measured.add_row(
                str(number),
                "?" if arena.address is None else f"{arena.address:#x}",
                format_bytes(arena.free_bytes),
                str(arena.chunks),
                str(len(arena.bins)),
                _not_read(arena),
            )
        parts.append(measured)
    return Group(*parts)


def corruption_html(error: HeapCorruptionError) -> str:
    """A self-contained page (`inspect --html`): the failed checks and what was measured."""
    document = corruption_document(error)
    esc = html.escape

    def table(head: list[str], rows: list[list[object]]) -> str:
        cells = "".join(f"<th>{esc(h)}</th>" for h in head)
        body = "".join(
            "<tr>" + "".join(f"<td>{esc(str(c))}</td>" for c in row) + "</tr>" for row in rows
        )
        return f"<table><tr>{cells}</tr>{body}</table>"

    findings = table(
        ["arena", "bin", "chunk", "check (glibc's words)", "what was read"],
        [
            [f["arena"], f["bin"], f["chunk_address"], f["check"], f["detail"]]
            for f in document["corruption"]
        ],
    )
    scan = error.partial if isinstance(error.partial, HeapScan) else None
    arenas = table(
        ["arena", "address", "complete", "free measured (bytes)", "chunks", "not read"],
        [
            [
                a["index"],
                a["address"],
                "yes" if a["complete"] else "no",
                a["measured_free_bytes"],
                a["measured_chunks"],
                _not_read(arena),
            ]
            for a, arena in zip(document["arenas"], scan.arenas if scan else (), strict=True)
        ],
    )
    title = f"PID {error.pid}: the heap is corrupt"
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{esc(title)}</title><style>body{{font-family:sans-serif;margin:2em}}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #999;"
        "padding:.2em .5em;text-align:left}h1{color:#a00}</style></head><body>"
        f"<h1>{esc(title)}</h1><p>{esc(error.message)}</p>"
        "<p>Nothing was called into the process (no malloc_info, no malloc_trim, no gdb).</p>"
        f"<h2>Checks that failed</h2>{findings}"
        "<h2>Measured before the corruption (incomplete: corrupt and unread bins left out)</h2>"
        f"{arenas}</body></html>\n"
    )
