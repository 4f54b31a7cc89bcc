"""cpu_quota: the quota read from cgroup files (v1 and v2, nested, a container's own root),
and StopPacer's wait on a simulated clock (its CPU time given by the test)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from memforensics.sources.glibc.arena_hold import StopBatches
from memforensics.sources.glibc.heapmaps import StopRules
from memforensics.sources.proc import cpu_quota as cq
from memforensics.sources.proc.cpu_quota import CpuQuota, StopPacer, cpu_quota
from tests.support.fake_proc import fake_proc


def _v1_mount(point: Path, root: str = "/") -> str:
    return f"32 31 0:29 {root} {point} rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"


def _v2_mount(point: Path, root: str = "/") -> str:
    return f"30 23 0:27 {root} {point} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"


def test_v1_the_tightest_quota_of_our_cgroup_and_its_ancestors(tmp_path: Path) -> None:
    mount = tmp_path / "cpu"
    pod, container = mount / "kubepods" / "pod1", mount / "kubepods" / "pod1" / "c1"
    container.mkdir(parents=True)
    for directory, quota in ((mount, -1), (mount / "kubepods", -1), (pod, 50_000)):
        (directory / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        (directory / "cpu.cfs_period_us").write_text("100000\n")
    (container / "cpu.cfs_quota_us").write_text("-1\n")
    (container / "cpu.cfs_period_us").write_text("100000\n")
    proc = fake_proc(tmp_path, "4:memory:/x\n3:cpu,cpuacct:/kubepods/pod1/c1\n", _v1_mount(mount))
    assert cpu_quota(proc) == CpuQuota(0.05, 0.1, str(pod))
    (container / "cpu.cfs_quota_us").write_text("20000\n")
    (container / "cpu.cfs_period_us").write_text("50000\n")
    found = cpu_quota(proc)
    assert found == CpuQuota(0.02, 0.05, str(container))
    assert found is not None and found.cpus == pytest.approx(0.4)


@pytest.mark.parametrize(
    ("path", "root"),
    [("/", "/"), ("/kubepods/podA/cB", "/kubepods/podA/cB")],
    ids=["cgroup-namespace", "bind-mounted-own-cgroup"],
)
def test_v2_a_container_sees_its_own_cgroup_at_its_mount(
    tmp_path: Path, path: str, root: str
) -> None:
    """A container's cgroup mounted as the container's /sys/fs/cgroup: in a cgroup
    namespace its path and the mount's root are "/"; without one, both are the host's path."""
    mount = tmp_path / "cgroup"
    mount.mkdir()
    (mount / "cpu.max").write_text("25000 100000\n")
    proc = fake_proc(tmp_path, f"0::{path}\n", _v2_mount(mount, root=root))
    assert cpu_quota(proc) == CpuQuota(0.025, 0.1, str(mount))


def test_a_mount_that_does_not_hold_our_cgroup_is_not_read(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    mount.mkdir()
    (mount / "cpu.max").write_text("25000 100000\n")
    proc = fake_proc(tmp_path, "0::/elsewhere\n", _v2_mount(mount, root="/kubepods/podA/cB"))
    assert cpu_quota(proc) is None


def test_v2_max_and_unreadable_files_are_no_quota(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup"
    (mount / "a").mkdir(parents=True)
    (mount / "a" / "cpu.max").write_text("max 100000\n")
    proc = fake_proc(tmp_path, "0::/a\n", _v2_mount(mount))
    assert cpu_quota(proc) is None
    (mount / "a" / "cpu.max").write_text("garbage\n")
    assert cpu_quota(proc) is None
    assert cpu_quota(tmp_path / "nowhere") is None


class _Clock:
    """Wall and CPU time of a simulated process: ``sleep`` moves the wall alone, ``work``
    both (one thread busy)."""

    def __init__(self) -> None:
        self.wall, self.cpu = 100.0, 5.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.wall += seconds

    def work(self, seconds: float) -> None:
        self.wall += seconds
        self.cpu += seconds


def _pacer(clock: _Clock, quota: CpuQuota | None) -> StopPacer:
    return StopPacer(
        quota, clock=lambda: clock.wall, cpu_clock=lambda: clock.cpu, sleep=clock.sleep
    )


QUOTA = CpuQuota(0.02, 0.1, "/sys/fs/cgroup/x")  # 0.2 CPU


def test_without_a_quota_a_stop_never_waits() -> None:
    clock = _Clock()
    pacer = _pacer(clock, None)
    clock.work(1.0)
    pacer.before_stop()
    pacer.after_stop()
    assert clock.slept == [] and pacer.waited_seconds == 0.0


def test_a_stop_waits_until_the_last_period_leaves_room_for_it() -> None:
    """After busy work, the stop waits until our CPU time over the last period, with the
    stop's own, fits MARGIN of the quota: then no period of the kernel's, whatever its
    phase, can have run out before the stop ends."""
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    clock.work(0.5)  # busy: far more than the quota's 20 ms a period
    pacer.before_stop()
    waited = pacer.waited_seconds
    assert 0.1 <= waited <= cq.MAX_WAIT_PERIODS * QUOTA.period_seconds + 0.011
    # At the stop's start, the window of one period holds no more than the room.
    room = cq.MARGIN * QUOTA.quota_seconds - cq.FIRST_STOP_CPU_SECONDS
    assert pacer._used_in_window(clock.wall, clock.cpu) <= room
    clock.work(0.004)
    pacer.after_stop()
    # An idle moment later there is room at once.
    clock.sleep(0.2)
    clock.slept.clear()
    pacer.before_stop()
    assert clock.slept == []
    pacer.after_stop()


def test_light_work_between_stops_needs_no_wait() -> None:
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    clock.sleep(0.15)  # history of a quiet period
    clock.slept.clear()
    for _ in range(5):
        pacer.before_stop()
        clock.work(0.001)
        pacer.after_stop()
        clock.sleep(0.05)
        clock.work(0.001)
    assert pacer.waited_seconds == 0.0


def test_a_stop_that_cannot_fit_waits_for_a_quiet_window_only() -> None:
    """A stop that took more CPU than the quota allows waits, next time, no longer than
    MAX_WAIT_PERIODS periods (there is no room to find: a quiet window is the best)."""
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    clock.sleep(0.15)
    pacer.before_stop()
    clock.work(0.05)  # 50 ms of CPU in one stop: more than the 20 ms quota
    pacer.after_stop()
    assert pacer.stop_cpu_seconds == pytest.approx(0.05)
    began = clock.wall
    pacer.before_stop()
    assert clock.wall - began <= cq.MAX_WAIT_PERIODS * QUOTA.period_seconds + 0.011
    assert pacer._used_in_window(clock.wall, clock.cpu) == pytest.approx(0.0)


def test_the_first_stop_assumes_the_worst_of_what_came_before() -> None:
    """What our process ran before the pacer's first sample is unknown: counted as inside
    the window until a sample a period old exists."""
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    pacer.before_stop()
    assert pacer.waited_seconds >= QUOTA.period_seconds


class _PollingClock(_Clock):
    """A process whose every look at its clocks costs CPU time, as a real wait's does."""

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        self.cpu += 0.0001  # the wait's own look after each nap


