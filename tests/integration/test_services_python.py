"""A multi-threaded Python service (tests/targets/py_service.py) inspected and trimmed under
a load generator whose every answer is checked against the digest it must have."""

from __future__ import annotations

import pytest

from tests.support.service_figures import json_measured_share
from tests.support.service_runs import (
    MIB,
    assert_forecast_close,
    assert_heaps_agree_with_kernel,
    assert_most_measured,
    await_steady_anon,
    cli_inspect,
    inspect,
    share_of,
    trim_at_steady_state,
)
from tests.support.services import LoadGenerator, Prober, TcpService

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "Python py_service"
INSPECTIONS = 6


def _healthy(answer: str) -> bool:
    return answer.startswith("pong ")


def _assert_load_healthy(load: LoadGenerator, ok_before: int) -> None:
    assert load.wrong == 0, f"{load.wrong} answers had the wrong digest"
    assert load.errors == [], load.errors[:3]
    load.wait_for_answers(ok_before)  # correct answers kept coming after the last call


@pytest.mark.timeout(180)
def test_inspections_under_load_measure_the_free_bytes(
    py_service_under_load: tuple[TcpService, LoadGenerator],
) -> None:
    """Six inspections (one through the CLI, one through gdb) under load: every answer stays
    correct, every report read from its memory measured >= 90 % of the free bytes, and,
    stopped, the document agrees with the kernel."""
    service, load = py_service_under_load
    shares = []
    with Prober(service.port, "ping", _healthy) as probe:
        for number in range(INSPECTIONS - 1):
            ok_before = load.ok
            inspection = inspect(
                SERVICE,
                service.pid,
                health=lambda: service.health("ping"),
                method="gdb" if number == 0 else "auto",
            )
            assert len(inspection.analysis.dump.arenas) >= 2  # handler threads get arenas
            if number:  # gdb's dump and walk are two moments: its share is recorded only
                shares.append(share_of(inspection))
            _assert_load_healthy(load, ok_before)
        shares.append(
            json_measured_share(
                cli_inspect(SERVICE, service.pid, health=lambda: service.health("ping"))
            )
        )
        assert_heaps_agree_with_kernel(SERVICE, service.pid)
    assert probe.failures == [], probe.failures[:3]
    _assert_load_healthy(load, load.ok)
    assert_most_measured(shares, SERVICE, at_least=1.0)


@pytest.mark.timeout(180)
def test_trim_forecast_within_tolerance_at_steady_state(
    py_service_under_load: tuple[TcpService, LoadGenerator],
) -> None:
    """The cache has a constant number of slots, so free memory is steady under the load:
    the forecast must be within 25 % of the release, and the answers stay correct."""
    service, load = py_service_under_load
    ok_before = load.ok
    await_steady_anon(service.pid)  # the cache fills in the first seconds of the load
    with Prober(service.port, "ping", _healthy) as probe:
        trim = trim_at_steady_state(SERVICE, service.pid, health=lambda: service.health("ping"))
    assert probe.failures == [], probe.failures[:3]
    _assert_load_healthy(load, ok_before)
    assert trim.steady, f"free bytes moved too much to compare: {trim.free_before}"
    assert trim.result.released_bytes is not None and trim.result.released_bytes > MIB
    assert_forecast_close(trim, SERVICE)
