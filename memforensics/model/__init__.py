"""The model: frozen dataclasses shared by sources, analysis and renderers."""

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
