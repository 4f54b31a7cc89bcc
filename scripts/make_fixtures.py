#!/usr/bin/env python3
"""Rebuild the real glibc ``malloc_info`` fixtures by compiling and running small programs.

Every file this script writes is real glibc output: the C programs in
``scripts/fixture_programs/`` call ``malloc_info(0, fp)`` themselves at the right moment, and
the idle-python3 dump is taken by gdb in batch mode from a sleeping ``python3`` this script
starts (and kills). Nothing is edited after glibc wrote it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAMS_DIR = Path(__file__).resolve().parent / "fixture_programs"
DEFAULT_OUT = REPO / "fixtures"

# Every child runs under these bounds: a memory cgroup when the machine lets us make one,
# else an address-space rlimit; and always a wall-clock timeout.
MEMORY_LIMIT_BYTES = 768 * 1024 * 1024
ADDRESS_SPACE_LIMIT_BYTES = 4 * 1024 * 1024 * 1024
RUN_TIMEOUT_SECONDS = 60.0
GDB_TIMEOUT_SECONDS = 60.0
MAX_FIXTURE_BYTES = 300 * 1024  # committed fixtures stay small (see fixtures/README.md)

# Debian 12 package names and the sonames LD_PRELOAD loads.
PRELOADS = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
}


class FixtureError(Exception):
    """A fixture could not be made; the message says which and why."""


@dataclass(frozen=True)
class Fixture:
    """One fixture recipe: its output files and the function that makes them."""

    name: str
    outputs: tuple[str, ...]
    summary: str
    make: Callable[[Builder, Path], str]


# --------------------------------------------------------------------------------------------
# Running children in bounds


def _own_cgroup_dirs() -> list[Path]:
    """cgroup directories holding this process: v1 memory controller first, then v2."""
    v1: list[Path] = []
    v2: list[Path] = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            hierarchy, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            if "memory" in controllers.split(","):
                v1.append(Path("/sys/fs/cgroup/memory") / rel)
            elif hierarchy == "0":
                for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
                    if (root / "cgroup.controllers").exists():
                        v2.append(root / rel)
                        break
    return v1 + v2


@contextlib.contextmanager
def memory_cgroup(limit_bytes: int) -> Iterator[Path | None]:
    """Make a child memory cgroup of our own with ``limit_bytes``; yield its directory.

    Yields None when no writable memory controller exists (the caller then relies on an
    rlimit). The directory is removed on exit; it is empty by then because every child
    has been waited for.
    """
    made: Path | None = None
    for parent in _own_cgroup_dirs():
        child = parent / f"memforensics-fixtures-{os.getpid()}"
        try:
            child.mkdir()
        except OSError:
            continue
        try:
            if (child / "memory.max").exists():
                (child / "memory.max").write_text(str(limit_bytes))
            elif (child / "memory.limit_in_bytes").exists():
                (child / "memory.limit_in_bytes").write_text(str(limit_bytes))
            else:
                raise OSError("no memory limit file")
        except OSError:
            with contextlib.suppress(OSError):
                child.rmdir()
            continue
        made = child
        break
    try:
        yield made
    finally:
        if made is not None:
            with contextlib.suppress(OSError):
                made.rmdir()


class Builder:
    """Compiles the fixture programs once and runs them in bounds."""

    def __init__(self, build_dir: Path, cgroup: Path | None, verbose: bool) -> None:
        self.build_dir = build_dir
        self.cgroup = cgroup
        self.verbose = verbose
        self._binaries: dict[str, Path] = {}

    def log(self, message: str) -> None:
        """Progress on stderr (stdout is left for the summary)."""
        print(message, file=sys.stderr, flush=True)

    def binary(self, program: str) -> Path:
        """Compile ``fixture_programs/PROGRAM.c`` (once per run) and return the executable."""
        if program not in self._binaries:
            cc = shutil.which("cc") or shutil.which("gcc")
            if cc is None:
                raise FixtureError("no C compiler: apt-get install gcc")
            source = PROGRAMS_DIR / f"{program}.c"
            out = self.build_dir / program
            argv = [cc, "-O1", "-g0", "-Wall", "-Wextra", "-pthread", "-o", str(out), str(source)]
            proc = subprocess.run(argv, capture_output=True, text=True, check=False)
            if proc.returncode != 0:
                raise FixtureError(f"compiling {source.name} failed:\n{proc.stderr}")
            self._binaries[program] = out
        return self._binaries[program]

    def _bounded(self, argv: Sequence[str]) -> list[str]:
        """Wrap ``argv`` in a shell that joins the memory cgroup (or caps the address space)
        and then execs it, so the bound holds from the child's first instruction."""
        if self.cgroup is not None:
            procs = self.cgroup / "cgroup.procs"
            script = f'echo $$ > "{procs}" && exec "$@"'
        else:
            script = f'ulimit -v {ADDRESS_SPACE_LIMIT_BYTES // 1024} && exec "$@"'
        return ["/bin/sh", "-c", script, "sh", *argv]

    def popen(
        self, argv: Sequence[str], env: dict[str, str] | None = None
    ) -> subprocess.Popen[str]:
        """Start a bounded child with piped stdout/stderr."""
        full_env = {"LC_ALL": "C", "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if env:
            full_env.update(env)
        return subprocess.Popen(
            self._bounded(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=full_env,
            start_new_session=True,
        )

    def run(self, argv: Sequence[str], env: dict[str, str] | None = None) -> str:
        """Run a bounded child to completion; return its stdout or raise FixtureError."""
        if self.verbose:
            prefix = " ".join(f"{k}={v}" for k, v in (env or {}).items())
            self.log(f"  $ {prefix} {' '.join(argv)}".replace("  $  ", "  $ "))
        proc = self.popen(argv, env)
        try:
            stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_SECONDS)
        except subprocess.TimeoutExpired:
            _kill(proc)
            raise FixtureError(f"{argv[0]} did not finish in {RUN_TIMEOUT_SECONDS:.0f}s") from None
        if proc.returncode != 0:
            raise FixtureError(f"{Path(argv[0]).name} exited {proc.returncode}: {stderr.strip()}")
        return stdout


def _kill(proc: subprocess.Popen[str]) -> None:
    """Kill a child we started, by its PID, and reap it."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _check_dump(path: Path, documents: int = 1) -> None:
    """Refuse to keep output that is not what glibc writes (or too big to commit)."""
    data = path.read_bytes()
    found = data.count(b'<malloc version="1">')
    if found != documents or not data.rstrip().endswith(b"</malloc>"):
        raise FixtureError(f"{path.name}: expected {documents} complete dump(s), found {found}")
    if len(data) > MAX_FIXTURE_BYTES:
        raise FixtureError(f"{path.name}: {len(data)} bytes, over the {MAX_FIXTURE_BYTES} limit")


# --------------------------------------------------------------------------------------------
# The recipes


def make_threads_fragmented(b: Builder, out: Path) -> str:
    """24 threads, 1,500 mixed-size blocks each, ~4 in 5 freed in an interleaved pattern."""
    target = out / "threads-fragmented.xml"
    stdout = b.run([str(b.binary("threads_fragmented")), "24", "1500", str(target)])
    _check_dump(target)
    return stdout.strip()


def make_arena_max_1(b: Builder, out: Path) -> str:
    """The same program, 24 threads, with glibc.malloc.arena_max=1: every thread in arena 0."""
    target = out / "arena-max-1.xml"
    stdout = b.run(
        [str(b.binary("threads_fragmented")), "24", "1500", str(target)],
        env={"GLIBC_TUNABLES": "glibc.malloc.arena_max=1"},
    )
    _check_dump(target)
    return f"GLIBC_TUNABLES=glibc.malloc.arena_max=1 {stdout.strip()}"


def make_free_all_but_last(b: Builder, out: Path) -> str:
    """200,000 x 1 KiB, free all but the last; dump, malloc_trim(0), dump; RSS around it."""
    before = out / "free-all-but-last-before-trim.xml"
    after = out / "free-all-but-last-after-trim.xml"
    stdout = b.run([str(b.binary("free_all_but_last")), "200000", "1024", str(before), str(after)])
    _check_dump(before)
    _check_dump(after)
    match = re.search(r"rss_before_kib=(\d+) rss_after_kib=(\d+) trim_returned=(-?\d+)", stdout)
    if match is None:
        raise FixtureError(f"free_all_but_last printed no RSS line: {stdout!r}")
    rss_before_kib, rss_after_kib, trim_returned = (int(g) for g in match.groups())
    return (
        f"VmRSS before trim: {rss_before_kib} KiB; after malloc_trim(0): {rss_after_kib} KiB "
        f"(malloc_trim returned {trim_returned})"
    )


def make_mmap_heavy(b: Builder, out: Path) -> str:
    """96 live blocks of 256 KiB-2 MiB (above the mmap threshold) plus small heap traffic."""
    target = out / "mmap-heavy.xml"
    stdout = b.run([str(b.binary("mmap_heavy")), "96", str(target)])
    _check_dump(target)
    return stdout.strip()


def make_series(b: Builder, out: Path) -> str:
    """One process appending a dump to the same file every 20 ms, 5 times."""
    target = out / "series-5.xml"
    stdout = b.run([str(b.binary("series")), "5", str(target)])
    _check_dump(target, documents=5)
    return stdout.strip()


def _make_preloaded(b: Builder, out: Path, allocator: str) -> str:
    soname, package = PRELOADS[allocator]
    target = out / f"{allocator}-preload.xml"
    # Ask the dynamic loader whether it can find the library, not a hard-coded path.
    probe = subprocess.run(
        ["/bin/sh", "-c", f"LD_PRELOAD={soname} /bin/true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0 or "cannot be preloaded" in probe.stderr:
        raise FixtureError(f"{soname} not loadable: apt-get install {package}")
    stdout = b.run([str(b.binary("other_allocator")), str(target)], env={"LD_PRELOAD": soname})
    _check_dump(target)
    return f"LD_PRELOAD={soname} {stdout.strip()}"


def make_jemalloc(b: Builder, out: Path) -> str:
    """glibc's dump from a process whose malloc is jemalloc (LD_PRELOAD): all zero."""
    return _make_preloaded(b, out, "jemalloc")


def make_tcmalloc(b: Builder, out: Path) -> str:
    """glibc's dump from a process whose malloc is tcmalloc (LD_PRELOAD): all zero."""
    return _make_preloaded(b, out, "tcmalloc")


_PY_IDLE = "import sys, time\nprint('ready', flush=True)\ntime.sleep(60)\n"


def make_python_idle(b: Builder, out: Path) -> str:
    """gdb -batch attaches to an idle python3 (sleeping: not inside malloc) and dumps."""
    gdb = shutil.which("gdb")
    if gdb is None:
        raise FixtureError("gdb missing: apt-get install gdb")
    target = out / "python3-idle.xml"
    python = sys.executable  # the python3 running this script: whatever the machine has
    with tempfile.TemporaryDirectory(prefix="memforensics-fixture-") as tmp:
        # The target writes into our private 0700 directory, never a predictable shared path.
        scratch = Path(tmp) / "dump.xml"
        proc = b.popen([python, "-c", _PY_IDLE])
        try:
            assert proc.stdout is not None
            ready = proc.stdout.readline()
            if not ready.startswith("ready"):
                raise FixtureError(f"{python} did not say ready")
            # Give the interpreter a moment to enter time.sleep (a syscall: a safe point).
            time.sleep(0.3)
            argv = [
                gdb,
                "-nx",
                "-batch",
                "-iex",
                "set debuginfod enabled off",
                "-iex",
                "set auto-load off",
                "-iex",
                "set auto-solib-add off",
                "-p",
                str(proc.pid),
                "-ex",
                "sharedlibrary libc\\.so",
                "-ex",
                f'set $mf_stream = (void *) fopen("{scratch}", "w")',
                "-ex",
                "print (int) malloc_info(0, $mf_stream)",
                "-ex",
                "print (int) fclose($mf_stream)",
            ]
            gdb_proc = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=GDB_TIMEOUT_SECONDS,
                check=False,
            )
            if b.verbose:
                b.log(gdb_proc.stdout + gdb_proc.stderr)
            if "= 0" not in gdb_proc.stdout or not scratch.exists():
                raise FixtureError(f"gdb batch dump failed:\n{gdb_proc.stdout}{gdb_proc.stderr}")
        finally:
            _kill(proc)
        shutil.copyfile(scratch, target)
    _check_dump(target)
    version = subprocess.run(
        [python, "--version"], capture_output=True, text=True, check=False
    ).stdout.strip()
    return f"{version} sleeping in time.sleep, dumped by gdb -batch -p PID"


