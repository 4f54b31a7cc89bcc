"""gdb's process for a session: found, and started lean (without its Python package, whose
import is most of gdb's start-up) in its own session, out of the OOM killer's choice."""

from __future__ import annotations

import contextlib
import hashlib
import os
import resource
import shutil
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from memforensics.errors import GdbUnavailableError
from memforensics.sources.files.user_cache import cache_folder
from memforensics.sources.gdb.gdb_setup import SIGNAL_HANDLING, SIGNALS_FILE


def find_gdb(gdb_path: str | None) -> str:
    """The gdb executable: ``gdb_path`` (a path, or a name on PATH), else ``gdb`` on PATH."""
    if gdb_path is not None:
        if os.sep in gdb_path:
            if os.path.isfile(gdb_path) and os.access(gdb_path, os.X_OK):
                return gdb_path
            raise GdbUnavailableError(f"gdb not found or not executable at {gdb_path}")
        found = shutil.which(gdb_path)
        if found is None:
            raise GdbUnavailableError(f"{gdb_path} not found on PATH")
        return found
    found = shutil.which("gdb")
    if found is None:
        raise GdbUnavailableError("gdb is not installed (not found on PATH)")
    return found


def protect_from_oom_killer(pid: int) -> None:
    """oom_score_adj -1000 for gdb where allowed (CAP_SYS_RESOURCE): on a host out of memory,
    the OOM killer choosing gdb mid-call would leave the target to the watchdog's rescue."""
    with contextlib.suppress(OSError), open(f"/proc/{pid}/oom_score_adj", "w") as handle:
        handle.write("-1000")


def _is_lean_copy(lean: Path, installed: Path) -> bool:
    """``lean`` holds a link to each entry of ``installed`` but python, and the signals file."""
    try:
        wanted = {e.name for e in os.scandir(installed) if e.name != "python"}
        links = {e.name: os.readlink(e.path) for e in os.scandir(lean) if e.is_symlink()}
    except OSError:
        return False
    return (
        set(links) == wanted
        and all(links[name] == str(installed / name) for name in wanted)
        and (lean / SIGNALS_FILE).is_file()
    )


def lean_data_directory(gdb: str) -> str | None:
    """A data directory for ``gdb``: its installed one minus the ``python`` package, plus the
    session's signal table (gdb_setup.SIGNAL_HANDLING), kept in this user's cache.

    Most of gdb's start-up is its Python: importing the ``gdb`` package (printers, frame
    filters, unwinders) took 60 of 90 ms here, and a session uses none of it (no Python
    command is sent, auto-load is off). Without the package gdb warns once, "limited Python
    support", and works as before. The directory is built once per gdb installation (a
    temporary folder renamed into place, so a concurrent or killed run never sees half of
    it) and reused: a SIGKILLed run leaves nothing behind. None when gdb's data directory is
    not where its prefix puts it (a custom build) or the cache cannot be written: gdb then
    starts as it is.
    """
    installed = Path(os.path.realpath(gdb)).parent.parent / "share" / "gdb"
    if not (installed / "python" / "gdb" / "__init__.py").is_file():
        return None
    root = cache_folder()
    key = hashlib.sha256(str(installed).encode()).hexdigest()[:16]
    lean = root / f"gdb-data-{key}"
    if _is_lean_copy(lean, installed):
        return str(lean)
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
    except OSError:
        return None
    try:
        for entry in os.scandir(installed):
            if entry.name != "python":
                os.symlink(entry.path, building / entry.name)
        (building / SIGNALS_FILE).write_text("\n".join(SIGNAL_HANDLING) + "\n", "ascii")
        if lean.exists():
            shutil.rmtree(lean, ignore_errors=True)  # stale: gdb was reinstalled elsewhere
        os.rename(building, lean)
    except OSError:
        shutil.rmtree(building, ignore_errors=True)
        # another run may have put it in place meanwhile
        return str(lean) if _is_lean_copy(lean, installed) else None
    return str(lean)


def gdb_argv(gdb: str, data_directory: str | None) -> list[str]:
    """gdb's command line for a session: MI, no init files (and no Python, see above)."""
    argv = [gdb, "-nx", "-nh", "-q", "-i=mi"]
    if data_directory is not None:
        argv.append(f"--data-directory={data_directory}")
    return argv


@dataclass
class GdbProcess:
    """A gdb started for one session, and the data directory it reads (lean_data_directory)."""

    gdb: str
    process: subprocess.Popen[bytes]
    data_directory: str | None

    def alive(self) -> bool:
        return self.process.poll() is None

    def discard(self) -> None:
        """End a gdb no session took (it never attached to anything) and clean up after it."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(OSError, ValueError):
            self.process.wait(timeout=5.0)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


def start_gdb(gdb: str) -> GdbProcess:
    """Start ``gdb`` under MI, lean, in its own session (the terminal's Ctrl-C must not reach
    it), with no core dumps and, where allowed, out of the OOM killer's choice."""
    data_directory = lean_data_directory(gdb)
    try:
        process = subprocess.Popen(
            gdb_argv(gdb, data_directory),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,  # gdb's own warnings interleave as plain output lines
            bufsize=0,
            start_new_session=True,
            close_fds=True,
            cwd="/",  # nothing of gdb's (a core file if it crashes) lands in the user's directory
        )
    except OSError as exc:
        raise GdbUnavailableError(f"cannot run {gdb}: {exc.strerror}") from exc
    with contextlib.suppress(OSError, ValueError):
        resource.prlimit(process.pid, resource.RLIMIT_CORE, (0, 0))
    protect_from_oom_killer(process.pid)
    return GdbProcess(gdb, process, data_directory)
