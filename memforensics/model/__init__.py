"""The model: frozen dataclasses shared by sources, analysis and renderers."""

from memforensics.model.advice import Advice, Severity
from memforensics.model.heap import Arena, BucketKind, HeapDump, SizeBucket

__all__ = ["Advice", "Arena", "BucketKind", "HeapDump", "Severity", "SizeBucket"]
