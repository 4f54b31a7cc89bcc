"""Developer and CI sessions: tests, lint, typecheck, bench."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.sessions = ["tests", "lint", "typecheck"]
nox.options.reuse_existing_virtualenvs = True

HERE = Path(__file__).parent
# Debian packages the real-thing tests need: gdb and gcc for live targets, the journal
# tools for real journal files, other allocators (jemalloc, tcmalloc, mimalloc) and libcs for
# the refusal tests and the foreign-allocator oracles, real services under load (PostgreSQL
# with pgbench, OpenJDK, Redis with redis-benchmark), compressed logs, the fleet's
# Prometheus components, and a headless browser for the HTML report.
SYSTEM_PACKAGES = (
    "gdb",
    "gcc",
    "g++",  # the census's C++ targets (tests/targets/*.cpp, built stripped)
    "libstdc++6",  # their runtime, whose type_info vtables the census validates against
    "gcc-multilib",  # cc -m32: the 32-bit target that inspect refuses
    "systemd-journal-remote",
    "libjemalloc2",
    "libjemalloc-dev",  # libjemalloc.a: an allocator linked into the executable
    "libtcmalloc-minimal4",
    "libmimalloc2.0",
    "musl-tools",
    "postgresql-15",
    "redis-tools",  # the server too (redis-check-rdb), without redis-server's system service
    "openjdk-17-jdk-headless",
    "xz-utils",
    "zstd",
    "prometheus",
    "prometheus-node-exporter",
    "chromium",
    "nodejs",  # a Node.js program, named by its runtime
)


def _missing_system_packages() -> list[str]:
    if shutil.which("dpkg-query") is None:
        return []
    missing = []
    for package in SYSTEM_PACKAGES:
        status = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", package],
            capture_output=True,
            text=True,
            check=False,
        )
        if "install ok installed" not in status.stdout:
            missing.append(package)
    return missing


def ensure_system_packages(session: nox.Session) -> None:
    """Install the Debian packages the real-thing tests need, when missing and root."""
    missing = _missing_system_packages()
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        session.warn(f"missing system packages {missing}; their tests will skip saying why")
        return
    env = {"DEBIAN_FRONTEND": "noninteractive"}
    session.run("apt-get", "update", "-qq", external=True, env=env)
    session.run("apt-get", "install", "-y", "-qq", *missing, external=True, env=env)


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, CLI and integration tests against real gdb, journalctl and cgroups."""
    ensure_system_packages(session)
    session.install("-e", ".[test]")
    session.run("pytest", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check."""
    session.install("ruff")
    session.run("ruff", "check", "memforensics", "tests", "benchmarks", "noxfile.py", "scripts")
    session.run(
        "ruff", "format", "--check", "memforensics", "tests", "benchmarks", "noxfile.py", "scripts"
    )


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package."""
    session.install("-e", ".[dev]")
    session.run("mypy")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: ratios against the manual way, measured in the same run.

    memforensics is installed as the README installs it (not editable: pip compiles its
    bytecode, and no editable-install finder runs at every start), like the tools it is
    compared with.
    """
    ensure_system_packages(session)
    session.install(".[test]")  # the benchmarks start their targets with the tests' helpers
    session.install("--force-reinstall", "--no-deps", ".")  # this tree's code, not an older build
    for script in sorted((HERE / "benchmarks").glob("bench_*.py")):
        session.run("python", str(script), *session.posargs)
