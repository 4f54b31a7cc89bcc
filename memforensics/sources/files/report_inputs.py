"""What a `report` input is (recording, heap JSON, malloc_info XML) and heap JSON as samples."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from memforensics.errors import InputDataError
from memforensics.model.series import Sample
from memforensics.sources.files.pins_doc import picture_from_document
from memforensics.sources.files.recording import (
    SAMPLE_SCHEMA,
    advice_from,
    arena_points,
    size_classes,
    waterfall_from,
)

InputKind = Literal["recording", "heap-json", "malloc-xml"]
HEAP_SCHEMA = "memforensics/heap/1"
_SNIFF_BYTES = 4096


def file_time(path: str | os.PathLike[str]) -> datetime:
    """When the file was last written: the only time a heap document or a dump carries."""
    return datetime.fromtimestamp(Path(path).stat().st_mtime, tz=timezone.utc)


def sniff(path: str | os.PathLike[str]) -> InputKind:
    """Tell the input kinds apart by their first bytes (no extension needed)."""
    try:
        with Path(path).open("rb") as handle:
            head = handle.read(_SNIFF_BYTES)
    except IsADirectoryError:
        raise InputDataError("is a directory, not an input", source=str(path)) from None
    except OSError as exc:
        raise InputDataError(f"cannot read: {exc.strerror or exc}", source=str(path)) from None
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"<"):
        return "malloc-xml"
    if text.startswith(b"{") and SAMPLE_SCHEMA.encode() in text.split(b"\n", 1)[0]:
        return "recording"
    if text.startswith((b"{", b"[")):
        return "heap-json"
    raise InputDataError(
        "neither a recording, a heap JSON document nor malloc_info XML",
        source=str(path),
        hint="give a recording made by `memforensics watch`, a heap JSON document from "
        "`memforensics inspect` or `parse`, or a saved malloc_info dump",
    )


def _free_resident(document: dict[str, Any]) -> int | None:
    residency = document.get("residency")
    if isinstance(residency, dict):
        value = residency.get("free_resident_bytes")
        if isinstance(value, int):
            return value
    return None


def sample_from_heap_json(
    document: dict[str, Any], *, source: str, time: datetime | None, sequence: int
) -> Sample:
    """A heap sample from one ``memforensics/heap/1`` document (inspect's or parse's)."""
    totals = document.get("totals")
    if document.get("schema") != HEAP_SCHEMA or not isinstance(totals, dict):
        raise InputDataError(f"not a {HEAP_SCHEMA} document", source=source)
    process = document.get("process")
    pid: int | None = None
    name = Path(source).name
    rss: int | None = None
    anon: int | None = None
    if isinstance(process, dict):
        pid = process.get("pid") if isinstance(process.get("pid"), int) else None
        name = str(process.get("name") or name)
        rss = process.get("rss_bytes") if isinstance(process.get("rss_bytes"), int) else None
        anon = process.get("anon_bytes") if isinstance(process.get("anon_bytes"), int) else None
    pause = document.get("pause_seconds")
    arenas = document.get("arenas") if isinstance(document.get("arenas"), list) else []
    histogram = document.get("histogram") if isinstance(document.get("histogram"), list) else []
    advice = document.get("advice") if isinstance(document.get("advice"), list) else []
    return Sample(
        kind="heap",
        time=time,
        pid=pid,
        process=name,
        rss_bytes=rss,
        anon_bytes=anon,
        totals=totals,
        pause_seconds=float(pause) if isinstance(pause, (int, float)) else None,
        free_resident_bytes=_free_resident(document),
        arenas=arena_points(arenas or [], source, 1),
        histogram=size_classes(histogram or [], source, 1),
        waterfall=waterfall_from(document.get("waterfall"), source, 1),
        advice=advice_from(advice or []),
        sequence=sequence,
        picture=picture_from_document(document, source),
    )


def read_heap_json(path: str | os.PathLike[str]) -> list[Sample]:
    """Heap samples from a heap JSON file: one document or an array of them (several PIDs).

    The documents carry no time of their own, so the file's modification time stands in.
    """
    source = str(path)
    try:
        document = json.loads(Path(path).read_bytes())
    except ValueError as exc:
        raise InputDataError(f"not valid JSON: {exc}", source=source) from None
    documents = document if isinstance(document, list) else [document]
    when = file_time(path)
    samples = []
    for position, item in enumerate(documents):
        if not isinstance(item, dict):
            raise InputDataError(f"not a {HEAP_SCHEMA} document", source=source)
        samples.append(sample_from_heap_json(item, source=source, time=when, sequence=position))
    return samples
