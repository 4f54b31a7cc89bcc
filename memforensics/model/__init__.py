"""The model: frozen dataclasses shared by sources, analysis and renderers."""

from memforensics.model.heap import Arena, BucketKind, HeapDump, SizeBucket

__all__ = ["Arena", "BucketKind", "HeapDump", "SizeBucket"]
