"""--file on any readable stream, read once without seeking: pipes by path (/dev/fd/N, what
process substitution gives), FIFOs, /dev/stdin, /proc files, .gz/.xz/.bz2/.zst files and
compressed pipes. Each must find exactly what the plain file gives."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.analysis.oom_select import scan
from memforensics.errors import InputDataError
from memforensics.sources.logs.logfile import read_text_log

OOM = Path(__file__).resolve().parent.parent.parent / "fixtures" / "oom"
REPO = OOM.parent.parent
# Several incidents, a group kill and the summary/table joins: a fair sample.
SAMPLE = b"".join(
    (OOM / name).read_bytes()
    for name in (
        "cadvisor-4.8-docker.log",
        "lkml-5.0-rc-oom-group-kills-init.log",
        "harvester-kb-5.3-dmesg-T-kubevirt.log",
        "handmade-k8s-cgroup-paths.log",
    )
)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()


def summary(path: str) -> list[tuple[int | None, str | None, int | None, str | None]]:
    found = scan([(path, read_text_log(path))]).events
    return [(e.pid, e.process, e.anon_rss_bytes, e.cgroup) for e in found]


@pytest.fixture(scope="module")
def expected(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[int | None, ...]]:
    plain = tmp_path_factory.mktemp("plain") / "kern.log"
    plain.write_bytes(SAMPLE)
    result = summary(str(plain))
    assert len(result) == 23  # 2 Docker + 12 group members + 1 KubeVirt + 8 cgroup paths
    return result  # type: ignore[return-value]


def _feed(fd: int, data: bytes) -> threading.Thread:
    def write() -> None:
        with os.fdopen(fd, "wb") as out:
            out.write(data)

    thread = threading.Thread(target=write, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def pipe_path() -> Iterator[tuple[str, int]]:
    read_fd, write_fd = os.pipe()
    try:
        yield f"/dev/fd/{read_fd}", write_fd
    finally:
        os.close(read_fd)


def test_pipe_by_path_is_read_once_without_seeking(
    pipe_path: tuple[str, int], expected: list[tuple[int | None, ...]]
) -> None:
    path, write_fd = pipe_path
    writer = _feed(write_fd, SAMPLE)
    assert summary(path) == expected
    writer.join(timeout=10)


def test_fifo(tmp_path: Path, expected: list[tuple[int | None, ...]]) -> None:
    fifo = tmp_path / "kmsg.fifo"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "wb") as out:  # blocks until the reader opens it
            out.write(SAMPLE)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert summary(str(fifo)) == expected
    writer.join(timeout=10)


def _zstd(data: bytes) -> bytes:
    if shutil.which("zstd") is None:
        pytest.skip("the zstd program is not installed (the nox tests session installs it)")
    return subprocess.run(
        ["zstd", "-q", "-c"], input=data, capture_output=True, check=True, timeout=60
    ).stdout


@pytest.mark.parametrize("kind", ["gz", "xz", "bz2", "zst"])
def test_compressed_files(
    kind: str, tmp_path: Path, expected: list[tuple[int | None, ...]]
) -> None:
    compress = {
        "gz": gzip.compress,
        "xz": lzma.compress,
        "bz2": bz2.compress,
        "zst": _zstd,
    }[kind]
    path = tmp_path / f"kern.log.2.{kind}"
    path.write_bytes(compress(SAMPLE))
    assert summary(str(path)) == expected


def test_compressed_pipe(
    pipe_path: tuple[str, int], expected: list[tuple[int | None, ...]]
) -> None:
    """`--file <(ssh node cat kern.log.3.zst)`: compressed and not seekable."""
    path, write_fd = pipe_path
    writer = _feed(write_fd, _zstd(SAMPLE))
    assert summary(path) == expected
    writer.join(timeout=10)


def test_corrupt_zstd_is_input_error(tmp_path: Path) -> None:
    data = _zstd(SAMPLE)
    path = tmp_path / "kern.log.zst"
    path.write_bytes(data[: len(data) // 2] + b"\x00" * 64 + data[len(data) // 2 :])
    with pytest.raises(InputDataError, match="zstd"):
        summary(str(path))


def test_proc_file_of_size_zero_is_read() -> None:
    """/proc files report size 0; they used to be taken for empty files and skipped."""
    info = os.stat("/proc/self/mountinfo")
    assert info.st_size == 0
    records = list(read_text_log("/proc/self/mountinfo"))
    assert records == []  # no OOM text there, and no error: the stream was read to its end


def _cli(shell: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TZ": "UTC", "PYTHONPATH": str(REPO)}
    return subprocess.run(
        ["bash", "-c", shell],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
        **kwargs,  # type: ignore[arg-type]
    )


def test_cli_process_substitution_and_dev_stdin(tmp_path: Path) -> None:
    """The issue's `--file <(dmesg)` and `--file /dev/stdin` (exit 5 "internal error" before)."""
    log = tmp_path / "dmesg.txt"
    log.write_bytes(SAMPLE)
    python = sys.executable
    substituted = _cli(f"{python} -m memforensics oom --json --file <(cat {log})")
    assert substituted.returncode == 0, substituted.stderr
    assert '"kills": 23' in substituted.stdout
    stdin = _cli(f"cat {log} | {python} -m memforensics oom --json --file /dev/stdin")
    assert stdin.returncode == 0, stdin.stderr
    assert '"kills": 23' in stdin.stdout


def test_dev_kmsg_given_as_a_file_is_refused_not_read_forever() -> None:
    if not os.path.exists("/dev/kmsg"):
        pytest.skip("no /dev/kmsg in this container")
    with pytest.raises(InputDataError, match="ring buffer"):
        read_text_log("/dev/kmsg")
