"""Targets of the census tests: the C++ service compiled stripped, the Python one under each
CPython this machine has, and their command pipes."""

from __future__ import annotations

import hashlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.targets import TARGETS_DIR, Target

_BUILD_DIR = Path(tempfile.gettempdir()) / f"memforensics-test-targets-{os.getuid()}"
# CPython 3.11 is the system's; 3.12 and 3.13 where pyenv (or the system) has them.
PYTHONS = [
    path
    for path in (
        "/usr/bin/python3.11",
        shutil.which("python3.12") and "/root/.pyenv/versions/3.12.1/bin/python3.12",
        "/root/.pyenv/versions/3.13.0/bin/python3.13",
    )
    if path and Path(path).is_file()
]


def compile_cxx(name: str) -> Path:
    """tests/targets/NAME.cpp compiled with g++ -O2 -s (stripped; cached by content)."""
    source = TARGETS_DIR / f"{name}.cpp"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:12]
    _BUILD_DIR.mkdir(mode=0o700, exist_ok=True)
    binary = _BUILD_DIR / f"{name}-{digest}"
    if not binary.exists():
        tmp = binary.with_suffix(".tmp")
        subprocess.run(
            ["g++", "-O2", "-s", "-pthread", "-o", str(tmp), str(source)],
            check=True,
            capture_output=True,
        )
        tmp.rename(binary)
    return binary


def ready_fields(target: Target) -> dict[str, int]:
    """name=count pairs of the C++ service's ready line."""
    return {k: int(v) for k, v in (f.split("=", 1) for f in target.ready_line.split()[1:])}


def ready_json(target: Target) -> Any:
    return json.loads(target.ready_line.split(" ", 1)[1])


def command(target: Target, line: str, answer: str, timeout_seconds: float = 30.0) -> str:
    """Send ``line`` to the target's stdin and wait for a line starting with ``answer``."""
    assert target.proc.stdin is not None and target.proc.stdout is not None
    target.proc.stdin.write(line.encode() + b"\n")
    target.proc.stdin.flush()
    fd = target.proc.stdout.fileno()
    deadline = time.monotonic() + timeout_seconds
    pending = b""
    while time.monotonic() < deadline:
        readable, _, _ = select.select([fd], [], [], 0.5)
        if not readable:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        pending += chunk
        for raw in pending.split(b"\n"):
            if raw.decode(errors="replace").startswith(answer):
                return raw.decode()
    raise AssertionError(f"target did not answer {answer!r} to {line!r}")
