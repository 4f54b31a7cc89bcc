"""Real services for tests/integration/test_services_*.py, and the figures they measured; and
``release``, each glibc release a module's live tests run on.

Each service is used by one test module and is module-scoped: it starts once per session (when
its module runs) and is stopped in ``finally`` as soon as that module is done, instead of
churning CPU through the rest of the suite. Every start and every load is bounded in time.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator

import pytest

from tests.support import held_out, service_figures
from tests.support.glibc_releases import RELEASES, GlibcRelease, release_tree, skip_reason
from tests.support.postgres import (
    PgbenchRun,
    PostgresCluster,
    postgres_cluster,
    postgres_skip_reason,
)
from tests.support.services import (
    LoadGenerator,
    TcpService,
    c_service,
    java_service,
    java_skip_reason,
    python_service,
)
from tests.support.targets import live_skip_reason

# pgbench runs this long from the module's first test; the inspections and trims take
# ~20 s on a quiet 2-core machine and ~45 s at a load average of 11; the rest is margin.
PGBENCH_SECONDS = 75
PGBENCH_CLIENTS = 4
# A report-style query in 1 of 20 transactions: a backend then mallocs and frees a few MiB of
# sort memory, as a real OLTP + reporting mix does; the rest is pgbench's TPC-B.
PG_SORT_SCRIPT = """\
SET work_mem = '16MB';
SELECT sum(abalance) FROM (SELECT abalance FROM pgbench_accounts WHERE aid <= 60000
  ORDER BY abalance DESC, aid) AS sorted;
"""


def _skip_unless_live(*reasons: str | None) -> None:
    for reason in (live_skip_reason(), *reasons):
        if reason is not None:
            pytest.skip(reason)


@pytest.fixture(scope="module")
def busy_c_service() -> Iterator[TcpService]:
    _skip_unless_live()
    with c_service("4") as service:
        yield service


@pytest.fixture(scope="module")
def jvm_service() -> Iterator[TcpService]:
    _skip_unless_live(java_skip_reason())
    with java_service("16", "10", "48") as service:
        yield service


@pytest.fixture(scope="module")
def py_service_under_load() -> Iterator[tuple[TcpService, LoadGenerator]]:
    _skip_unless_live()
    with python_service("1500") as service:
        load = LoadGenerator(port=service.port, clients=4, pause_seconds=0.02)
        try:
            load.start()
            load.wait_for_answers(20)
            yield service, load
        finally:
            load.stop()


@pytest.fixture(scope="module")
def pg_cluster() -> Iterator[PostgresCluster]:
    _skip_unless_live(postgres_skip_reason())
    with postgres_cluster() as cluster:
        yield cluster


@pytest.fixture(scope="module")
def pgbench_run(pg_cluster: PostgresCluster) -> Iterator[PgbenchRun]:
    """``pgbench -c 4 -T 75`` (TPC-B plus a sort 1 in 20) over the module's tests."""
    script = pg_cluster.root / "sort.sql"
    script.write_text(PG_SORT_SCRIPT)
    script.chmod(0o644)  # pgbench may run as another user than the one writing it
    run = pg_cluster.pgbench(
        clients=PGBENCH_CLIENTS,
        duration_seconds=PGBENCH_SECONDS,
        scripts=("-b", "tpcb-like@19", "-f", f"{script}@1"),
    )
    try:
        yield run
    finally:
        if run.running:
            try:
                run.finish(timeout_seconds=PGBENCH_SECONDS + 30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    run.proc.kill()
                run.proc.wait(timeout=10)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The measured share and forecast error per service, as the issue's closing note wants;
    the held-out heap the session read, where it read one."""
    lines = service_figures.summary_lines()
    if lines:
        terminalreporter.section("service figures (issue 11)")
        for line in lines:
            terminalreporter.write_line(line)
    if os.environ.get(held_out.SEED_VARIABLE):  # drawn where the held-out tests were collected
        terminalreporter.section("held-out heap (issue 31)")
        terminalreporter.write_line(str(held_out.HeldOut.of_session()))


@pytest.fixture(scope="module", params=RELEASES, ids=[f"glibc-{v}" for v in RELEASES])
def release(request: pytest.FixtureRequest) -> GlibcRelease:
    """Each glibc release of tests.support.glibc_releases in turn (its targets run through
    its own loader), for the module that asks; skipped, saying why, where one cannot be had."""
    tree = release_tree(request.param)
    if tree is None:
        pytest.skip(f"glibc {request.param}: {skip_reason(request.param)}")
    return tree
