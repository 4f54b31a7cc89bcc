"""The stand-in call's proof (sources.glibc.list_proof) holds every thread for a walk of the
arenas' heaps; that hold is bounded as a sweep in one stop is (bin_relay.one_stop_seconds).

The target: seeds_heap's unsorted shape, 400,000 blocks (200,000 scattered free chunks in
main_arena, some 90 MiB of heap in RAM), idle, in a memory cgroup. The bound is lowered so
that this heap is past it (the bytes check) or its walk runs past it (the cut), and the
stand-in call is asked for main_arena as the default asks for arenas its read refused. Oracles:
whether a hold of the target was begun at all, whether the call chain was started (spied on
where the call module starts them), the target's /proc status after (running, untraced), and
a control with the bound as shipped: the proof is made and malloc_info is called.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.targets import live_skip_reason, proc_status

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]


@pytest.fixture(scope="module")
def idle_target() -> Iterator[int]:
    from tests.support.targets import compile_target, started_in_cgroup

    with started_in_cgroup(
        [str(compile_target("seeds_heap")), "unsorted", "400000"],
        group_name="memforensics-test-proof-bound",
        limit_bytes=1 << 30,
        arena_max=2,
    ) as pid:
        yield pid


def _main_arena(pid: int) -> Any:
    """The Unproved that names main_arena, as the default's refused read would."""
    from memforensics.entry.readers.call import Unproved
    from memforensics.sources.glibc.heapmaps import scan_heap
    from memforensics.sources.glibc.list_proof import ProofTarget

    scan = scan_heap(pid, arenas_only=True)
    main = next(arena for arena in scan.arenas if arena.is_main)
    assert main.address is not None
    return Unproved((ProofTarget(0, main.address, True),), None)


class _Spies:
    """How often the call module began a hold and started a call chain."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from memforensics.entry.readers import call
        from memforensics.sources.proc.ptrace_hold import ThreadHold as hold
        from memforensics.sources.proc.ptrace_probe import call_chain as chain

        self.holds = self.chains = 0

        def counted_hold(*args: Any, **kwargs: Any) -> Any:
            self.holds += 1
            return hold(*args, **kwargs)

        def counted_chain(*args: Any, **kwargs: Any) -> Any:
            self.chains += 1
            return chain(*args, **kwargs)

        monkeypatch.setattr(call, "ThreadHold", counted_hold)
        monkeypatch.setattr(call, "call_chain", counted_chain)


def _assert_running(pid: int) -> None:
    fields = proc_status(pid)
    assert fields["TracerPid"] == "0" and fields["State"][0] not in "Tt", fields


def _refused_without_a_call(pid: int, monkeypatch: pytest.MonkeyPatch, said: str) -> _Spies:
    """The stand-in call for main_arena refused (GdbMayHelpError saying ``said``), no call
    chain started, the target running untraced after: the spies, for the holds begun."""
    from memforensics.errors import GdbMayHelpError

    spies = _Spies(monkeypatch)
    with pytest.raises(GdbMayHelpError) as refused:
        _call(pid)
    assert said in refused.value.message, refused.value.message
    assert "malloc_info was not called" in refused.value.message
    assert spies.chains == 0
    _assert_running(pid)
    return spies


def _call(pid: int) -> Any:
    from memforensics.entry.readers.call import call_malloc_info
    from memforensics.sources.proc.target_check import check_target

    return call_malloc_info(pid, check_target(pid), 20.0, _main_arena(pid))


def test_a_proof_past_its_bound_is_refused_before_any_hold(
    idle_target: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bound at 10 ms (20 MiB at the rate a proof is judged by) against ~90 MiB of heap: the
    call is refused before any hold of the target is begun, saying why; nothing is called."""
    from memforensics.sources.glibc import bin_relay

    monkeypatch.setattr(bin_relay, "ONE_STOP_MAX_SECONDS", 0.01)
    spies = _refused_without_a_call(idle_target, monkeypatch, "would hold every thread past 0.01 s")
    assert spies.holds == 0


def test_a_proof_past_its_bound_is_refused_in_the_hold_where_the_heaps_grew_since(
    idle_target: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check before the hold passed (as where the heaps grew meanwhile): the proof, in the
    hold, judges the heaps as they are then, and refuses them unwalked; no call is made."""
    from memforensics.entry.readers import call
    from memforensics.sources.glibc import bin_relay

    monkeypatch.setattr(bin_relay, "ONE_STOP_MAX_SECONDS", 0.01)
    monkeypatch.setattr(call, "hold_refusal", lambda *args: None)
    spies = _refused_without_a_call(idle_target, monkeypatch, "would hold every thread past 0.01 s")
    assert spies.holds >= 1


def test_a_proof_whose_walk_runs_past_its_bound_is_cut_there(
    idle_target: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes judged to fit (an absurd rate) but the bound at 1 ms: the walk of ~90 MiB is
    cut at the bound, the proof left unmade, and nothing is called."""
    from memforensics.sources.glibc import bin_relay, list_proof

    monkeypatch.setattr(bin_relay, "ONE_STOP_MAX_SECONDS", 0.001)
    monkeypatch.setattr(list_proof, "PROOF_BYTES_PER_SECOND", 1 << 50)
    spies = _refused_without_a_call(idle_target, monkeypatch, "their walk was cut at 0.001 s")
    assert spies.holds >= 1


def test_within_its_bound_the_proof_is_made_and_malloc_info_called(
    idle_target: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the bound as shipped, the same target and arena: proved, then called."""
    spies = _Spies(monkeypatch)
    called = _call(idle_target)
    assert called.proof is not None and called.proof.proved, called.proof
    assert called.proof.heap_bytes > 64 << 20, called.proof
    assert b"<malloc" in called.xml
    assert spies.chains == 1
    _assert_running(idle_target)
