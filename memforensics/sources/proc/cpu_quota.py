"""Our own CPU quota (the kernel's CPU bandwidth control of our cgroup: a container's CPU
limit) and the wait before each stop of a target that keeps that quota from taking our CPU
away while the target is held.

Under a quota, the kernel lets our cgroup run for ``quota_seconds`` of CPU in each
``period_seconds`` (cgroup v2 ``cpu.max``, v1 ``cpu.cfs_quota_us`` and ``cpu.cfs_period_us``)
and then throttles it until the next period begins: up to a whole period (100 ms by
default). Throttled inside a stop, we would hold every thread of the target for that long:
a stop of a few milliseconds becomes one of 100 ms, as long as the gdb recipe's.

``StopPacer.before_stop`` waits, before a stop, until our CPU time over the last period leaves
room for the stop's own (``MARGIN`` of the quota). Invariant: when, for every stop, our CPU
time over the window of one period ending at the stop's end is at most the quota, no period
of the kernel's, whatever its phase, has used up the quota before the stop ends, so no
throttle falls in a stop. The pacer sees only our own process's CPU time (not other
processes of the cgroup), and a stop needing more than the quota cannot be kept whole: it
then waits for a quiet window only, and ``before_stop`` never waits more than
``MAX_WAIT_PERIODS`` periods. Without a quota it returns at once and costs nothing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from memforensics.sources.proc.own_cgroup import cgroup_directories

MARGIN = 0.7  # of the quota: the kernel hands runtime out in slices, and others share it
MAX_WAIT_PERIODS = 2.0  # a stop never waits longer than this many periods for room
# What a stop costs in CPU before one has been measured: 4 ms of reading by two threads and
# the hold's own system calls.
FIRST_STOP_CPU_SECONDS = 0.010
_POLL_SHARE = 0.1  # of a period: how often the wait looks at our CPU time again


@dataclass(frozen=True, slots=True)
class CpuQuota:
    """The tightest CPU quota over our cgroup and its ancestors: ``quota_seconds`` of CPU
    in each ``period_seconds``; ``directory`` is the cgroup that sets it."""

    quota_seconds: float
    period_seconds: float
    directory: str

    @property
    def cpus(self) -> float:
        """The quota as a number of CPUs (0.2: a fifth of one CPU)."""
        return self.quota_seconds / self.period_seconds


def _read_quota(directory: Path, v2: bool) -> tuple[float, float] | None:
    """(quota, period) in seconds set at ``directory``; None for none or unreadable."""
    try:
        if v2:
            quota_text, period_text = (directory / "cpu.max").read_text().split()[:2]
            if quota_text == "max":
                return None
            quota_us, period_us = int(quota_text), int(period_text)
        else:
            quota_us = int((directory / "cpu.cfs_quota_us").read_text())
            period_us = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    if quota_us <= 0 or period_us <= 0:  # v1's -1: no quota
        return None
    return quota_us / 1e6, period_us / 1e6


def cpu_quota(proc: Path = Path("/proc/self")) -> CpuQuota | None:
    """The tightest CPU quota (the smallest ``quota_seconds``) set on the cgroup of ``proc``
    or any of its ancestors, v2 or v1 ``cpu``; None when there is none (or the cgroup
    files cannot be read)."""
    found: CpuQuota | None = None
    for directory, v2 in cgroup_directories("cpu", proc):
        quota = _read_quota(directory, v2)
        if quota is not None and (found is None or quota[0] < found.quota_seconds):
            found = CpuQuota(quota[0], quota[1], str(directory))
    return found


class StopPacer:
    """Waits before each stop of a target until our CPU quota has room for it (the module's
    invariant). ``waited_seconds`` sums the waits; ``stop_cpu_seconds`` is what the stops
    seen so far took at most (the next stop is assumed to take as much)."""

    def __init__(
        self,
        quota: CpuQuota | None,
        *,
        clock: Callable[[], float] = time.monotonic,
        cpu_clock: Callable[[], float] = time.process_time,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.quota = quota
        self._clock, self._cpu_clock, self._sleep = clock, cpu_clock, sleep
        self._samples: deque[tuple[float, float]] = deque()  # (monotonic, our CPU), in order
        self._stop_began_cpu: float | None = None
        self.stop_cpu_seconds = FIRST_STOP_CPU_SECONDS
        self.waited_seconds = 0.0
        if quota is not None:
            self._sample()

    def _sample(self) -> tuple[float, float]:
        sample = (self._clock(), self._cpu_clock())
        self._samples.append(sample)
        assert self.quota is not None
        horizon = sample[0] - self.quota.period_seconds
        # Kept: every sample inside the window, and the newest one before it.
        while len(self._samples) > 1 and self._samples[1][0] <= horizon:
            self._samples.popleft()
        return sample

    def _used_in_window(self, now: float, cpu: float) -> float:
        """Our CPU time since one period before ``now``, at most: from the newest sample
        taken at or before then (all of it when none is that old)."""
        assert self.quota is not None
        oldest = self._samples[0]
        if oldest[0] > now - self.quota.period_seconds:
            return cpu  # what came before the first sample is not known: assume the worst
        return cpu - oldest[1]

    def before_stop(self) -> None:
        """Return once our CPU time over the last period, with the stop's own, fits MARGIN
        of the quota (or at once without a quota; after MAX_WAIT_PERIODS periods at most)."""
        if self.quota is None:
            return
        period = self.quota.period_seconds
        room = max(0.0, MARGIN * self.quota.quota_seconds - self.stop_cpu_seconds)
        began = self._clock()
        while True:
            now, cpu = self._sample()
            if self._used_in_window(now, cpu) <= room or now - began >= MAX_WAIT_PERIODS * period:
                break
            self._sleep(_POLL_SHARE * period)
        self.waited_seconds += now - began
        self._stop_began_cpu = cpu

    def after_stop(self) -> None:
        """The stop begun after ``before_stop`` is over: its CPU time is remembered."""
        if self.quota is None or self._stop_began_cpu is None:
            return
        _, cpu = self._sample()
        took = cpu - self._stop_began_cpu
        self._stop_began_cpu = None
        # The longest stop so far, forgotten slowly: the next stop of the same read costs
        # about as much as the last ones.
        self.stop_cpu_seconds = max(took, 0.9 * self.stop_cpu_seconds, FIRST_STOP_CPU_SECONDS)


_pacer: StopPacer | None = None


def stop_pacer() -> StopPacer:
    """This process's pacer (its quota read once, at the first stop)."""
    global _pacer
    if _pacer is None:
        _pacer = StopPacer(cpu_quota())
    return _pacer


def wall_per_cpu_second() -> float:
    """Seconds of wall time one second of our CPU time may take under this process's CPU
    quota: 1 without a quota or with one of a CPU or more (1 / its CPUs below that), for time
    budgets that mean work, not waiting."""
    quota = stop_pacer().quota
    return 1.0 if quota is None or quota.cpus >= 1 else 1.0 / quota.cpus
