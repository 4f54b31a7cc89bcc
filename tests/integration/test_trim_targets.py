"""`trim` against real processes with real gdb: forecast accuracy, dry run, repeated trims."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from memforensics.entry.trim import TrimSettings, trim_process
from memforensics.sources.gdb.gdb import GdbSession
from memforensics.sources.malloc_info.malloc_xml import parse_dump
from memforensics.sources.proc import memory_figures, process_facts
from tests.support.schema import missing_keys
from tests.support.targets import c_target, needs_live

pytestmark = [
    pytest.mark.integration,
    needs_live,
]

MIB = 1024 * 1024
# The promise: the forecast is within 25% of what RSS measurably loses.
FORECAST_TOLERANCE = 0.25
# 4 threads (4 arenas + main) x 6000 blocks of 1 KiB; every 8th block kept: ~24 MiB of heap,
# free runs of 7 blocks (~7 KiB), so a trim releases some whole pages of each run, not all.
FRAGMENTED_ARGS = ("4", "6000", "1024", "8")


@pytest.mark.parametrize("direct", [True, False], ids=["no-gdb", "gdb"])
def test_forecast_matches_measured_release_on_multi_arena_fragmented_target(
    direct: bool,
) -> None:
    """The same forecast and release by the default path (no gdb: malloc_trim called
    through a self-restoring signal frame) and by gdb's (which also sees its return)."""
    with c_target("trim_fragmented", *FRAGMENTED_ARGS) as target:
        result = trim_process(target.pid, TrimSettings(direct=direct))
        assert result.arenas >= 5  # main + one per thread
        assert result.trimmed
        assert result.trim_returned == (None if direct else 1)
        assert result.trim_called is direct
        released = result.released_bytes
        assert released is not None and released > 4 * MIB
        assert abs(released - result.forecast_bytes) <= FORECAST_TOLERANCE * released, (
            f"forecast {result.forecast_bytes} vs measured {released}"
        )
        # Pages released by the first trim are still "free" to malloc_info but no longer
        # resident: a second trim must forecast about nothing and release about nothing.
        again = trim_process(target.pid, TrimSettings())
        assert again.free_bytes >= result.free_bytes * 0.9
        assert again.forecast_bytes < 0.05 * result.forecast_bytes
        assert again.released_bytes is not None and again.released_bytes < 1 * MIB
        assert target.alive() and target.state() in ("S", "R")


def test_dry_run_changes_nothing() -> None:
    with c_target("trim_fragmented", *FRAGMENTED_ARGS) as target:
        before = memory_figures.read_memory(target.pid)
        with GdbSession(target.pid) as session:
            dump_before = parse_dump(session.malloc_info())
        runner = CliRunner()
        outcome = runner.invoke(cli, ["trim", "--dry-run", "--json", str(target.pid)])
        assert outcome.exit_code == 0, outcome.output + outcome.stderr
        document = json.loads(outcome.stdout)
        assert missing_keys(document, "memforensics/trim/1") == []
        assert document["dry_run"] is True and document["skipped"] == "dry-run"
        assert document["trim_returned"] is None and document["rss_after_bytes"] is None
        assert document["forecast_bytes"] > 4 * MIB
        after = memory_figures.read_memory(target.pid)
        with GdbSession(target.pid) as session:
            dump_after = parse_dump(session.malloc_info())
        # Calling malloc_info allocates its stream buffer in the target: allow a few pages.
        assert before.rss_bytes is not None and after.rss_bytes is not None
        assert abs(after.rss_bytes - before.rss_bytes) <= 256 * 1024
        assert dump_after.system_bytes == dump_before.system_bytes
        assert abs(dump_after.free_bytes - dump_before.free_bytes) <= 64 * 1024
        assert len(dump_after.arenas) == len(dump_before.arenas)
        # And the memory is still there to be released: a real trim now finds it.
        real = trim_process(target.pid, TrimSettings())
        assert real.released_bytes is not None and real.released_bytes > 4 * MIB


