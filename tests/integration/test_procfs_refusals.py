"""check_target, detect_allocator and diagnose_attach_failure against real processes:
glibc, static, musl, jemalloc, tcmalloc, zombie, kernel thread, stopped, traced, other user."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from memforensics.errors import (
    NoSuchProcessError,
    NotGlibcMallocError,
    TargetError,
    TargetPermissionError,
    TargetStoppedError,
)
from memforensics.sources.proc import (
    allocator_detect,
    attach_diagnosis,
    process_facts,
    procfs,
    target_check,
)
from tests.support.targets import TARGETS_DIR, c_target, have_cc, running

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not have_cc(), reason="no C compiler (cc) to build the target programs"),
]

LIBDIR = Path("/usr/lib/x86_64-linux-gnu")
JEMALLOC = LIBDIR / "libjemalloc.so.2"
TCMALLOC = LIBDIR / "libtcmalloc_minimal.so.4"
NOBODY = 65534


def _apt_install(package: str) -> str | None:
    """Install a Debian package like the nox session does; the reason on failure."""
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        return f"{package} is not installed and apt-get is not usable here (not root)"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    command = ["apt-get", "install", "-y", "-qq", package]
    if subprocess.run(command, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=False)
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            return f"apt-get install {package} failed: {result.stderr.strip()[-200:]}"
    return None


def _need(path: Path, package: str) -> None:
    if not path.exists():
        reason = _apt_install(package)
        if reason is not None or not path.exists():
            pytest.skip(reason or f"{package} installed but {path} is missing")


def _wait_state(pid: int, states: str, timeout_seconds: float = 5.0) -> str:
    deadline = time.monotonic() + timeout_seconds
    while time.monotonic() < deadline:
        state = procfs.process_state(pid)
        if state in states:
            return state
        time.sleep(0.01)
    raise AssertionError(f"PID {pid} never reached state {states}")


def test_glibc_target_passes_with_facts() -> None:
    """A normal dynamic program: glibc allocator, the same glibc version this Python runs."""
    with c_target("proc_idle") as target:
        facts = target_check.check_target(target.pid)
        assert facts.pid == target.pid
        assert facts.allocator.kind == "glibc"
        assert facts.libc_path is not None and "libc.so" in facts.libc_path
        assert facts.glibc_version == os.confstr("CS_GNU_LIBC_VERSION").split()[1]  # type: ignore[union-attr]
        assert facts.tracer_pid == 0
        assert facts.threads == 1
        assert facts.state in "SR"
        assert facts.uid == os.geteuid()
        assert facts.cmdline and facts.cmdline[0].endswith(facts.exe.rsplit("/", 1)[1])  # type: ignore[union-attr]


def test_static_binary_refused_naming_it() -> None:
    """A static binary maps no libc.so: gdb cannot load libc's symbols alone; say what it is."""
    with c_target("proc_idle", cflags=("-static",)) as target:
        info = allocator_detect.detect_allocator(target.pid)
        assert info.kind == "static"
        assert "static binary" in info.detail
        assert "glibc linked in" in info.detail
        with pytest.raises(NotGlibcMallocError, match="static binary") as err:
            target_check.check_target(target.pid)
        assert err.value.exit_code == 3
        # Its malloc is glibc's, linked in: not "does not use glibc malloc".
        assert "does not use glibc malloc" not in err.value.message
        assert "malloc_info(0, stdout)" in (err.value.hint or "")


def test_musl_refused() -> None:
    """musl has no malloc_info at all."""
    if shutil.which("musl-gcc") is None:
        reason = _apt_install("musl-tools")
        if reason is not None or shutil.which("musl-gcc") is None:
            pytest.skip(reason or "musl-tools installed but musl-gcc is missing")
    with tempfile.TemporaryDirectory() as tmp:
        binary = Path(tmp) / "proc_idle_musl"
        subprocess.run(
            ["musl-gcc", "-o", str(binary), str(TARGETS_DIR / "proc_idle.c")],
            check=True,
            capture_output=True,
        )
        with running([str(binary)]) as target:
            info = allocator_detect.detect_allocator(target.pid)
            # Debian's musl-gcc links dynamically against .../x86_64-linux-musl/libc.so.
            assert info.kind == "musl"
            assert info.glibc_version is None
            with pytest.raises(NotGlibcMallocError, match="musl") as err:
                target_check.check_target(target.pid)
            assert err.value.exit_code == 3