def test_a_stop_that_cannot_fit_starts_after_one_quiet_period_though_waiting_costs_cpu() -> None:
    """The wait's own looks cost CPU time: a window with no CPU time at all is never found,
    and a stop that cannot fit would always wait MAX_WAIT_PERIODS. A window of at most
    QUIET_SHARE of the quota is quiet enough."""
    clock = _PollingClock()
    pacer = _pacer(clock, QUOTA)
    clock.sleep(0.15)
    pacer.before_stop()
    clock.work(0.05)  # more than the quota: it cannot fit
    pacer.after_stop()
    began = clock.wall
    pacer.before_stop()
    waited = clock.wall - began
    assert QUOTA.period_seconds <= waited < 1.5 * QUOTA.period_seconds
    assert pacer._used_in_window(clock.wall, clock.cpu) <= cq.QUIET_SHARE * QUOTA.quota_seconds


def test_a_stop_is_assumed_to_cost_what_the_last_ones_cost_not_a_fixed_floor() -> None:
    """After cheap stops the pacer expects a cheap one (it forgets the first guess), so a
    stop that fits the quota is not made to wait for a quiet window."""
    clock = _Clock()
    pacer = _pacer(clock, CpuQuota(0.01, 0.1, "/sys/fs/cgroup/x"))  # 0.1 CPU
    clock.sleep(0.15)
    for _ in range(30):
        pacer.before_stop()
        clock.work(0.004)
        pacer.after_stop()
        clock.sleep(0.1)
    assert pacer.stop_cpu_seconds == pytest.approx(0.004)
    assert pacer.stop_cpu_seconds < cq.FIRST_STOP_CPU_SECONDS


