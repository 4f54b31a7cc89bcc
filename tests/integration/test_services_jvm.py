"""A busy OpenJDK 17 service (tests/targets/NativeChurn.java) inspected and trimmed while it
works: 16 threads churn native memory through java.util.zip, off-heap blocks and direct
buffers (freed in bulk by the JVM's Cleaner thread), and a loopback health check reports
round trips and failed ones. The trim test turns the direct buffers off to reach a steady
state, where the forecast bar applies."""

from __future__ import annotations

import re
import time

import pytest

from memforensics.errors import MemforensicsError
from tests.support.service_figures import is_steady, json_measured_share
from tests.support.service_runs import (
    MIB,
    assert_forecast_close,
    assert_heaps_agree_with_kernel,
    assert_most_measured,
    cli_inspect,
    inspect,
    share_of,
    trim_at_steady_state,
)
from tests.support.services import Prober, TcpService, java_healthy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "OpenJDK NativeChurn"
INSPECTIONS = 6


def _status(service: TcpService) -> tuple[int, int]:
    """(round trips, failed round trips) from the service's health check."""
    match = re.fullmatch(r"pong ops=(\d+) errors=(\d+)", service.ask("ping"))
    assert match is not None, "the health check answered something else"
    return int(match.group(1)), int(match.group(2))


def _await_steady_free_memory(service: TcpService, *, timeout_seconds: float = 60.0) -> None:
    """Inspect until two reports in a row agree on the free bytes (the Cleaner has freed the
    last direct buffers); fails past the deadline."""
    deadline = time.monotonic() + timeout_seconds
    previous = None
    while True:
        free = inspect(SERVICE, service.pid, health=lambda: service.health("ping"))
        free_bytes = free.analysis.dump.free_bytes
        if previous is not None and is_steady([previous, free_bytes]):
            return
        assert time.monotonic() < deadline, "the free memory did not settle"
        previous = free_bytes


@pytest.mark.timeout(180)
def test_inspections_under_load_measure_the_free_bytes(jvm_service: TcpService) -> None:
    """Six inspections (one through the CLI, one through gdb) while the JVM churns: it keeps
    answering and making progress, every report read from its memory measured >= 90 % of
    the free bytes, and, stopped, the document agrees with the kernel."""
    assert jvm_service.ask("direct on").startswith("pong")  # the hard case: bulk frees
    ops_before, _ = _status(jvm_service)
    shares = []
    with Prober(jvm_service.port, "ping", java_healthy) as probe:
        try:
            # gdb's path (opt-in): its dump and walk are two moments, so its share is not
            # held to the bar. gdb can lose a JVM thread that exits during its session
            # ("Couldn't get registers: No such process"): a clean refusal is allowed there,
            # harm is not (the prober, the liveness and progress checks below).
            inspect(SERVICE, jvm_service.pid, method="gdb")
        except MemforensicsError as exc:
            print(f"{SERVICE}: the gdb path refused: {exc}")
        assert jvm_service.target.alive()
        for _ in range(INSPECTIONS - 2):
            inspection = inspect(
                SERVICE, jvm_service.pid, health=lambda: jvm_service.health("ping")
            )
            assert len(inspection.analysis.dump.arenas) >= 8  # the workers spread over arenas
            shares.append(share_of(inspection))
            assert jvm_service.target.alive()
        shares.append(
            json_measured_share(
                cli_inspect(SERVICE, jvm_service.pid, health=lambda: jvm_service.health("ping"))
            )
        )
        assert_heaps_agree_with_kernel(SERVICE, jvm_service.pid)
    ops_after, errors = _status(jvm_service)
    assert errors == 0, f"{errors} compress/inflate round trips gave wrong bytes"
    assert ops_after > ops_before, "the JVM made no progress"
    assert probe.failures == [], probe.failures[:3]
    # "One truth per figure": the default read's dump and walk are one moment, so every
    # report measures >= 90 % of its free bytes (the bar was 3 of 5).
    assert_most_measured(shares, SERVICE, at_least=1.0)


@pytest.mark.timeout(180)
def test_trim_forecast_within_tolerance_at_steady_state(jvm_service: TcpService) -> None:
    """Without the direct buffers each worker replaces one Deflater and one off-heap block
    per round, so native free memory is steady: the forecast must be within 25 % of the
    release."""
    assert jvm_service.ask("direct off").startswith("pong")
    _await_steady_free_memory(jvm_service)
    with Prober(jvm_service.port, "ping", java_healthy) as probe:
        trim = trim_at_steady_state(
            SERVICE, jvm_service.pid, health=lambda: jvm_service.health("ping")
        )
    assert probe.failures == [], probe.failures[:3]
    assert _status(jvm_service)[1] == 0
    assert trim.steady, f"free bytes moved too much to compare: {trim.free_before}"
    assert trim.result.released_bytes is not None and trim.result.released_bytes > MIB
    assert_forecast_close(trim, SERVICE)
