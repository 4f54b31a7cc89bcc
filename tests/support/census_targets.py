"""Targets of the census tests: the C++ service compiled stripped, the Python one under each
CPython this machine has, and their command pipes."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import select
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.targets import TARGETS_DIR, Target

_BUILD_DIR = Path(tempfile.gettempdir()) / f"memforensics-test-targets-{os.getuid()}"


# CPython 3.11 is the system's (Debian 12); 3.12 and 3.13 where the system or pyenv has them
# (pyenv's shims are left out: they run whatever version is selected). One per version.
def _pythons() -> list[str]:
    found: dict[str, str] = {}
    for version in ("3.11", "3.12", "3.13"):
        candidates = [f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"]
        candidates += sorted(
            glob.glob(str(Path.home() / f".pyenv/versions/{version}.*/bin/python{version}"))
        )
        for candidate in candidates:
            if Path(candidate).is_file() and os.access(candidate, os.X_OK):
                found.setdefault(version, candidate)
    return list(found.values())


PYTHONS = _pythons()


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
