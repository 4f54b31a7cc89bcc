"""The runtime told from the process itself, on a live Go program and a live Node.js program.

The Go program is Debian's prometheus-node-exporter (a cgo build: glibc's malloc serves its C
side, Go's runtime its own heap), on a loopback port; the Node.js program is `node` keeping
a growing array of Buffers. Each is watched with the real CLI, `memforensics watch PID
--interval 1s --count 2 --record F`; every heap sample in F and `memforensics report F
--json` must name the runtime ("go", "node") though nothing on the command line says so:
sources/proc/runtime.py tells Go from the executable's .go.buildinfo section and Node.js
from the executable's name. Both processes are killed in ``finally``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from memforensics.cli import cli
from tests.support.fleet import NODE_EXPORTER, free_port, http_get
from tests.support.targets import live_skip_reason

pytestmark = [pytest.mark.integration]

_NODE_PROGRAM = (
    "const kept = []; setInterval(() => kept.push(Buffer.alloc(4096)), 20); console.log('ready')"
)


@contextlib.contextmanager
def _started(argv: list[str], ready: str) -> Iterator[subprocess.Popen[bytes]]:
    """``argv`` started, until ``ready`` (a URL to answer, or a line to print) says it runs;
    killed in ``finally``."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    try:
        if ready.startswith("http://"):
            deadline = time.monotonic() + 15
            while True:
                assert proc.poll() is None, f"{argv[0]} exited with {proc.returncode}"
                try:
                    http_get(ready, timeout_seconds=1.0)
                    break
                except OSError:
                    assert time.monotonic() < deadline, f"{argv[0]} did not serve {ready}"
                    time.sleep(0.1)
        else:
            assert proc.stdout is not None
            assert proc.stdout.readline().decode().strip() == ready
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def _watched_runtime(pid: int, record: Path) -> tuple[set[str | None], dict[str, object], str]:
    """(the runtime of each heap sample, report --json, report's text) of a short watch."""
    watched = CliRunner().invoke(
        cli, ["watch", str(pid), "--interval", "1s", "--count", "2", "--record", str(record)]
    )
    assert watched.exit_code == 0, watched.output
    samples = [json.loads(line) for line in record.read_text().splitlines()]
    heap = [sample for sample in samples if sample["kind"] == "heap"]
    assert len(heap) == 2, samples
    reported = CliRunner().invoke(cli, ["report", str(record), "--json"])
    assert reported.exit_code == 0, reported.output
    text = CliRunner().invoke(cli, ["report", str(record)], env={"COLUMNS": "100"})
    assert text.exit_code == 0, text.output
    return {sample.get("runtime") for sample in heap}, json.loads(reported.stdout), text.stdout


@pytest.mark.timeout(120)
def test_a_go_program_is_named_go(tmp_path: Path) -> None:
    skip = live_skip_reason() or (
        None if shutil.which(NODE_EXPORTER) else f"{NODE_EXPORTER} is not installed"
    )
    if skip:
        pytest.skip(skip)
    port = free_port()
    argv = [
        NODE_EXPORTER,
        f"--web.listen-address=127.0.0.1:{port}",
        "--collector.disable-defaults",
    ]
    with _started(argv, f"http://127.0.0.1:{port}/metrics") as proc:
        runtimes, document, text = _watched_runtime(proc.pid, tmp_path / "go.jsonl")
        assert proc.poll() is None, "node_exporter must be left running"
        http_get(f"http://127.0.0.1:{port}/metrics")  # and still serving
    assert runtimes == {"go"}
    assert document["runtime"] == "go"
    assert "runtime: Go" in document["trend"]["evidence"]  # type: ignore[index]
    assert "runtime: Go" in text


@pytest.mark.timeout(120)
def test_a_node_program_is_named_node(tmp_path: Path) -> None:
    node = shutil.which("node") or shutil.which("nodejs")
    skip = live_skip_reason() or (None if node else "Node.js is not installed (Debian: nodejs)")
    if skip or node is None:
        pytest.skip(skip or "Node.js is not installed")
    with _started([node, "-e", _NODE_PROGRAM], "ready") as proc:
        runtimes, document, text = _watched_runtime(proc.pid, tmp_path / "node.jsonl")
        assert proc.poll() is None, "node must be left running"
    assert runtimes == {"node"}
    assert document["runtime"] == "node"
    assert "runtime: Node.js" in document["trend"]["evidence"]  # type: ignore[index]
    assert "runtime: Node.js" in text