@pytest.mark.parametrize(
    ("library", "package", "kind"),
    [(JEMALLOC, "libjemalloc2", "jemalloc"), (TCMALLOC, "libtcmalloc-minimal4", "tcmalloc")],
)
def test_preloaded_allocator_refused(library: Path, package: str, kind: str) -> None:
    """jemalloc/tcmalloc take over malloc: malloc_info would describe glibc's unused arena,
    so glibc's paths refuse them; inspect and trim take them (foreign_ok) with the library
    that serves malloc named."""
    _need(library, package)
    with c_target("proc_idle", env={"LD_PRELOAD": str(library)}) as target:
        info = allocator_detect.detect_allocator(target.pid)
        assert info.kind == kind
        assert str(library.name) in info.detail
        with pytest.raises(NotGlibcMallocError, match=kind):
            target_check.check_target(target.pid)
        facts = target_check.check_target(target.pid, foreign_ok=True)
        assert facts.allocator.foreign is not None and facts.allocator.foreign.serves_malloc
        assert facts.allocator.foreign.kind == kind
        assert library.name.split(".so")[0] in facts.allocator.foreign.path


def test_zombie_refused() -> None:
    """An exited, unreaped child: no memory to inspect; the hint points at its parent."""
    child = subprocess.Popen(["sh", "-c", "exit 0"])
    try:
        _wait_state(child.pid, "Z")
        with pytest.raises(TargetError, match="zombie") as err:
            target_check.check_target(child.pid)
        assert err.value.exit_code == 3
        assert "parent" in (err.value.hint or "")
        assert isinstance(
            attach_diagnosis.diagnose_attach_failure(child.pid, "ptrace: ..."), TargetError
        )
    finally:
        child.wait()


def _a_kernel_thread() -> int | None:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                flags = int(entry.joinpath("stat").read_text().rsplit(")", 1)[1].split()[6])
                if flags & 0x00200000:
                    return int(entry.name)
    return None


def test_kernel_thread_refused() -> None:
    """kthreadd (PID 2) or any kernel thread has no user-space heap."""
    pid = _a_kernel_thread()
    if pid is None:
        pytest.skip("no kernel thread is visible in this PID namespace")
    facts = process_facts.read_process(pid)
    assert facts.kernel_thread
    assert facts.cmdline == ()
    with pytest.raises(TargetError, match="kernel thread") as err:
        target_check.check_target(pid)
    assert err.value.exit_code == 3


def test_stopped_target_refused_unless_allowed() -> None:
    """State T set by someone else: refuse, never resume; --allow-stopped inspects it."""
    with c_target("proc_idle") as target:
        os.kill(target.pid, signal.SIGSTOP)
        try:
            _wait_state(target.pid, "T")
            with pytest.raises(TargetStoppedError, match="stopped") as err:
                target_check.check_target(target.pid)
            assert err.value.pid == target.pid
            assert "kill -CONT" in (err.value.hint or "")
            assert procfs.process_state(target.pid) == "T"  # still stopped: not resumed
            facts = target_check.check_target(target.pid, allow_stopped=True)
            assert facts.state == "T"
        finally:
            os.kill(target.pid, signal.SIGCONT)


_SEIZE = """
import ctypes, sys, time
libc = ctypes.CDLL(None, use_errno=True)
PTRACE_SEIZE = 0x4206  # attach without stopping the tracee (linux/ptrace.h)
if libc.ptrace(PTRACE_SEIZE, int(sys.argv[1]), None, None) != 0:
    sys.exit(f"seize failed: errno {ctypes.get_errno()}")
print("ready", flush=True)
time.sleep(120)
"""


@contextlib.contextmanager
def _traced(pid: int) -> Iterator[int]:
    """A real tracer holding ``pid`` (PTRACE_SEIZE, which does not stop it)."""
    with running([sys.executable, "-c", _SEIZE, str(pid)]) as tracer:
        yield tracer.pid


def test_already_traced_refused_with_tracer_named() -> None:
    """TracerPid set: exit 4 naming the tracer, both before attaching and after a failure."""
    with c_target("proc_idle") as target, _traced(target.pid) as tracer_pid:
        assert process_facts.read_process(target.pid).tracer_pid == tracer_pid
        with pytest.raises(TargetPermissionError, match=f"TracerPid {tracer_pid} \\(python") as err:
            target_check.check_target(target.pid)
        assert err.value.exit_code == 4
        diagnosed = attach_diagnosis.diagnose_attach_failure(
            target.pid, "ptrace: Operation not permitted."
        )
        assert isinstance(diagnosed, TargetPermissionError)
        assert f"already traced by TracerPid {tracer_pid}" in diagnosed.message


