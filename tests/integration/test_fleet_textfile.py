"""collect end to end: real gdb on a real bloated target, the file checked by the real
promtool and served by a real node_exporter (textfile collector only) on loopback."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.fleet import (
    PROMTOOL,
    collect_cli,
    free_port,
    missing_tool,
    node_exporter,
    scrape,
)
from tests.support.targets import Target, c_target, compile_target, live_skip_reason, running

pytestmark = pytest.mark.integration

# 4 threads (4 arenas + main), each keeping every 8th of 2000 4-KiB blocks: ~28 MiB free.
FRAGMENTED_ARGS = ("4", "2000", "4096", "8")
MIB = 1024 * 1024


@pytest.fixture(scope="module", autouse=True)
def need_tools() -> None:
    reason = live_skip_reason() or missing_tool(PROMTOOL, "prometheus-node-exporter")
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def bloated() -> Iterator[Target]:
    with c_target("trim_fragmented", *FRAGMENTED_ARGS) as target:
        yield target


@pytest.fixture(scope="module")
def idle() -> Iterator[Target]:
    with c_target("proc_idle") as target:
        yield target


@pytest.fixture(scope="module")
def collected(
    tmp_path_factory: pytest.TempPathFactory, bloated: Target
) -> tuple[Path, dict[str, object]]:
    """One real collect run on the bloated target: the textfile directory and --json."""
    base = tmp_path_factory.mktemp("fleet")
    textfile = base / "textfile"
    textfile.mkdir()
    log = base / "kern.log"
    log.write_text("")
    done = collect_cli(
        str(bloated.pid),
        "--textfile-dir",
        str(textfile),
        "--state-dir",
        str(base / "state"),
        "--oom-file",
        str(log),
        "--json",
    )
    assert done.returncode == 0, done.stderr
    return textfile, json.loads(done.stdout)


def test_promtool_accepts_the_file(collected: tuple[Path, dict[str, object]]) -> None:
    textfile, _ = collected
    checked = subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=(textfile / "memforensics.prom").read_bytes(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == b"" and checked.stderr.strip() == b""


def test_nothing_but_the_prom_file_is_left(collected: tuple[Path, dict[str, object]]) -> None:
    textfile, _ = collected
    assert [p.name for p in textfile.iterdir()] == ["memforensics.prom"]
    assert (textfile / "memforensics.prom").stat().st_mode & 0o044 == 0o044


def test_node_exporter_serves_sane_values(
    collected: tuple[Path, dict[str, object]], bloated: Target, tmp_path: Path
) -> None:
    textfile, document = collected
    with node_exporter(textfile, free_port(), tmp_path / "node_exporter.log") as url:
        metrics = scrape(url)
    (error,) = metrics["node_textfile_scrape_error"].samples
    assert error.value == 0
    mtimes = {s.labels["file"] for s in metrics["node_textfile_mtime_seconds"].samples}
    assert any(name.endswith("memforensics.prom") for name in mtimes)

    def value(name: str) -> float:
        (sample,) = [s for s in metrics[name].samples if s.labels.get("pid") == str(bloated.pid)]
        assert sample.labels["process"].startswith("trim_fragmented")
        return sample.value

    free = value("memforensics_heap_free_bytes")
    in_use = value("memforensics_heap_in_use_bytes")
    system = value("memforensics_heap_system_bytes")
    free_resident = value("memforensics_heap_free_resident_bytes")
    rss = value("memforensics_process_resident_bytes")
    pause = value("memforensics_inspect_pause_seconds")
    assert value("memforensics_target_up") == 1
    assert value("memforensics_heap_arenas") >= 5  # main + one per thread
    # 4 threads each freed 7/8 of 2000 x 4 KiB blocks: about 27 MiB free, all touched.
    assert 20 * MIB < free < 40 * MIB
    assert free + in_use == system
    assert 20 * MIB < free_resident <= system
    assert free_resident < rss
    # Trimmable is a part of free resident (whole pages of the 28 KiB runs of freed blocks).
    trimmable = value("memforensics_heap_trimmable_bytes")
    assert 10 * MIB < trimmable <= free_resident
    assert 0.9 <= value("memforensics_heap_free_measured_ratio") <= 1.0
    assert 0 < pause < 10
    assert document["pause_used_seconds"] == pytest.approx(pause, abs=1e-5)
    (last,) = metrics["memforensics_collect_last_success_timestamp_seconds"].samples
    assert time.time() - 600 < last.value <= time.time()
    (duration,) = metrics["memforensics_collect_duration_seconds"].samples
    assert pause <= duration.value < 120
    (oom_up,) = metrics["memforensics_oom_scan_up"].samples
    assert oom_up.value == 1


def test_pause_budget_stops_inspecting(bloated: Target, idle: Target, tmp_path: Path) -> None:
    """A budget smaller than one pause: the first target is inspected, the next is skipped
    and reported down with reason pause_budget; the skipped one was never attached."""
    done = collect_cli(
        str(bloated.pid),
        str(idle.pid),
        "--textfile-dir",
        str(tmp_path),
        "--max-pause",
        "1ms",
        "--no-oom",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    first, second = document["targets"]
    assert first["up"] and first["pause_seconds"] > 0
    assert not second["up"] and second["reason"] == "pause_budget"
    assert document["pause_used_seconds"] == pytest.approx(first["pause_seconds"], abs=1e-5)
    prom = (tmp_path / "memforensics.prom").read_text()
    assert f'pid="{idle.pid}",pod_uid="",process="proc_idle' in prom
    assert 'reason="pause_budget"} 0.0' in prom
    assert idle.state() in ("S", "R")


def test_target_that_exits_is_down_and_others_still_collected(
    bloated: Target, tmp_path: Path
) -> None:
    with c_target("proc_idle") as short_lived:
        gone = short_lived.pid
    done = collect_cli(str(gone), str(bloated.pid), "--textfile-dir", str(tmp_path), "--no-oom")
    assert done.returncode == 0, done.stderr
    prom = (tmp_path / "memforensics.prom").read_text()
    assert f'pid="{gone}",pod_uid="",process="",reason="gone"}} 0.0' in prom
    assert f'pid="{bloated.pid}"' in prom and 'reason=""} 1.0' in prom


def test_timeout_is_down_charged_to_the_budget_and_left_running(
    bloated: Target, tmp_path: Path
) -> None:
    """A target with no safe point (stuck inside malloc_stats) times out: it is reported
    down with reason timeout, left running and untraced, and the whole attempt is charged
    to the pause budget, so the next target is skipped rather than the budget overspent."""
    binary = compile_target("stuck_in_malloc_stats")
    with running([str(binary)]) as stuck:
        done = collect_cli(
            str(stuck.pid),
            str(bloated.pid),
            "--textfile-dir",
            str(tmp_path),
            "--timeout",
            "1s",
            "--max-pause",
            "500ms",
            "--no-oom",
            "--json",
        )
        assert done.returncode == 0, done.stderr
        status = Path(f"/proc/{stuck.pid}/status").read_text()
        assert "\nTracerPid:\t0\n" in status
        assert stuck.settled_state() == "S"
    document = json.loads(done.stdout)
    first, second = document["targets"]
    assert (first["reason"], second["reason"]) == ("timeout", "pause_budget")
    assert document["pause_used_seconds"] >= 1.0
    assert document["pause_used_seconds"] == pytest.approx(first["elapsed_seconds"], abs=1e-5)
    prom = (tmp_path / "memforensics.prom").read_text()
    assert 'reason="timeout"} 0.0' in prom and 'reason="pause_budget"} 0.0' in prom