def test_the_pacer_measures_what_holding_the_threads_costs_a_stop() -> None:
    """``held`` and ``releasing`` bracket the stop's reading: what came before the one and
    after the other is the hold's cost, remembered as the stops' is."""
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    clock.sleep(0.15)
    pacer.before_stop()
    clock.work(0.0012)  # holding every thread
    pacer.held()
    clock.work(0.006)  # reading
    pacer.releasing()
    clock.work(0.0005)  # letting them go
    pacer.after_stop()
    # The first guess is forgotten slowly (a tenth a stop), as the stops' own is.
    assert pacer.hold_cpu_seconds == pytest.approx(0.9 * cq.FIRST_HOLD_CPU_SECONDS)
    for _ in range(40):
        clock.sleep(0.2)
        pacer.before_stop()
        clock.work(0.0012)
        pacer.held()
        clock.work(0.006)
        pacer.releasing()
        clock.work(0.0005)
        pacer.after_stop()
    assert pacer.hold_cpu_seconds == pytest.approx(0.0017)
    assert pacer.stop_cpu_seconds == pytest.approx(0.0077)


@pytest.mark.parametrize("quota", [None, CpuQuota(0.01, 0.1, "/x"), CpuQuota(0.2, 0.1, "/x")])
def test_what_one_stop_may_read_fits_the_room_the_quota_leaves(
    monkeypatch: pytest.MonkeyPatch, quota: CpuQuota | None
) -> None:
    """Without a quota, a stop's bounds are the readers' own. Under one, what a stop copies
    at COPY_CPU_SECONDS_PER_PAGE, with the hold's measured cost and the reading's set-up,
    stays within MARGIN of the quota; a big quota leaves the usual bounds alone."""
    clock = _Clock()
    pacer = _pacer(clock, quota)
    pacer.hold_cpu_seconds = 0.0015
    monkeypatch.setattr(cq, "_pacer", pacer)
    usual_bytes, usual_seconds = 16 << 20, 0.008
    copy_bytes = cq.stop_copy_max_bytes(usual_bytes)
    seconds = cq.stop_reading_seconds(usual_seconds, readers=2)
    if quota is None or quota.cpus >= 1:
        assert (copy_bytes, seconds) == (usual_bytes, usual_seconds)
        return
    assert 0 < copy_bytes < usual_bytes and copy_bytes % 4096 == 0
    stop_cpu = (
        pacer.hold_cpu_seconds
        + cq.READING_SETUP_CPU_SECONDS
        + copy_bytes // 4096 * cq.COPY_CPU_SECONDS_PER_PAGE
    )
    assert stop_cpu <= cq.MARGIN * quota.quota_seconds + 1e-9
    assert 2 * seconds + pacer.hold_cpu_seconds <= cq.MARGIN * quota.quota_seconds + 1e-9