FIXTURES: tuple[Fixture, ...] = (
    Fixture(
        "threads-fragmented",
        ("threads-fragmented.xml",),
        "24 threads, mixed sizes, interleaved frees",
        make_threads_fragmented,
    ),
    Fixture(
        "free-all-but-last",
        ("free-all-but-last-before-trim.xml", "free-all-but-last-after-trim.xml"),
        "200,000 x 1 KiB, all but the last freed; before/after malloc_trim(0)",
        make_free_all_but_last,
    ),
    Fixture(
        "mmap-heavy", ("mmap-heavy.xml",), "96 live blocks above the threshold", make_mmap_heavy
    ),
    Fixture("arena-max-1", ("arena-max-1.xml",), "24 threads, arena_max=1", make_arena_max_1),
    Fixture("python3-idle", ("python3-idle.xml",), "idle python3 via gdb -batch", make_python_idle),
    Fixture("series", ("series-5.xml",), "5 dumps appended to one file", make_series),
    Fixture("jemalloc", ("jemalloc-preload.xml",), "malloc is jemalloc: all zero", make_jemalloc),
    Fixture("tcmalloc", ("tcmalloc-preload.xml",), "malloc is tcmalloc: all zero", make_tcmalloc),
)


def _glibc_version() -> str:
    version = platform.libc_ver()
    return f"{version[0]} {version[1]}" if version[0] else "unknown libc"


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    names = "\n".join(
        f"  {f.name:<20} {', '.join(f.outputs)}\n{'':<23}{f.summary}" for f in FIXTURES
    )
    parser = argparse.ArgumentParser(
        prog="scripts/make_fixtures.py",
        description=textwrap.dedent(
            """\
            Rebuild memforensics' real glibc malloc_info fixtures on this machine.

            Compiles the C programs in scripts/fixture_programs/ with cc, runs each one
            (inside a memory-limited cgroup when one can be made, else under an
            address-space rlimit, always with a timeout) and saves the malloc_info XML
            glibc writes. The idle-python3 dump is taken with gdb -batch from a sleeping
            python3 started (and killed) by this script. Output is never edited.

            The committed fixtures were made on Debian 12 (glibc 2.36, amd64, 2 cores);
            another glibc or core count gives other numbers and arena counts, and the
            tests in tests/unit/test_fixtures.py pin the committed files, so regenerate
            only on purpose and update fixtures/README.md (the script prints the lines).
            """
        ),
        epilog=textwrap.dedent(
            """\
            fixtures:
            {names}

            needs: cc (gcc), gdb (python3-idle), libjemalloc2 and libtcmalloc-minimal4
            (jemalloc/tcmalloc; Debian: apt-get install libjemalloc2 libtcmalloc-minimal4).

            examples:
              scripts/make_fixtures.py                    # rebuild all into fixtures/
              scripts/make_fixtures.py --only series      # just one
              scripts/make_fixtures.py --out /tmp/fx -v   # elsewhere, showing commands
            """
        ).format(names=names),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="directory to write the dumps into (default: the repository's fixtures/)",
    )
    parser.add_argument(
        "--only",
        action="append",
        choices=[f.name for f in FIXTURES],
        metavar="NAME",
        help="make only this fixture (repeatable); see the list below",
    )
    parser.add_argument("--list", action="store_true", help="list the fixtures and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="show commands and gdb")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Make the selected fixtures; print one README-ready line per fixture on stdout."""
    args = _parse_args(argv)
    if args.list:
        for fixture in FIXTURES:
            print(f"{fixture.name:<20} {', '.join(fixture.outputs)}")
        return 0
    selected = [f for f in FIXTURES if not args.only or f.name in args.only]
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    failures = 0
    with (
        tempfile.TemporaryDirectory(prefix="memforensics-fixture-build-") as build,
        memory_cgroup(MEMORY_LIMIT_BYTES) as cgroup,
    ):
        builder = Builder(Path(build), cgroup, args.verbose)
        bound = f"memory cgroup {cgroup}" if cgroup else "RLIMIT_AS (no writable memory cgroup)"
        builder.log(f"{_glibc_version()}, {os.cpu_count()} cores; children bounded by {bound}")
        for fixture in selected:
            builder.log(f"making {fixture.name} …")
            try:
                detail = fixture.make(builder, out)
            except (FixtureError, OSError, subprocess.SubprocessError) as exc:
                failures += 1
                builder.log(f"error: {fixture.name}: {exc}")
                continue
            for output in fixture.outputs:
                size_bytes = (out / output).stat().st_size
                print(f"{output} ({size_bytes} bytes): {detail}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
