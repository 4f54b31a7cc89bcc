"""The pure parts of malloc_info called without gdb (sources.glibc.called_malloc_info), and
the chained calls' driver (sources.proc.ptrace_probe.call_chain) without a target."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from memforensics.sources.glibc import called_malloc_info as called
from memforensics.sources.proc import ptrace_probe
from memforensics.sources.proc.procmaps import parse_maps
from memforensics.sources.proc.ptrace_probe import ProbeCall

MAPS = """\
555555554000-555555556000 r-xp 00000000 08:01 100 /usr/bin/target
555555556000-555555577000 rw-p 00000000 00:00 0 [heap]
7ffff7d00000-7ffff7f00000 r-xp 00000000 08:01 200 /usr/lib/libc.so.6
7ffff7f00000-7ffff7f10000 rw-p 00000000 00:00 0
7ffff7fc0000-7ffff7ff0000 r-xp 00000000 08:01 300 /usr/lib/ld-linux-x86-64.so.2
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]
"""


def test_the_region_goes_below_the_lowest_mapping_above_the_heap() -> None:
    start = called.choose_region(parse_maps(MAPS))
    assert start is not None
    # The top of the gap between [heap] and libc, a MiB short of libc; far above brk.
    assert start + called.REGION_BYTES == 0x7FFFF7D00000 - (1 << 20)
    assert start % called.PAGE_BYTES == 0


def test_the_region_is_never_next_to_the_stack_nor_just_above_brk() -> None:
    # Only two gaps: one below [stack] (grows down), one just above [heap] (grows up).
    maps = """\
555555554000-555555556000 r-xp 00000000 08:01 100 /usr/bin/target
555555556000-555555577000 rw-p 00000000 00:00 0 [heap]
555575577000-555575578000 rw-p 00000000 00:00 0
555575578000-7ffff0000000 rw-p 00000000 00:00 0
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
"""
    assert called.choose_region(parse_maps(maps)) is None


def test_a_gap_too_small_is_skipped() -> None:
    maps = """\
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
7f0004000000-7f0004100000 rw-p 00000000 00:00 0
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
"""
    # 63 MiB between the two mappings: less than the region and its margins.
    assert called.choose_region(parse_maps(maps)) is None


@pytest.mark.parametrize(
    ("release", "refused"),
    [
        ("4.16.18", True),
        ("3.10.0-1160.el7.x86_64", True),
        ("4.17.0", False),
        ("5.15.0-91-generic", False),
        ("6.18.44-fc-v669", False),
        ("weird", True),
    ],
)
def test_kernels_without_map_fixed_noreplace_are_refused(release: str, refused: bool) -> None:
    assert (called.kernel_refusal(release) is not None) is refused


class _Hold:
    """Enough of a ThreadHold for call_chain: one thread in a plain stop."""

    pid = 1

    def __init__(self) -> None:
        self.stop_kinds = {1: "interrupt"}

    def in_tracer(self, work: Any) -> Any:
        return work()

    def resumed(self, tid: int) -> None:
        pass


def _fake_calls(monkeypatch: pytest.MonkeyPatch, scratches: list[bytes]) -> list[int]:
    made: list[int] = []
    monkeypatch.setattr(ptrace_probe.ptrace_regs, "request", lambda *a: 0)
    monkeypatch.setattr(ptrace_probe, "signal_mask", lambda pid, tid: 0)

    def enter(pid: int, tid: int, function: int, *args: Any, **kwargs: Any) -> int:
        made.append(function)
        return function

    def sigreturn(pid: int, tid: int, frame: Any, size: int, deadline: float) -> bytes | None:
        return scratches.pop(0)

    monkeypatch.setattr(ptrace_probe, "enter_call", enter)
    monkeypatch.setattr(ptrace_probe, "_await_sigreturn", sigreturn)
    return made


def test_a_chain_gets_each_calls_scratch_and_chooses_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made = _fake_calls(monkeypatch, [b"\x05", b"\x07"])

    def chain() -> Generator[ProbeCall, bytes, int]:
        first = yield ProbeCall(100, (), b"\0")
        second = yield ProbeCall(200 + first[0], (), b"\0")  # depends on the first's result
        return first[0] + second[0]

    result = ptrace_probe.call_chain(_Hold(), 1, chain(), restore_rt=0, deadline=0.0)  # type: ignore[arg-type]
    assert result == 12 and made == [100, 205]


def test_a_chain_is_closed_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    made = _fake_calls(monkeypatch, [])
    monkeypatch.setattr(ptrace_probe, "_await_sigreturn", lambda *a: None)
    closed: list[bool] = []

    def chain() -> Generator[ProbeCall, bytes, int]:
        try:
            yield ProbeCall(100, (), b"")
            yield ProbeCall(200, (), b"")
        except GeneratorExit:
            closed.append(True)
            raise
        return 1

    result = ptrace_probe.call_chain(_Hold(), 1, chain(), restore_rt=0, deadline=0.0)  # type: ignore[arg-type]
    assert result is None and made == [100] and closed == [True]