def test_what_a_page_cost_the_last_stop_sizes_the_next_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A stop that copied pages at more CPU a page than assumed makes the next stops copy
    fewer; cheaper pages let them grow back slowly, to what the default cost allows and no
    further. Without a quota nothing is learnt."""
    clock = _Clock()
    pacer = _pacer(clock, CpuQuota(0.01, 0.1, "/x"))  # 0.1 CPU
    monkeypatch.setattr(cq, "_pacer", pacer)

    def stop(pages: int, per_page_seconds: float) -> None:
        clock.sleep(0.2)
        pacer.before_stop()
        clock.work(0.0015)
        pacer.held()
        clock.work(cq.READING_SETUP_CPU_SECONDS + pages * per_page_seconds)
        pacer.releasing()
        pacer.after_stop()
        pacer.learn_copy_cost(pages)

    before = cq.stop_copy_max_bytes(16 << 20)
    stop(800, 2 * cq.COPY_CPU_SECONDS_PER_PAGE)  # dearer than assumed
    assert pacer.copy_cpu_seconds_per_page == pytest.approx(2 * cq.COPY_CPU_SECONDS_PER_PAGE)
    dear = cq.stop_copy_max_bytes(16 << 20)
    assert dear < before
    reading = cq.stop_reading_cpu_seconds()
    assert reading is not None
    assert dear // 4096 * 2 * cq.COPY_CPU_SECONDS_PER_PAGE <= reading + 1e-9
    for _ in range(30):
        stop(800, cq.COPY_CPU_SECONDS_PER_PAGE / 3)
    assert pacer.copy_cpu_seconds_per_page == pytest.approx(cq.COPY_CPU_SECONDS_PER_PAGE)
    reading = cq.stop_reading_cpu_seconds()
    assert reading is not None
    assert cq.stop_copy_max_bytes(16 << 20) == int(reading / cq.COPY_CPU_SECONDS_PER_PAGE) * 4096
    free = _pacer(_Clock(), None)
    free.learn_copy_cost(800)
    assert free.copy_cpu_seconds_per_page == cq.COPY_CPU_SECONDS_PER_PAGE


def test_a_work_deadline_is_pushed_back_by_the_pacers_waits_and_nothing_else(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A budget of our work (a read's, its relays') is of CPU time: the seconds the pacer
    waits for room in the quota are added to it as they happen, so a loop of paced stops
    asking ``passed`` at each turn runs out on its work alone, not on its waits."""
    clock = _Clock()
    pacer = _pacer(clock, CpuQuota(0.01, 0.1, "/x"))  # 0.1 CPU: a CPU second is 10 s of wall
    monkeypatch.setattr(cq, "_pacer", pacer)
    deadline = cq.WorkDeadline(0.05, clock=lambda: clock.wall)
    assert deadline.at() == pytest.approx(clock.wall + 0.5)
    stops = 0
    while not deadline.passed():
        pacer.before_stop()  # (each stop after busy work waits about a period)
        clock.work(0.01)
        pacer.after_stop()
        clock.work(0.02)  # the work between stops
        stops += 1
    assert pacer.waited_seconds > 0.5  # waiting alone would have spent the budget
    # The 0.5 s of wall are spent on the work between and in the stops (30 ms a stop).
    assert stops == pytest.approx(0.5 / 0.03, abs=1)
    assert deadline.left_seconds() <= 0


def test_time_excluded_from_a_work_deadline_counts_its_waits_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A relay's time is its own: the read's budget is pushed back by all of it, the waits
    its stops made inside included, but those waits not a second time."""
    clock = _Clock()
    pacer = _pacer(clock, CpuQuota(0.01, 0.1, "/x"))
    monkeypatch.setattr(cq, "_pacer", pacer)
    deadline = cq.WorkDeadline(0.1, clock=lambda: clock.wall)
    before = deadline.at()
    with deadline.excluded():
        for _ in range(3):
            clock.work(0.05)
            pacer.before_stop()
            clock.work(0.005)
            pacer.after_stop()
    assert pacer.waited_seconds > 0
    spent = clock.wall - 100.0
    assert deadline.at() == pytest.approx(before + spent)
    deadline.extend(0.01)  # of CPU: 0.1 s of wall under 0.1 CPU
    assert deadline.at() == pytest.approx(before + spent + 0.1)


def test_without_a_quota_a_work_deadline_is_a_plain_moment(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _Clock()
    monkeypatch.setattr(cq, "_pacer", _pacer(clock, None))
    deadline = cq.WorkDeadline(2.0, start=50.0, clock=lambda: clock.wall)
    assert deadline.at() == 52.0 and deadline.passed()
    assert cq.WorkDeadline(2.0, clock=lambda: clock.wall).left_seconds() == 2.0


def test_a_hold_that_alone_outgrows_the_quota_leaves_the_usual_bounds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Holding 1,501 threads costs ~35 ms of CPU a stop, more than 0.1 CPU's room: no stop
    can fit, so none is cut (cut to the least reading, a read of 1,500 small arenas took a
    stop per arena, the hold paid 1,500 times). One dear hold among cheap ones (34 threads:
    1.3-6.9 ms) does not lift the cut: the least of the last holds decides."""
    clock = _Clock()
    pacer = _pacer(clock, CpuQuota(0.01, 0.1, "/x"))  # 0.1 CPU
    monkeypatch.setattr(cq, "_pacer", pacer)

    def stop(hold_seconds: float) -> None:
        clock.sleep(0.2)
        pacer.before_stop()
        clock.work(hold_seconds / 2)
        pacer.held()
        clock.work(0.002)
        pacer.releasing()
        clock.work(hold_seconds / 2)
        pacer.after_stop()

    for _ in range(cq.RECENT_HOLDS - 1):
        stop(0.035)
    assert cq.stop_reading_cpu_seconds() == cq.MIN_READING_CPU_SECONDS  # (not known yet)
    stop(0.035)
    assert cq.stop_reading_cpu_seconds() is None
    assert cq.stop_copy_max_bytes(16 << 20) == 16 << 20
    assert cq.stop_reading_seconds(0.008, readers=2) == 0.008
    # Cheap holds again (another target): cut again, and kept cut through one dear hold.
    for _ in range(60):
        stop(0.0015)
    stop(0.0069)
    reading = cq.stop_reading_cpu_seconds()
    assert reading == pytest.approx(cq.MIN_READING_CPU_SECONDS)
    assert cq.stop_copy_max_bytes(16 << 20) < 1 << 20


