"""The read where the seeds' users live, on a real service: OpenJDK running NativeChurn
(tests/targets/NativeChurn.java) with a burst of 460 Deflaters per worker, so that ten or more
of its glibc arenas hold 100-250 MiB each, about 80 % of it free in big chunks trapped between
live ones, while its 16 threads keep churning native memory.

The default read must take every arena from the JVM's memory (no fallback, no refusal), most
of them scouted (their stops copy only the pages their lists lie on), measure the residency of
the free bytes, keep the service answering and correct, and, the JVM stopped, agree with the
kernel's view of its heaps (tests/support/kernel_heaps.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from memforensics.model.inspection import Inspection
from tests.support.service_runs import (
    MIB,
    assert_heaps_agree_with_kernel,
    assert_most_measured,
    inspect,
    share_of,
)
from tests.support.services import (
    Prober,
    TcpService,
    java_healthy,
    java_service,
    java_skip_reason,
)
from tests.support.targets import live_skip_reason

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "OpenJDK NativeChurn at the seeds' scale"
BURST = "460"  # Deflaters per worker at its start (~260 KiB of zlib state each), 5 in 6 ended
BIG_ARENA_BYTES = 100 * MIB
BIG_ARENAS = 10
LIMIT_BYTES = 4 << 30  # its RSS is ~0.8 GiB, its arenas' address space ~2 GiB
READS = 3


@pytest.fixture(scope="module")
def big_jvm() -> Iterator[TcpService]:
    for reason in (live_skip_reason(), java_skip_reason()):
        if reason is not None:
            pytest.skip(reason)
    with java_service("16", "6", BURST, memory_limit_bytes=LIMIT_BYTES) as service:
        yield service


def _big_arenas(inspection: Inspection) -> int:
    return sum(a.system_bytes >= BIG_ARENA_BYTES for a in inspection.analysis.dump.arenas)


@pytest.mark.timeout(240)
def test_a_busy_jvm_with_arenas_of_100_mib_and_more_is_read_from_its_memory(
    big_jvm: TcpService,
) -> None:
    health = lambda: big_jvm.health("ping")  # noqa: E731
    with Prober(big_jvm.port, "ping", java_healthy) as probe:
        # The workers' bursts run after "ready": read until they have built the big arenas
        # (each read in the meantime must succeed as well).
        deadline = time.monotonic() + 120
        inspection = inspect(SERVICE, big_jvm.pid, health=health)
        while _big_arenas(inspection) < BIG_ARENAS:
            assert time.monotonic() < deadline, "the bursts never built ten arenas of 100 MiB"
            time.sleep(1)
            inspection = inspect(SERVICE, big_jvm.pid, health=health)
        shares = []
        for _ in range(READS):
            inspection = inspect(SERVICE, big_jvm.pid, health=health)
            assert _big_arenas(inspection) >= BIG_ARENAS
            read = inspection.read_only
            assert read is not None and read.source == "live"
            # Arenas above the size copied whole are scouted: their stops copy the list pages.
            assert read.scouted_arenas >= BIG_ARENAS, read
            assert (
                read.stop_copy_bytes
                < sum(a.system_bytes for a in inspection.analysis.dump.arenas) // 4
            ), "the stops copied the big arenas whole"
            shares.append(share_of(inspection))
            assert big_jvm.target.alive()
        assert_heaps_agree_with_kernel(SERVICE, big_jvm.pid)
    answer = big_jvm.ask("ping")
    assert java_healthy(answer), f"compress/inflate round trips gave wrong bytes: {answer}"
    assert probe.failures == [], probe.failures[:3]
    assert_most_measured(shares, SERVICE, at_least=1.0)
