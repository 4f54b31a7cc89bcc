"""PostgreSQL 15 backends inspected and trimmed while pgbench drives them.

A throwaway cluster (tests/support/postgres.py) runs ``pgbench -c 4 -T 75`` from the module's
first test; the tests pick the backends serving pgbench (children of the postmaster whose
title names the bench database), inspect each several times and trim some, and the last test
waits for pgbench to finish: 0 failed transactions, and a server log without a crash.
"""

from __future__ import annotations

import contextlib

import psutil
import pytest

from memforensics.errors import MemforensicsError
from memforensics.sources.proc.procmaps import read_maps
from tests.support.postgres import (
    PG_DATABASE,
    PgbenchRun,
    PostgresCluster,
    pgbench_failed_transactions,
    pgbench_processed_transactions,
)
from tests.support.private_pages import (
    heap_shared_bytes,
    kernel_copies_on_pin,
    private_bytes,
    vm_readv,
)
from tests.support.service_figures import Figure, json_measured_share, record
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

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICE = "PostgreSQL backend"
ROUNDS = 3  # inspections of each backend
# Below this the release is a few pages of a backend's private heap: page-sized noise from
# the shared buffers it touches meanwhile outweighs it, so there is nothing to compare.
MIN_COMPARABLE_RELEASE_BYTES = MIB


def _backends(cluster: PostgresCluster, run: PgbenchRun) -> list[int]:
    assert run.running, "pgbench ended before the tests were done; raise PGBENCH_SECONDS"
    return cluster.backend_pids(wanted=4)


@pytest.mark.timeout(240)
def test_backends_inspected_under_pgbench(
    pg_cluster: PostgresCluster, pgbench_run: PgbenchRun
) -> None:
    """Every backend, three times (one report per backend through the CLI, the first through
    gdb): every inspection succeeds, every report read from memory measured >= 90 % of the
    free bytes, and each backend, stopped, has the document the kernel agrees with."""
    pids = _backends(pg_cluster, pgbench_run)
    shares = []
    for round_index in range(ROUNDS):
        for pid in pids:
            assert pgbench_run.running, "pgbench ended before the inspections were done"
            if round_index == ROUNDS - 1:
                shares.append(json_measured_share(cli_inspect(SERVICE, pid)))
                assert_heaps_agree_with_kernel(SERVICE, pid)
            else:
                through_gdb = round_index == 0 and pid == pids[0]
                inspection = inspect(SERVICE, pid, method="gdb" if through_gdb else "auto")
                assert inspection.facts.allocator.kind == "glibc"
                if not through_gdb:  # gdb's dump and walk are two moments: recorded only
                    shares.append(share_of(inspection))
    # "One truth per figure": the default read's dump and walk are one moment, so every
    # backend report measures >= 90 % of its free bytes (the bar was 80 %).
    assert_most_measured(shares, SERVICE, at_least=1.0)


@pytest.mark.timeout(240)
def test_backends_trimmed_under_pgbench(
    pg_cluster: PostgresCluster, pgbench_run: PgbenchRun
) -> None:
    """Two backends trimmed through the library, one through the CLI, while pgbench runs.
    Where a backend's free memory was steady and the release big enough to measure (and no
    more than the free bytes read: else the backend freed memory of its own meanwhile), the
    forecast must be within 25 % of it."""
    pids = _backends(pg_cluster, pgbench_run)
    for pid in pids[:2]:
        try:
            trim = trim_at_steady_state(SERVICE, pid)
        except MemforensicsError as error:
            # The server's word on what ended a backend (a crash elsewhere makes the
            # postmaster end every backend, this one too).
            pytest.fail(f"trim of backend {pid}: {error}; server log: {pg_cluster.bad_log_lines()}")
        assert trim.result.trimmed, trim.result.skipped_detail
        released = trim.result.released_bytes or 0
        if trim.steady and trim.released_within_free and released >= MIN_COMPARABLE_RELEASE_BYTES:
            assert_forecast_close(trim, SERVICE)
    document = cli_json("trim", pids[2])
    assert document["schema"] == "memforensics/trim/1"
    assert document["pid"] == pids[2] and document["trimmed"] is True
    assert pgbench_run.running, "pgbench ended before the trims were done"


@pytest.mark.timeout(180)
def test_pgbench_had_no_failures_and_the_log_is_clean(
    pg_cluster: PostgresCluster, pgbench_run: PgbenchRun
) -> None:
    """After the inspections and trims: pgbench finished with 0 failed transactions, no
    client aborted, and the server never logged a crash, a panic or a fatal error."""
    output = pgbench_run.finish(timeout_seconds=pgbench_run.duration_seconds + 60)
    failed = pgbench_failed_transactions(output)
    processed = pgbench_processed_transactions(output)
    record(
        Figure(
            service=SERVICE,
            kind="load",
            pid=pgbench_run.proc.pid,
            note=f"pgbench: {processed} transactions processed, {failed} failed",
        )
    )
    assert pgbench_run.proc.returncode == 0, output[-2000:]
    assert "aborted" not in output, output[-2000:]
    assert failed == 0, output[-2000:]
    assert processed is not None and processed > 0, output[-2000:]
    assert pg_cluster.bad_log_lines() == []


# What an idle auxiliary process (or the postmaster) may write of the heap pages they share
# while it is read (a wake-up or two: a few pages); a read that copied shared pages would
# unshare most of them, as the vm_readv oracle below shows.
AUX_SLACK_BYTES = 64 << 10


@pytest.mark.timeout(120)
def test_forked_processes_keep_the_heap_they_share_with_the_postmaster(
    pg_cluster: PostgresCluster,
) -> None:
    """The postmaster's children share its heap copy-on-write, as forked servers do. The
    auxiliary ones holding shared heap pages (the background writer and the WAL writer here),
    read by the default `inspect` and by `census` (which copies every heap page) once pgbench
    is done: the heap bytes they share, as the kernel counts them, are what they were but for
    a few pages either process may write meanwhile (no shared page was copied for the read).
    One process_vm_readv of the same shared heap pages does grow their private bytes: the
    oracle sees a copy."""
    assert pg_cluster.postmaster is not None
    sharing = []
    for child in psutil.Process(pg_cluster.postmaster.pid).children():
        with contextlib.suppress(psutil.NoSuchProcess):
            title = " ".join(child.cmdline())
            if PG_DATABASE not in title and heap_shared_bytes(child.pid) >= 64 << 10:
                sharing.append(child.pid)
    assert sharing, "no child of the postmaster shares its heap"
    for pid in sharing:
        for command in ("inspect", "census"):
            # The heap's shared bytes, not the process's private ones: those also grow with
            # the process's own stack and buffers, which say nothing about the read.
            before = heap_shared_bytes(pid)
            document = cli_json(command, pid)
            after = heap_shared_bytes(pid)
            if command == "inspect":
                assert document["read_only"]["source"] == "live", document["read_only"]
            assert before - after <= max(AUX_SLACK_BYTES, before // 4), (
                command,
                pid,
                before,
                after,
            )
    pid = sharing[0]
    heap = next(m for m in read_maps(pid) if m.path == "[heap]")
    shared = heap_shared_bytes(pid)
    before = private_bytes(pid)
    length = heap.end_address - heap.start_address
    assert vm_readv(pid, heap.start_address, length) == length
    if kernel_copies_on_pin():
        assert private_bytes(pid) - before >= shared // 2, (shared, before)