@pytest.mark.parametrize(
    "quota", [None, CpuQuota(0.01, 0.1, "/x"), CpuQuota(0.2, 0.1, "/x")], ids=["none", "0.1", "2"]
)
def test_an_arena_whose_whole_copy_would_not_fit_a_stop_is_scouted(
    monkeypatch: pytest.MonkeyPatch, quota: CpuQuota | None
) -> None:
    """An arena is scouted from 32 MiB of heap; under a quota whose room one stop's copy of
    that does not fit, from what fits it (a whole copy is not cut to the room, a scouted
    arena's pages are). Without a quota, or under one with room, nothing changes."""
    pacer = _pacer(_Clock(), quota)
    pacer.hold_cpu_seconds = 0.0015
    monkeypatch.setattr(cq, "_pacer", pacer)
    hold = StopBatches(os.getpid(), libc=None, single_threaded=False)  # (holds nothing yet)
    rules = StopRules(hold, copy_max_bytes=192 << 20)
    assert not StopRules(None, copy_max_bytes=192 << 20).scouts(1 << 30)  # a core: no stop
    assert rules.scouts(32 << 20)
    fits = cq.stop_copy_max_bytes(32 << 20)
    if quota is None or quota.cpus >= 1:
        assert fits == 32 << 20 and not rules.scouts(16 << 20)
        return
    assert 0 < fits < 16 << 20
    assert rules.scouts(fits) and rules.scouts(16 << 20)
    assert not rules.scouts(fits - 4096)


def test_work_leading_to_a_stop_is_waited_for_before_it_and_not_again() -> None:
    """A busy arena's catch-up (leading_to_stop) waits for room for itself and the stop,
    so the stop follows it at once: the lists it learnt have no wait to move in."""
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    clock.sleep(0.15)
    pacer.before_stop()
    clock.work(0.010)  # a stop of 10 ms
    pacer.after_stop()
    with pacer.leading_to_stop():
        clock.work(0.004)
    assert pacer.lead_cpu_seconds == pytest.approx(0.004)
    # The next lead-in: 4 ms of it and the 10 ms stop fill the 14 ms room (a quiet window).
    clock.sleep(0.2)
    clock.work(0.001)
    clock.slept.clear()
    with pacer.leading_to_stop():
        clock.work(0.004)
    waited_before_work = sum(clock.slept)
    clock.slept.clear()
    pacer.before_stop()  # 5 ms in the window, 10 ms to come: the lead's 4 ms were waited for
    assert clock.slept == []
    assert waited_before_work == 0.0
    pacer.after_stop()


def test_a_lead_in_waits_for_room_for_itself_and_the_stop() -> None:
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    clock.sleep(0.15)
    pacer.before_stop()
    clock.work(0.006)
    pacer.after_stop()
    pacer.lead_cpu_seconds = 0.006
    clock.work(0.004)  # 10 ms in the window: the 6 ms stop alone would fit the 14 ms room
    clock.slept.clear()
    with pacer.leading_to_stop():
        used = pacer._used_in_window(clock.wall, clock.cpu)
        assert used <= cq.MARGIN * QUOTA.quota_seconds - 0.012 + 1e-9
        clock.work(0.006)
    assert clock.slept  # it waited for both
    clock.slept.clear()
    pacer.before_stop()
    assert clock.slept == []