def test_busy_single_threaded_target_survives_repeated_trims() -> None:
    # 2000 live blocks up to 16 KiB, replaced as fast as the CPU allows: gdb often stops it
    # inside malloc/free, where calling malloc_trim would corrupt the unlocked heap.
    with c_target("trim_busy", "2000", "16384") as target:
        for attempt in range(5):
            try:
                result = trim_process(target.pid, TrimSettings(timeout_seconds=10))
            except Exception:
                # Say how the target went (a signal from us, a heap it found corrupt, or its
                # own lifetime), not only that it is gone.
                time.sleep(0.2)
                if target.proc.poll() is not None:
                    assert target.proc.stdout is not None
                    pytest.fail(
                        f"trim {attempt}: the target ended with {target.proc.returncode}: "
                        f"{target.proc.stdout.read().decode(errors='replace')[-500:]}"
                    )
                raise
            assert result.trimmed
            assert target.alive()
        os.kill(target.pid, signal.SIGTERM)  # the target verifies every live block, then exits
        assert target.proc.wait(timeout=20) == 0
        assert target.proc.stdout is not None
        assert b"verified 2000 blocks" in target.proc.stdout.read()


def test_min_free_skips_when_too_little_is_resident() -> None:
    with c_target("trim_fragmented", *FRAGMENTED_ARGS) as target:
        result = trim_process(target.pid, TrimSettings(min_free_bytes=10 * 1024 * MIB))
        assert result.skipped == "below-min-free" and not result.trimmed
        assert result.rss_after_bytes is None


def test_periodic_rounds_then_ctrl_c_stops_cleanly() -> None:
    with c_target("trim_fragmented", *FRAGMENTED_ARGS) as target:
        runner = CliRunner()
        outcome = runner.invoke(
            cli, ["trim", str(target.pid), "--interval", "200ms", "--count", "3", "--json"]
        )
        assert outcome.exit_code == 0, outcome.stderr
        document = json.loads(outcome.stdout)
        rounds = document["rounds"]
        assert [r["round"] for r in rounds] == [1, 2, 3]
        first, *later = (r["results"][0] for r in rounds)
        assert first["trimmed"] and first["released_bytes"] > 4 * MIB
        # After the first round little is resident-free: later rounds release ~nothing.
        assert all(r["forecast_bytes"] < 1 * MIB for r in later)
        assert document["summary"]["trims"] == 3

        # Ctrl-C in a real terminal-like run: rows stream, the first SIGINT ends it cleanly.
        proc = subprocess.Popen(
            [sys.executable, "-m", "memforensics", "trim", str(target.pid), "--interval", "300ms"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            header = proc.stdout.readline()
            first_row = proc.stdout.readline()
            assert "released" in header and str(target.pid) in first_row
            proc.send_signal(signal.SIGINT)
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, err
        assert "stopped by Ctrl-C" in err
        time.sleep(0.1)
        assert target.alive() and target.state() in ("S", "R")
        assert process_facts.read_process(target.pid).tracer_pid == 0


def test_name_match_that_exits_mid_trim_is_skipped_and_the_others_trimmed() -> None:
    """Issue 10 item 5 for trim: a --name match that exits mid-run is a note, not a failure."""
    blocks = str(3000 + os.getpid() % 1000)
    with (
        c_target("trim_fragmented", "2", blocks, "1024", "8") as first,
        c_target("trim_fragmented", "2", blocks, "1024", "8") as second,
    ):

        def kill_first_once_attached() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                if process_facts.read_process(first.pid).tracer_pid:
                    break
                time.sleep(0.0005)
            os.kill(first.pid, signal.SIGKILL)
            first.proc.wait(timeout=10)

        killer = threading.Thread(target=kill_first_once_attached, daemon=True)
        killer.start()
        binary = os.path.basename(str(first.proc.args[0]))  # type: ignore[index]
        outcome = subprocess.run(  # noqa: PLW1510
            [
                sys.executable,
                "-m",
                "memforensics",
                "trim",
                "--json",
                "--name",
                f"{binary} 2 {blocks} ",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        killer.join(timeout=30)
        assert outcome.returncode == 0, outcome.stderr
        assert f"note: PID {first.pid} (matched by --name) exited; skipped" in outcome.stderr
        document = json.loads(outcome.stdout)
        results = document.get("results", [document])
        assert [r["pid"] for r in results] == [second.pid]
        assert second.alive()
