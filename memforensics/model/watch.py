"""What a watch knows about one process so far (entry.watching keeps it up to date; the live
view and the summary show it)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import datetime

from memforensics.model.census import CensusSample
from memforensics.model.series import Sample, SeriesEvent
from memforensics.model.trend import Trend

# The live view and the trend so far look at this many recent RSS readings (a day at 1 s
# would be 86,400; the recording keeps everything, the view does not need to).
RECENT_RSS_SAMPLES = 3600


@dataclass
class WatchedProcess:
    """What the watch knows about one process so far (for the live view and the summary)."""

    pid: int
    process: str
    started: datetime
    heap: list[Sample] = field(default_factory=list)
    rss: deque[Sample] = field(default_factory=lambda: deque(maxlen=RECENT_RSS_SAMPLES))
    rss_samples: int = 0
    gaps: list[SeriesEvent] = field(default_factory=list)
    pause_seconds: float = 0.0
    ended: SeriesEvent | None = None
    oom_kill: SeriesEvent | None = None
    trend: Trend | None = None
    failures: int = 0  # heap samples failed in a row
    runtime: str | None = None  # cpython, jvm, go, node: told once, at the start
    censuses: list[CensusSample] = field(default_factory=list)  # watch --census
    census_pause_seconds: float = 0.0

    @property
    def last_rss_bytes(self) -> int | None:
        latest = [s for s in (self.rss[-1] if self.rss else None, self.latest_heap) if s]
        latest.sort(key=lambda s: s.time or self.started)
        return latest[-1].rss_bytes if latest else None

    @property
    def latest_heap(self) -> Sample | None:
        return self.heap[-1] if self.heap else None
