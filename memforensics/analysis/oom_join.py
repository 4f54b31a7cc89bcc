"""An OOM kill joined to the heap it died with: the last heap sample of the killed process.

The rule (pure, no I/O): a kill joins the latest heap sample that

1. is of the same process: the same pid and the same name (comm, compared on its first 15
   bytes as the kernel prints it);
2. was taken before the kill (up to ``CLOCK_SLACK`` after it: a kill time read from /dev/kmsg
   is the boot time plus the printk stamp, which drifts from the wall clock a little) and at
   most ``MAX_AGE`` before it;
3. belongs to the same incarnation of that pid: no sample of another name under that pid and
   no recorded ``exit`` of the process lies between the sample and the kill, and the sample is
   not older than the process's start when that is known (pid reuse).

A kill without a wall-clock time (plain dmesg) joins nothing. The verdict is the trend of the
process's heap samples up to the joined one (analysis/trend.py, read, never changed here).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from memforensics.analysis.trend import compute_trend
from memforensics.model.oom import HeapAtKill
from memforensics.model.series import Sample, SeriesEvent
from memforensics.units import format_bytes

MAX_AGE = timedelta(hours=1)
CLOCK_SLACK = timedelta(seconds=2)
COMM_BYTES = 15

# The trend's verdict in the words of a kill: what the heap was doing before it died.
_VERDICT_WORDS = {
    "in-use-growing": "in use growing: a leak (or a cache that keeps growing)",
    "free-growing": "in use flat: fragmentation, not a leak",
    "stable": "in use and free flat: neither a leak nor fragmentation",
    "mmap-growing": "mmapped blocks growing: a leak of large allocations",
    "outside-malloc-growing": "memory outside malloc growing (a runtime's heap, mmaps)",
    "rss-growing": "RSS growing, no recorded line explains it",
    "unknown": "too few heap samples for a trend",
}


def same_name(first: str | None, second: str | None) -> bool:
    """Two process names as the kernel would print them (comm: at most 15 bytes)."""
    if first is None or second is None:
        return False
    return first.encode()[:COMM_BYTES] == second.encode()[:COMM_BYTES]


def last_sample_before(
    samples: Iterable[Sample],
    *,
    pid: int | None,
    process: str | None,
    killed: datetime | None,
    events: Iterable[SeriesEvent] = (),
    started: datetime | None = None,
    max_age: timedelta = MAX_AGE,
) -> Sample | None:
    """The heap sample a kill of (``pid``, ``process``) at ``killed`` joins, or None."""
    if pid is None or killed is None:
        return None
    window_start = killed - max_age
    if started is not None:
        window_start = max(window_start, started)
    best: Sample | None = None
    others: list[datetime] = []  # times the pid was seen under another name
    for sample in samples:
        if sample.pid != pid or sample.time is None:
            continue
        if not same_name(sample.process, process):
            others.append(sample.time)
            continue
        if sample.kind != "heap" or not window_start <= sample.time <= killed + CLOCK_SLACK:
            continue
        if best is None or best.time is None or sample.time > best.time:
            best = sample
    if best is None or best.time is None:
        return None
    chosen = best.time
    if any(chosen < seen <= killed for seen in others):
        return None  # the pid was another process's meanwhile
    for event in events:
        if (
            event.kind == "exit"
            and event.pid == pid
            and same_name(event.process, process)
            and event.time is not None
            and chosen <= event.time < killed - CLOCK_SLACK
        ):
            return None  # that process had exited before this kill: the pid was reused
    return best


def verdict_of(samples: Sequence[Sample], last: Sample) -> str:
    """The trend verdict of the process's samples up to and including ``last``."""
    if last.time is None:
        return compute_trend([last]).verdict
    mine = [
        s
        for s in samples
        if s.pid == last.pid
        and same_name(s.process, last.process)
        and s.time is not None
        and s.time <= last.time
    ]
    return compute_trend(mine).verdict


def verdict_words(verdict: str) -> str:
    """A verdict in the words of a kill (an unknown verdict is shown as it is)."""
    return _VERDICT_WORDS.get(verdict, verdict)


def kill_sentence(
    anon_rss_bytes: int | None, sample: Sample, seconds_before: float, verdict: str
) -> str:
    """ "killed at anon-rss 14.1 GiB; 40 s before: 11.0 GiB free in 64 arenas, in use flat:
    fragmentation, not a leak"."""
    killed = f"killed at anon-rss {format_bytes(anon_rss_bytes)}" if anon_rss_bytes else "killed"
    arenas = sample.total("arenas")
    free = format_bytes(sample.free_bytes)
    where = f" in {arenas} arena{'s' if arenas != 1 else ''}" if arenas is not None else ""
    before = _ago(seconds_before)
    return f"{killed}; {before}: {free} free{where}, {verdict_words(verdict)}"


def _ago(seconds: float) -> str:
    if seconds < 1:
        return "just before"
    if seconds < 120:
        return f"{seconds:.0f} s before"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min before"
    return f"{seconds / 3600:.1f} h before"


def join_kill(
    samples: Sequence[Sample],
    *,
    pid: int | None,
    process: str | None,
    killed: datetime | None,
    anon_rss_bytes: int | None,
    source: str,
    events: Iterable[SeriesEvent] = (),
    started: datetime | None = None,
) -> HeapAtKill | None:
    """The kill joined to its last heap sample (see the module's rule), or None."""
    last = last_sample_before(
        samples, pid=pid, process=process, killed=killed, events=events, started=started
    )
    if last is None or last.time is None or killed is None:
        return None
    seconds = max((killed - last.time).total_seconds(), 0.0)
    verdict = verdict_of(samples, last)
    return HeapAtKill(
        sample=last,
        seconds_before=seconds,
        verdict=verdict,
        source=source,
        sentence=kill_sentence(anon_rss_bytes, last, seconds, verdict),
    )