def test_gone_process_diagnosed_as_exited() -> None:
    child = subprocess.Popen(["true"])
    child.wait()
    with pytest.raises(NoSuchProcessError):
        target_check.check_target(child.pid)
    diagnosed = attach_diagnosis.diagnose_attach_failure(child.pid, "ptrace: No such process.")
    assert isinstance(diagnosed, NoSuchProcessError)
    assert diagnosed.exit_code == 3


def _diagnose_as_nobody(
    pid: int, scope: int | None, gdb_message: str = "ptrace: Operation not permitted."
) -> tuple[str, str, str]:
    """Run diagnose_attach_failure in a forked child that dropped to uid nobody (no caps).

    ``scope`` stands in for /proc/sys/kernel/yama/ptrace_scope, which this kernel may lack
    (the one thing here that is replaced: Yama cannot be switched on in a test).
    """
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.close(read_end)
            attach_diagnosis._ptrace_scope = lambda: scope  # type: ignore[assignment]
            os.setgroups([])
            os.setresgid(NOBODY, NOBODY, NOBODY)
            os.setresuid(NOBODY, NOBODY, NOBODY)
            err = attach_diagnosis.diagnose_attach_failure(pid, gdb_message)
            text = f"{type(err).__name__}\n{err.message}\n{err.hint}"
            os.write(write_end, text.encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        data = reader.read().decode()
    os.waitpid(child, 0)
    kind, message, hint = data.split("\n", 2)
    return kind, message, hint


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_permission_diagnosis_other_user_and_yama() -> None:
    """Without CAP_SYS_PTRACE: another user's process, and each Yama ptrace_scope level."""
    with c_target("proc_idle") as target:
        kind, message, hint = _diagnose_as_nobody(target.pid, None)
        assert kind == "TargetPermissionError"
        assert f"runs as uid 0, you are uid {NOBODY}" in message
        assert "sudo -E" in hint
        kind, message, _ = _diagnose_as_nobody(target.pid, 2)
        assert "ptrace_scope is 2" in message
        kind, message, hint = _diagnose_as_nobody(target.pid, 3)
        assert "ptrace_scope is 3" in message and "reboot" in hint


@pytest.mark.skipif(os.geteuid() != 0, reason="dropping to another uid needs root")
def test_permission_diagnosis_same_user_without_capability() -> None:
    """Same uid, no CAP_SYS_PTRACE: Yama scope 1 is the cause; without Yama, name the cap."""
    # A target owned by nobody, diagnosed by nobody: only Yama or the missing cap can refuse.
    with running(
        [
            sys.executable,
            "-c",
            "import os,time; os.setgroups([]); os.setresgid(65534,65534,65534);"
            "os.setresuid(65534,65534,65534); print('ready', flush=True); time.sleep(120)",
        ]
    ) as target:
        kind, message, _ = _diagnose_as_nobody(target.pid, 1)
        assert kind == "TargetPermissionError"
        assert "ptrace_scope is 1" in message
        # Yama makes gdb say "No such process" although the process exists: not exit 3.
        kind, message, _ = _diagnose_as_nobody(target.pid, 1, "ptrace: No such process.")
        assert kind == "TargetPermissionError"
        assert "ptrace_scope is 1" in message
        kind, message, hint = _diagnose_as_nobody(target.pid, None)
        assert "missing CAP_SYS_PTRACE (ptrace_scope absent on this kernel)" in message
        assert "gdb said: ptrace: Operation not permitted." in message
        assert "sudo -E" in hint or "SYS_PTRACE" in hint


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a target as another user")
@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) missing")
def test_root_without_cap_sys_ptrace_refused_before_attaching() -> None:
    """Root whose CAP_SYS_PTRACE was dropped (a container, setpriv) cannot trace another
    user's process: check_target says so up front, as exit 4, instead of gdb failing later."""
    code = (
        "import sys\n"
        "from memforensics.sources.proc import target_check\n"
        "from memforensics.errors import MemforensicsError\n"
        "try:\n"
        "    target_check.check_target(int(sys.argv[1]))\n"
        "except MemforensicsError as err:\n"
        "    print(err.exit_code, err.message, '|', err.hint)\n"
    )
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    with running(
        [
            *as_nobody,
            sys.executable,
            "-c",
            "print('ready', flush=True)\nimport time\ntime.sleep(120)",
        ]
    ) as target:
        drop_cap = ["setpriv", "--bounding-set=-sys_ptrace", "--inh-caps=-sys_ptrace"]
        result = subprocess.run(
            [*drop_cap, sys.executable, "-c", code, str(target.pid)],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        assert result.stdout.startswith("4 cannot attach to PID"), result.stdout + result.stderr
        assert "runs as uid 65534 and this root has no CAP_SYS_PTRACE" in result.stdout
        assert "--cap-add=SYS_PTRACE" in result.stdout
