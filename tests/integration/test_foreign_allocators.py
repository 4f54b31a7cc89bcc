"""`inspect`, `trim`, `watch` and `collect` on processes served by jemalloc, tcmalloc and
mimalloc, as a user runs them, against each allocator's own word: the target's own call of
its allocator's statistics (tests/targets/foreign_alloc.c), Redis's INFO memory, and the
kernel's RSS before and after a trim.

The targets run on Debian's libjemalloc2, libtcmalloc-minimal4 and libmimalloc2.0
(LD_PRELOAD), and Debian's Redis, which links the system jemalloc; the tests session installs
them (noxfile.py). A test skips, saying so, only where its library or Redis is missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.foreign_targets import (
    ALLOCATOR_LIBRARIES,
    ForeignTarget,
    allocator_skip_reason,
    foreign_target,
)
from tests.support.redis import redis_server, redis_skip_reason
from tests.support.services import python_service
from tests.support.targets import live_skip_reason, proc_status

_SKIP = live_skip_reason()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_SKIP is not None, reason=_SKIP or ""),
]

MEMFORENSICS = [sys.executable, "-m", "memforensics"]
CLI_TIMEOUT_SECONDS = 120
MIB = 1 << 20
# 2 threads x 48 blocks of 1 MiB, 3 of 4 freed: whole free pages that jemalloc keeps dirty
# and tcmalloc keeps in its page heap (1 MiB is above both allocators' small classes).
LARGE = {"blocks": 48, "block_bytes": MIB, "keep_every": 4, "threads": 2}
# 4 threads x 20,000 blocks of 200 bytes, 2 of 3 freed: room in slabs beside live objects.
SMALL = {"blocks": 20_000, "block_bytes": 200, "keep_every": 3, "threads": 4}


def _skip_unless(allocator: str) -> None:
    reason = allocator_skip_reason(allocator)
    if reason is not None:
        pytest.skip(reason)


def _cli(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [*MEMFORENSICS, *args],
        capture_output=True,
        text=True,
        timeout=CLI_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    document: dict[str, Any] = json.loads(done.stdout)
    return document


def _untouched(pid: int) -> None:
    """Running (or sleeping), traced by nobody: what a call into it leaves behind."""
    status = proc_status(pid)
    assert status["TracerPid"] == "0", status["TracerPid"]
    assert status["State"][0] in "RS", status["State"]


def _own_in_use(allocator: str, figures: dict[str, Any]) -> int:
    key = "allocated" if allocator == "jemalloc" else "generic.current_allocated_bytes"
    return int(figures[key])


def _own_free_pages(allocator: str, figures: dict[str, Any]) -> int:
    """What the allocator itself counts as whole free pages it keeps (a purge's due)."""
    if allocator == "jemalloc":
        return (int(figures["pdirty"]) + int(figures["pmuzzy"])) * int(figures["page"])
    return int(figures["tcmalloc.pageheap_free_bytes"])


def _assert_close(ours: int, theirs: int, share: float, what: str) -> None:
    assert abs(ours - theirs) <= share * theirs, (
        f"{what}: memforensics {ours:,} B, the allocator's own {theirs:,} B "
        f"({100 * abs(ours - theirs) / max(theirs, 1):.1f} % apart)"
    )


def _inspect_and_compare(target: ForeignTarget, allocator: str) -> dict[str, Any]:
    before = target.figures()
    document = _cli("inspect", "--json", str(target.pid))
    after = target.figures()
    assert before["allocator"] == allocator and after["allocator"] == allocator
    named = document["allocator"]
    assert named["name"] == allocator
    assert named["library"].startswith(str(ALLOCATOR_LIBRARIES[allocator].library.parent))
    assert document["process"]["allocator"] == allocator
    # The one vocabulary: the heap document's totals are the allocator's figures.
    assert document["totals"]["in_use_bytes"] == named["in_use_bytes"]
    assert document["totals"]["free_bytes"] == named["free_bytes"]
    assert sum(a["in_use_bytes"] for a in document["arenas"]) == named["in_use_bytes"]
    # The allocator's own word, before and after (an idle target: both agree).
    assert _own_in_use(allocator, before) == _own_in_use(allocator, after)
    _assert_close(named["in_use_bytes"], _own_in_use(allocator, after), 0.03, "in use")
    _untouched(target.pid)
    assert target.kept_bytes() > 0  # it answers, and still holds what it held
    return document


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
@pytest.mark.parametrize("shape", ["small", "large"])
def test_inspect_agrees_with_the_allocators_own_statistics(allocator: str, shape: str) -> None:
    _skip_unless(allocator)
    with foreign_target(allocator, **(SMALL if shape == "small" else LARGE)) as target:
        document = _inspect_and_compare(target, allocator)
        named = document["allocator"]
        own = target.figures()
        _assert_close(
            named["releasable_bytes"], _own_free_pages(allocator, own), 0.03, "releasable"
        )
        if allocator == "jemalloc":
            frag = int(own["active"]) - int(own["allocated"])
            assert named["fragmentation_bytes"] == frag
            assert named["figures"]["stats.allocated"] == int(own["allocated"])
        waterfall = {line["key"]: line["bytes"] for line in document["waterfall"]["lines"]}
        assert waterfall["arena_in_use"] == named["in_use_bytes"]
        # A second inspect still agrees: the calls left the allocator as it was.
        _inspect_and_compare(target, allocator)


def test_jemalloc_of_hundreds_of_arenas_is_read_in_short_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A jemalloc with 256 arenas, 200 of them in use (one per thread), read in process with
    the hold and the calls watched: no hold makes more than CALLS_PER_HOLD calls, the report's
    hold figures are those holds', and the figures are still jemalloc's own: every arena the
    target itself can read, in use and the free pages as it counts them."""
    _skip_unless("jemalloc")
    from click.testing import CliRunner

    from memforensics.cli import cli
    from memforensics.sources.allocators import moment

    calls_per_hold: list[int] = []
    stops: list[float] = []
    real_call_reading, real_hold = moment.call_reading, moment.ThreadHold

    def call_reading(hold: Any, caller: int, calls: Any, **kwargs: Any) -> Any:
        calls_per_hold.append(len(calls))
        return real_call_reading(hold, caller, calls, **kwargs)

    class WatchedHold(real_hold):  # type: ignore[misc, valid-type]
        def __exit__(self, *exc: Any) -> None:
            super().__exit__(*exc)
            stops.append(self.stop_seconds)

    monkeypatch.setattr(moment, "call_reading", call_reading)
    monkeypatch.setattr(moment, "ThreadHold", WatchedHold)
    shape = {"blocks": 64, "block_bytes": 4096, "keep_every": 4, "threads": 200}
    with foreign_target("jemalloc", **shape, env={"MALLOC_CONF": "narenas:256"}) as target:
        result = CliRunner().invoke(cli, ["inspect", "--json", str(target.pid)])
        assert result.exit_code == 0, result.output
        own = target.figures()
        _untouched(target.pid)
    named = json.loads(result.stdout)["allocator"]
    assert own["narenas"] >= 256 and own["arenas_read"] >= 200, own  # (+1: its huge arena)
    assert len(json.loads(result.stdout)["arenas"]) == own["arenas_read"]
    _assert_close(named["in_use_bytes"], int(own["allocated"]), 0.03, "in use")
    assert named["releasable_bytes"] == (int(own["pdirty"]) + int(own["pmuzzy"])) * int(own["page"])
    # 12 process-wide calls, one "initialized?" per arena and 5 per arena in use: many holds.
    assert max(calls_per_hold) <= moment.CALLS_PER_HOLD
    assert sum(calls_per_hold) >= 256 + 5 * 200
    assert named["holds"] == len(stops) == len(calls_per_hold)
    assert named["longest_stop_seconds"] == round(max(stops), 6)
    assert named["stop_seconds"] == pytest.approx(sum(stops), abs=1e-5)


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
def test_trim_gives_back_what_the_allocator_keeps_as_free_pages(allocator: str) -> None:
    _skip_unless(allocator)
    with foreign_target(allocator, **LARGE) as target:
        own_free = _own_free_pages(allocator, target.figures())
        assert own_free > 16 * MIB, f"the target keeps only {own_free:,} B of free pages"
        document = _cli("trim", "--json", str(target.pid))
        (result,) = document["results"]
        assert result["trim_called"] and result["purge"].startswith(allocator)
        released = int(result["anon_released_bytes"])
        # The bar: at least half of what the allocator counted, forecast within 25 %.
        assert released >= own_free / 2, f"released {released:,} of {own_free:,} B"
        assert abs(result["forecast_bytes"] - released) <= 0.25 * released, result
        assert _own_free_pages(allocator, target.figures()) < own_free / 4  # purged
        _untouched(target.pid)
        assert target.kept_bytes() > 0


def test_mimalloc_is_inspected_named_and_trimmed() -> None:
    _skip_unless("mimalloc")
    with foreign_target("mimalloc", **LARGE) as target:
        own = target.figures()
        document = _cli("inspect", "--json", str(target.pid))
        named = document["allocator"]
        assert named["name"] == "mimalloc" and named["in_use_bytes"] is None
        figures = named["figures"]
        # mi_process_info's 7th and 8th arguments travel on the stack: they came back too.
        assert {"peak_commit", "page_faults", "current_commit"} <= set(figures)
        _assert_close(int(figures["current_commit"]), int(own["current_commit"]), 0.03, "committed")
        assert figures["peak_commit"] >= figures["current_commit"]
        _untouched(target.pid)
        trimmed = _cli("trim", "--json", str(target.pid))
        (result,) = trimmed["results"]
        assert result["purge"] == "mimalloc: mi_collect(true)" and result["trim_called"]
        _untouched(target.pid)
        assert target.kept_bytes() > 0


@pytest.mark.parametrize("flag", ["--read-only", "--gdb"])
def test_paths_that_cannot_read_an_allocator_say_so(flag: str) -> None:
    _skip_unless("jemalloc")
    with foreign_target("jemalloc", **SMALL) as target:
        args = [flag, "gdb"] if flag == "--gdb" else [flag]
        done = subprocess.run(
            [*MEMFORENSICS, "inspect", *args, str(target.pid)],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_SECONDS,
            check=False,
        )
        assert done.returncode == 3, done.stderr
        assert "jemalloc" in done.stderr and "hint:" in done.stderr
        assert "Traceback" not in done.stderr
        _untouched(target.pid)


def test_killed_at_any_moment_of_the_calls_the_target_lives() -> None:
    """memforensics' whole process group SIGKILLed at moments of an inspect's statistics
    calls: the target is left untraced and running each time, and answers."""
    _skip_unless("jemalloc")
    with foreign_target("jemalloc", **SMALL) as target:
        for moment in (0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5):
            proc = subprocess.Popen(
                [*MEMFORENSICS, "inspect", "--json", str(target.pid)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            time.sleep(moment)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
            deadline = time.monotonic() + 5
            while proc_status(target.pid)["TracerPid"] != "0" and time.monotonic() < deadline:
                time.sleep(0.01)
            _untouched(target.pid)
            assert target.figures()["allocator"] == "jemalloc"  # it answers
        _inspect_and_compare(target, "jemalloc")


@pytest.mark.slow
def test_redis_inspected_while_redis_benchmark_runs(tmp_path: Path) -> None:
    """Debian's Redis on the system jemalloc: loaded, mostly deleted, inspected five times
    during redis-benchmark (which sees no error) and trimmed; in use within 10 % of INFO
    memory's allocator_allocated (Redis samples jemalloc in its cron)."""
    reason = redis_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with redis_server() as redis:
        redis.load(200_000, 400, "k")
        redis.delete("k", 4)  # a quarter gone: free room in slabs, dirty pages
        info = redis.settled_info_memory()
        assert info["mem_allocator"].startswith("jemalloc")  # type: ignore[union-attr]
        document = _cli("inspect", "--json", str(redis.pid))
        named = document["allocator"]
        assert named["name"] == "jemalloc"
        _assert_close(named["in_use_bytes"], int(info["allocator_allocated"]), 0.10, "Redis in use")
        _assert_close(
            int(named["figures"]["stats.resident"]),
            int(info["allocator_resident"]),
            0.10,
            "Redis resident",
        )
        run = redis.start_benchmark(200_000, clients=4)
        pauses = []
        for _ in range(5):
            during = _cli("inspect", "--json", str(redis.pid))
            assert during["allocator"]["name"] == "jemalloc"
            pauses.append(during["pause_seconds"])
        result = run.finish()
        assert result.ok, result.errors[:3]
        assert redis.command("PING") == "PONG"
        trimmed = _cli("trim", "--json", str(redis.pid))
        (trim,) = trimmed["results"]
        assert trim["trim_called"] and trim["purge"].startswith("jemalloc")
        assert redis.command("PING") == "PONG"
        _untouched(redis.pid)
        print(f"Redis: inspect pauses {[round(p * 1000, 1) for p in pauses]} ms")


@pytest.mark.slow
def test_python_service_on_jemalloc_is_watched_and_collected(tmp_path: Path) -> None:
    """The Python service with jemalloc preloaded: `watch` records its heap and `report`
    gives a verdict, `collect` writes its series with allocator="jemalloc"."""
    _skip_unless("jemalloc")
    library = str(ALLOCATOR_LIBRARIES["jemalloc"].library)
    with python_service("500", preload=library) as service:
        assert service.ask("ping").startswith("pong")
        record = tmp_path / "watch.jsonl"
        subprocess.run(
            [
                *MEMFORENSICS,
                "watch",
                str(service.pid),
                "--interval",
                "0.3s",
                "--count",
                "4",
                "--record",
                str(record),
            ],
            capture_output=True,
            text=True,
            timeout=CLI_TIMEOUT_SECONDS,
            check=True,
        )
        report = _cli("report", str(record), "--json")
        (process,) = report["processes"]
        assert process["heap_samples"] == 4
        assert process["trend"]["verdict"]
        textfile = tmp_path / "textfile"
        textfile.mkdir()
        run = _cli(
            "collect", "--no-oom", "--textfile-dir", str(textfile), "--json", str(service.pid)
        )
        (target,) = run["targets"]
        assert target["up"] and target["allocator"] == "jemalloc", target
        prom = (textfile / "memforensics.prom").read_text()
        labels = f'allocator="jemalloc",container_id="",pid="{service.pid}"'
        assert labels in prom
        # What jemalloc's purge would return now, from its own count.
        assert f"memforensics_heap_trimmable_bytes{{{labels}" in prom
        assert service.ask("ping").startswith("pong")
        _untouched(service.pid)
