"""The model: frozen dataclasses shared by sources, analysis and renderers.

Names are loaded on first use (PEP 562): a command that needs only the heap model does not
pay for building the OOM and trim dataclasses at start-up.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memforensics.model.advice import Advice, Severity
    from memforensics.model.collect import (
        CollectRun,
        ContainerIdentity,
        OomKillCount,
        OomKillKey,
        OomReading,
        TargetFigures,
        TargetResult,
    )
    from memforensics.model.heap import Arena, BucketKind, HeapDump, SizeBucket
    from memforensics.model.oom import OomEvent, OomScan, OomTrigger, ProcessSummary, TopTask
    from memforensics.model.process import (
        AllocatorInfo,
        ArenaResidency,
        ArenaTrimForecast,
        HeapResidency,
        HeapSegment,
        ProcessFacts,
        ProcessMemory,
        TrimForecast,
        Waterfall,
        WaterfallLine,
    )
    from memforensics.model.trim import TrimFailure, TrimOutcome, TrimResult, TrimRound

# Exported name -> the module that defines it.
_HOMES = {
    "Advice": "advice",
    "Severity": "advice",
    "CollectRun": "collect",
    "ContainerIdentity": "collect",
    "OomKillCount": "collect",
    "OomKillKey": "collect",
    "OomReading": "collect",
    "TargetFigures": "collect",
    "TargetResult": "collect",
    "Arena": "heap",
    "BucketKind": "heap",
    "HeapDump": "heap",
    "SizeBucket": "heap",
    "OomEvent": "oom",
    "OomScan": "oom",
    "OomTrigger": "oom",
    "ProcessSummary": "oom",
    "TopTask": "oom",
    "AllocatorInfo": "process",
    "ArenaResidency": "process",
    "ArenaTrimForecast": "process",
    "HeapResidency": "process",
    "HeapSegment": "process",
    "ProcessFacts": "process",
    "ProcessMemory": "process",
    "TrimForecast": "process",
    "Waterfall": "process",
    "WaterfallLine": "process",
    "TrimFailure": "trim",
    "TrimOutcome": "trim",
    "TrimResult": "trim",
    "TrimRound": "trim",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


__all__ = [
    "Advice",
    "AllocatorInfo",
    "Arena",
    "ArenaResidency",
    "ArenaTrimForecast",
    "BucketKind",
    "CollectRun",
    "ContainerIdentity",
    "HeapDump",
    "HeapResidency",
    "HeapSegment",
    "OomEvent",
    "OomKillCount",
    "OomKillKey",
    "OomReading",
    "OomScan",
    "OomTrigger",
    "ProcessFacts",
    "ProcessMemory",
    "ProcessSummary",
    "Severity",
    "SizeBucket",
    "TargetFigures",
    "TargetResult",
    "TopTask",
    "TrimFailure",
    "TrimForecast",
    "TrimOutcome",
    "TrimResult",
    "TrimRound",
    "Waterfall",
    "WaterfallLine",
]