def test_a_stop_long_after_the_lead_in_waits_for_it_as_for_any_work() -> None:
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    clock.sleep(0.15)
    with pacer.leading_to_stop():
        clock.work(0.012)
    clock.sleep(cq.LEAD_GAP_SHARE * QUOTA.period_seconds * 2)
    clock.work(0.002)
    clock.slept.clear()
    pacer.before_stop()  # 14 ms in the window and 10 ms to come: not forgiven any more
    assert clock.slept


def test_without_a_quota_a_lead_in_never_waits() -> None:
    clock = _Clock()
    pacer = _pacer(clock, None)
    clock.work(1.0)
    with pacer.leading_to_stop():
        clock.work(0.01)
    pacer.before_stop()
    assert clock.slept == [] and pacer.waited_seconds == 0.0


class _Hold:
    """heapmaps.ArenaHold's face as StopRules uses it, over a pacer's simulated stop."""

    def __init__(self, clock: _Clock, pacer: StopPacer) -> None:
        self.clock, self.pacer, self.stopped = clock, pacer, False

    def stop(self, reading_seconds: float) -> None:
        self.pacer.before_stop()
        self.clock.work(0.001)  # holding the threads
        self.pacer.held()
        self.clock.work(reading_seconds)
        self.stopped = True

    def release(self) -> None:
        if self.stopped:
            self.pacer.releasing()
            self.clock.work(0.001)
            self.pacer.after_stop()
            self.stopped = False

    def make_room(self, weight_bytes: int) -> None:
        pass


def test_the_stop_of_scouted_arenas_teaches_the_pacer_their_cost_per_scouted_page(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Whichever way the stop of scouted arenas (or parts) ends (let_run, settle), what its
    reading cost per page scouted for them sizes the parts after it: a busy arena's stop,
    which also copies what its catch-up and rescout found, makes the next parts smaller."""
    clock = _Clock()
    pacer = _pacer(clock, QUOTA)
    monkeypatch.setattr(cq, "_pacer", pacer)
    clock.sleep(0.15)
    hold = _Hold(clock, pacer)
    rules = StopRules(hold, copy_max_bytes=192 << 20)  # type: ignore[arg-type]
    before = cq.stop_copy_max_bytes(32 << 20)
    hold.stop(0.021)
    rules.stop_scouted_pages = 1000  # (add_parts: one unsplit arena's scouted pages)
    rules.let_run()
    per_page = (0.021 - cq.READING_SETUP_CPU_SECONDS) / 1000
    assert pacer.copy_cpu_seconds_per_page == pytest.approx(per_page)
    assert rules.stop_scouted_pages == 0
    assert cq.stop_copy_max_bytes(32 << 20) < before
    clock.sleep(0.2)
    hold.stop(0.03)
    rules.stop_scouted_pages = 1000
    rules.settle(force=True)
    assert pacer.copy_cpu_seconds_per_page == pytest.approx(
        (0.03 - cq.READING_SETUP_CPU_SECONDS) / 1000
    )


@pytest.mark.parametrize("quota", [None, CpuQuota(0.01, 0.1, "/x")])
def test_a_sweep_in_one_stop_is_bounded_by_what_one_stop_may_read_in_the_quota(
    monkeypatch: pytest.MonkeyPatch, quota: CpuQuota | None
) -> None:
    """The one stop of a busy arena's sweep (bin_relay) is a stop like any other: under a
    quota of a tenth of a CPU it may read no longer than the quota leaves room for (its two
    readers and the hold within MARGIN of the quota), not its usual 1.5 s; without one, 1.5 s."""
    from memforensics.sources.glibc import bin_relay

    pacer = _pacer(_Clock(), quota)
    pacer.hold_cpu_seconds = 0.0015
    monkeypatch.setattr(cq, "_pacer", pacer)
    seconds = bin_relay.one_stop_seconds()
    if quota is None:
        assert seconds == bin_relay.ONE_STOP_MAX_SECONDS
        return
    assert 2 * seconds + pacer.hold_cpu_seconds <= cq.MARGIN * quota.quota_seconds + 1e-9
