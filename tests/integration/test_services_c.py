"""A busy multi-threaded C service (tests/targets/busy_service.c) inspected and trimmed while
it works: 4 threads churn a small working set over their fragmented arenas and check every
byte they wrote; a loopback health check reports operations and content errors."""

from __future__ import annotations

import re

import pytest

from tests.support.service_figures import json_measured_share
from tests.support.service_runs import (
    MIB,
    assert_forecast_close,
    assert_heaps_agree_with_kernel,
    assert_most_measured,
    cli_inspect,
    cli_json,
    inspect,
    share_of,
    trim_at_steady_state,
)
from tests.support.services import Prober, TcpService

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "C busy_service"
INSPECTIONS = 6


def _status(service: TcpService) -> tuple[int, int]:
    """(operations, content errors) from the service's health check."""
    match = re.fullmatch(r"ok ops=(\d+) errors=(\d+) pinned=\d+", service.ask("status"))
    assert match is not None, "the health check answered something else"
    return int(match.group(1)), int(match.group(2))


def _healthy(answer: str) -> bool:
    return re.fullmatch(r"ok ops=\d+ errors=0 pinned=\d+", answer) is not None


@pytest.mark.timeout(180)
def test_inspections_under_load_measure_the_free_bytes(busy_c_service: TcpService) -> None:
    """Six inspections (one through the CLI, one through gdb) while the threads churn: the
    service keeps answering, its buffers stay intact, every report read from its memory
    measured >= 90 % of the free bytes, and, stopped, the document agrees with the kernel."""
    ops_before, _ = _status(busy_c_service)
    shares = []
    with Prober(busy_c_service.port, "status", _healthy) as probe:
        for number in range(INSPECTIONS - 1):
            inspection = inspect(
                SERVICE,
                busy_c_service.pid,
                health=lambda: busy_c_service.health("status"),
                method="gdb" if number == 0 else "auto",
            )
            assert len(inspection.analysis.dump.arenas) >= 5  # main + one per worker
            if number:  # gdb's dump and walk are two moments: its share is recorded only
                shares.append(share_of(inspection))
        document = cli_inspect(
            SERVICE, busy_c_service.pid, health=lambda: busy_c_service.health("status")
        )
        shares.append(json_measured_share(document))
        assert_heaps_agree_with_kernel(SERVICE, busy_c_service.pid)
    ops_after, errors = _status(busy_c_service)
    assert errors == 0, f"the service found {errors} corrupted buffers"
    assert ops_after > ops_before
    assert probe.failures == [], probe.failures[:3]
    assert probe.answers, "the health check was never answered"
    assert_most_measured(shares, SERVICE, at_least=1.0)


@pytest.mark.timeout(180)
def test_trim_forecast_within_tolerance_at_steady_state(busy_c_service: TcpService) -> None:
    """The working set has a constant size, so the free memory is steady: the forecast must be
    within 25 % of the RSS the trim gave back; the service keeps working through it."""
    with Prober(busy_c_service.port, "status", _healthy) as probe:
        trim = trim_at_steady_state(
            SERVICE, busy_c_service.pid, health=lambda: busy_c_service.health("status")
        )
    assert probe.failures == [], probe.failures[:3]
    assert _status(busy_c_service)[1] == 0
    assert trim.steady, f"free bytes moved too much to compare: {trim.free_before}"
    assert trim.result.released_bytes is not None and trim.result.released_bytes > 4 * MIB
    assert_forecast_close(trim, SERVICE)


@pytest.mark.timeout(120)
def test_cli_trim_json_on_the_busy_service(busy_c_service: TcpService) -> None:
    """`memforensics trim PID --json` as a user runs it: exit 0, the documented keys, and the
    service still answers with intact buffers."""
    document = cli_json("trim", busy_c_service.pid)
    assert document["schema"] == "memforensics/trim/1"
    assert document["pid"] == busy_c_service.pid
    assert document["trimmed"] is True
    assert document["forecast_bytes"] >= 0
    assert _status(busy_c_service)[1] == 0
