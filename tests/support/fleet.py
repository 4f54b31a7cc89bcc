"""Real Prometheus components for the fleet tests: node_exporter and Prometheus on loopback
ports, started with a readiness poll and always stopped in ``finally``."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

NODE_EXPORTER = "prometheus-node-exporter"
PROMETHEUS = "prometheus"
PROMTOOL = "promtool"
START_TIMEOUT_SECONDS = 30.0


def missing_tool(*names: str) -> str | None:
    """Why a fleet test cannot run here (a Debian package missing), or None."""
    for name in names:
        if shutil.which(name) is None:
            return f"{name} is not installed (Debian packages prometheus, prometheus-node-exporter)"
    return None


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_get(url: str, timeout_seconds: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_seconds) as response:
        body: bytes = response.read()
        return body.decode()


def wait_for(url: str, proc: subprocess.Popen[bytes], what: str) -> None:
    """Poll ``url`` until it answers, the process dies, or the start deadline passes."""
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before serving {url}")
        with contextlib.suppress(OSError):
            http_get(url, timeout_seconds=1.0)
            return
        time.sleep(0.1)
    raise RuntimeError(f"{what} did not serve {url} within {START_TIMEOUT_SECONDS:.0f} s")


@contextlib.contextmanager
def serving(argv: Sequence[str], ready_url: str, what: str, log: Path) -> Iterator[None]:
    """Run a server, wait until ``ready_url`` answers, and terminate it in ``finally``."""
    with log.open("wb") as log_file:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT
        )
        try:
            wait_for(ready_url, proc, what)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


@contextlib.contextmanager
def node_exporter(textfile_dir: Path, port: int, log: Path) -> Iterator[str]:
    """node_exporter with only the textfile collector; yields its /metrics URL."""
    url = f"http://127.0.0.1:{port}/metrics"
    argv = [
        NODE_EXPORTER,
        f"--web.listen-address=127.0.0.1:{port}",
        "--collector.disable-defaults",
        "--collector.textfile",
        f"--collector.textfile.directory={textfile_dir}",
    ]
    with serving(argv, url, "node_exporter", log):
        yield url


def scrape(url: str) -> dict[str, Metric]:
    """Metric families served at ``url``, by name (counters without their _total)."""
    return {family.name: family for family in text_string_to_metric_families(http_get(url))}


def collect_cli(*args: str, timeout_seconds: float = 120.0) -> subprocess.CompletedProcess[str]:
    """Run the real `memforensics collect` in its own process (its own signal handling)."""
    return subprocess.run(
        [sys.executable, "-m", "memforensics", "collect", *args],
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
        check=False,
    )
