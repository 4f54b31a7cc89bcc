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

So a stop must also be small enough: ``stop_copy_max_bytes`` and ``stop_reading_seconds`` are
how much one stop may copy and how long it may read, the readers' usual bounds cut, under a
quota, to what fits the pacer's room (MARGIN of the quota, less what holding the threads
costs). Every reader that sizes its stops takes its bounds from these two. Where holding
the threads alone does not fit the quota, they are left uncut: no cut makes such a stop fit.

A budget of our work (a read's, its relays', their sweeps') is a ``WorkDeadline``: seconds of
our CPU's time, pushed back by the pacer's waits, which are not work.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from memforensics.sources.proc.own_cgroup import cgroup_directories

MARGIN = 0.7  # of the quota: the kernel hands runtime out in slices, and others share it
MAX_WAIT_PERIODS = 2.0  # a stop never waits longer than this many periods for room
# A window is quiet when it holds at most this share of the quota: the wait's own looks at
# our CPU time cost about 1% of a CPU, so a stop that cannot fit, waiting for no CPU time
# at all in the window, would always wait MAX_WAIT_PERIODS.
QUIET_SHARE = 0.15
# What a stop costs in CPU before one has been measured: 4 ms of reading by two threads and
# the hold's own system calls.
FIRST_STOP_CPU_SECONDS = 0.010
_POLL_SHARE = 0.1  # of a period: how often the wait looks at our CPU time again
# What a stop costs in CPU beside its reading, before one has been measured: holding and
# releasing every thread of the target (about 1.5 ms measured with 34 threads; taken high).
FIRST_HOLD_CPU_SECONDS = 0.004
# What a stop's reading costs in CPU whatever it reads: the arena's state, its copy's and
# walk's set-up (0.6-1 ms measured here).
READING_SETUP_CPU_SECONDS = 0.001
# What one page a stop copies costs it in CPU, its readers' time summed, before a stop has
# measured it: the page's pagemap entry read again, the page, and the walk of the lists on
# it (measured here: 2.8 us in heaps of 64 MiB, 6 us in an arena of 1 GiB whose pages lie
# far apart; taken high, so that a stop sized by it fits).
COPY_CPU_SECONDS_PER_PAGE = 6e-6
# The least a stop's reading is cut to under a quota: where the quota leaves less once the
# least of the last RECENT_HOLDS holds is paid, the reading is not cut at all
# (stop_reading_cpu_seconds).
MIN_READING_CPU_SECONDS = 0.001
RECENT_HOLDS = 8
# A stop that begins within this share of a period after work leading to it
# (StopPacer.leading_to_stop) follows that work: the wait before the work made room for both.
LEAD_GAP_SHARE = 0.1


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
    seen so far took at most (the next stop is assumed to take as much), and
    ``hold_cpu_seconds`` what holding and releasing the threads took of it (the hold tells
    ``held`` and ``releasing``), so that a stop's reading can be sized to the rest."""

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
        self._held_cpu: float | None = None  # CPU time when the threads were held
        self._releasing_cpu: float | None = None  # and when their release began
        self.stop_cpu_seconds = FIRST_STOP_CPU_SECONDS
        self.hold_cpu_seconds = FIRST_HOLD_CPU_SECONDS
        # The last stops' holds as measured: the least of them is what a hold can cost (a
        # single one may come out several times that: 1.3-6.9 ms with 34 threads).
        self.recent_holds_cpu_seconds: deque[float] = deque(maxlen=RECENT_HOLDS)
        self.copy_cpu_seconds_per_page = COPY_CPU_SECONDS_PER_PAGE  # (learn_copy_cost)
        self.last_reading_cpu_seconds: float | None = None  # the last stop's, less its hold
        self.waited_seconds = 0.0
        # Work made just before the next stop (leading_to_stop): what such work took at most
        # (forgotten slowly), and the last one's end and CPU time, until that stop.
        self.lead_cpu_seconds = 0.0
        self._lead: tuple[float, float] | None = None
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
        of the quota (or at once without a quota; after MAX_WAIT_PERIODS periods at most).
        Right after ``leading_to_stop`` work, its CPU time is not waited for again: the wait
        before it left room for it."""
        if self.quota is None:
            return
        lead, self._lead = self._lead, None
        gap_seconds = LEAD_GAP_SHARE * self.quota.period_seconds
        forgiven = lead[1] if lead is not None and self._clock() - lead[0] <= gap_seconds else 0.0
        _, cpu = self._wait_for_room(self.stop_cpu_seconds, forgiven)
        self._stop_began_cpu = cpu

    def _wait_for_room(self, work_cpu_seconds: float, forgiven: float = 0.0) -> tuple[float, float]:
        """Wait until our CPU time over the last period (less ``forgiven``), with
        ``work_cpu_seconds`` more, fits MARGIN of the quota, or the window is quiet where it
        cannot fit (MAX_WAIT_PERIODS periods at most); the last (monotonic, CPU) sample."""
        assert self.quota is not None
        period = self.quota.period_seconds
        quota = self.quota.quota_seconds
        room = max(QUIET_SHARE * quota, MARGIN * quota - work_cpu_seconds)
        began = self._clock()
        while True:
            now, cpu = self._sample()
            used = self._used_in_window(now, cpu) - forgiven
            if used <= room or now - began >= MAX_WAIT_PERIODS * period:
                break
            self._sleep(_POLL_SHARE * period)
        self.waited_seconds += now - began
        return now, cpu

    @contextmanager
    def leading_to_stop(self) -> Iterator[None]:
        """Work made just before a stop whose worth is that the target has not moved since
        (a busy arena's catch-up: the pages its lists took on, copied in the stop at one go):
        waited for as the stop is, with room for the work too (as much as such work took
        at most so far, forgotten slowly), so that the stop follows it at once instead of
        after a wait during which the lists move again. The stop's ``before_stop`` does not
        wait for this work's CPU time again, if it begins within LEAD_GAP_SHARE of a period."""
        if self.quota is None:
            yield
            return
        _, began_cpu = self._wait_for_room(self.lead_cpu_seconds + self.stop_cpu_seconds)
        try:
            yield
        finally:
            now, cpu = self._sample()
            took = cpu - began_cpu
            self.lead_cpu_seconds = max(took, 0.9 * self.lead_cpu_seconds)
            self._lead = (now, took)

    def held(self) -> None:
        """Every thread of the stop begun after ``before_stop`` is held: what that took."""
        if self.quota is None or self._stop_began_cpu is None:
            return
        self._held_cpu = self._cpu_clock()

    def releasing(self) -> None:
        """The stop's threads are about to be released (``after_stop`` follows)."""
        if self.quota is None or self._held_cpu is None:
            return
        self._releasing_cpu = self._cpu_clock()

    def after_stop(self) -> None:
        """The stop begun after ``before_stop`` is over: its CPU time is remembered."""
        if self.quota is None or self._stop_began_cpu is None:
            return
        _, cpu = self._sample()
        took = cpu - self._stop_began_cpu
        # The longest stop so far, forgotten slowly: the next stop of the same read costs
        # about as much as the last ones. The same for what its hold alone cost.
        self.stop_cpu_seconds = max(took, 0.9 * self.stop_cpu_seconds)
        self.last_reading_cpu_seconds = None
        if self._held_cpu is not None and self._releasing_cpu is not None:
            holding = (self._held_cpu - self._stop_began_cpu) + (cpu - self._releasing_cpu)
            self.hold_cpu_seconds = max(holding, 0.9 * self.hold_cpu_seconds)
            self.recent_holds_cpu_seconds.append(holding)
            self.last_reading_cpu_seconds = max(0.0, took - holding)
        self._stop_began_cpu = self._held_cpu = self._releasing_cpu = None

    def learn_copy_cost(self, pages: int) -> None:
        """The stop that just ended copied ``pages`` pages (and walked their lists): what a
        page cost it, its reading's set-up taken off, is the cost assumed from now on where
        more, forgotten slowly where less, never below COPY_CPU_SECONDS_PER_PAGE (a part of
        cheap pages says little of the next: parts grown on it were throttled)."""
        reading = self.last_reading_cpu_seconds
        if self.quota is None or reading is None or pages <= 0:
            return
        per_page = max(0.0, reading - READING_SETUP_CPU_SECONDS) / pages
        self.copy_cpu_seconds_per_page = max(
            per_page, 0.9 * self.copy_cpu_seconds_per_page, COPY_CPU_SECONDS_PER_PAGE
        )
        self.last_reading_cpu_seconds = None


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


class WorkDeadline:
    """When a budget of our work runs out, as a moment of time.monotonic (``at``): made
    ``cpu_seconds`` of our CPU's time ahead (wall_per_cpu_second each, under a CPU quota),
    pushed back by every wait of the stop pacer after it was made (a wait for room in the
    quota is not work: under a small quota the pacer allows about one stop a period, and a
    budget that counted its waits would run out on waiting), by ``extend`` and by the time
    spent in ``excluded``. A loop whose stops the pacer paces asks ``at`` or ``passed`` at
    every turn; a callee that runs in one stop, or none, may take ``at()`` once."""

    def __init__(
        self,
        cpu_seconds: float,
        *,
        start: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``start``: the moment of ``clock`` the budget began (now when None)."""
        self._clock = clock
        self._at = (clock() if start is None else start) + cpu_seconds * wall_per_cpu_second()
        self._waited_before = stop_pacer().waited_seconds

    def at(self) -> float:
        return self._at + stop_pacer().waited_seconds - self._waited_before

    def passed(self) -> bool:
        return self._clock() >= self.at()

    def left_seconds(self) -> float:
        """Wall seconds until it passes (negative once it has)."""
        return self.at() - self._clock()

    def extend(self, cpu_seconds: float) -> None:
        """Later by ``cpu_seconds`` of our CPU's time (more work granted)."""
        self._at += cpu_seconds * wall_per_cpu_second()

    @contextmanager
    def excluded(self) -> Iterator[None]:
        """The time spent inside does not count against this budget (work with a budget
        of its own); the pacer's waits inside are pushed back once, not twice."""
        began, waited = self._clock(), stop_pacer().waited_seconds
        try:
            yield
        finally:
            self._at += (self._clock() - began) - (stop_pacer().waited_seconds - waited)


def stop_reading_cpu_seconds() -> float | None:
    """CPU time the reading inside one stop may take under our CPU quota: MARGIN of the
    quota less what holding the threads costs (the pacer's hold_cpu_seconds) and
    READING_SETUP_CPU_SECONDS, at least MIN_READING_CPU_SECONDS. None without a quota, and
    where even the least of the last RECENT_HOLDS holds leaves no room for that least
    reading: holding the threads alone does not fit the quota (a target of a thousand
    threads), no cut makes a stop fit, and a cut would only multiply the stops, each paying
    the hold and stalling the target as long."""
    pacer = stop_pacer()
    if pacer.quota is None:
        return None
    usable = MARGIN * pacer.quota.quota_seconds - READING_SETUP_CPU_SECONDS
    holds = pacer.recent_holds_cpu_seconds
    if len(holds) == holds.maxlen and usable - min(holds) < MIN_READING_CPU_SECONDS:
        return None
    return max(MIN_READING_CPU_SECONDS, usable - pacer.hold_cpu_seconds)


def stop_copy_max_bytes(usual_bytes: int, page_bytes: int = 4096) -> int:
    """Bytes one stop may copy: ``usual_bytes``; under a CPU quota at most the pages
    stop_reading_cpu_seconds() copies at the pacer's copy_cpu_seconds_per_page each (whole
    pages, at least one)."""
    reading = stop_reading_cpu_seconds()
    if reading is None:
        return usual_bytes
    pages = max(1, int(reading / stop_pacer().copy_cpu_seconds_per_page))
    return min(usual_bytes, pages * page_bytes)


def stop_reading_seconds(usual_seconds: float, readers: int = 1) -> float:
    """How long one stop may read: ``usual_seconds``; under a CPU quota at most
    stop_reading_cpu_seconds() shared by ``readers`` threads reading at once."""
    reading = stop_reading_cpu_seconds()
    if reading is None:
        return usual_seconds
    return min(usual_seconds, reading / max(1, readers))
