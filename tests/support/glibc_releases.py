"""Test targets built and run on other Debian releases' glibc, beside this machine's own.

Debian 11's glibc 2.31 and Debian 13's 2.41 are fetched as ``libc6``, ``libc6-dev`` and
``linux-libc-dev`` with ``apt-get download`` through a private apt configuration (its own
sources list, state, cache and config parts under a cache directory; the system's /etc/apt is
only read, for the mirror URI, never written), from the Debian mirror this machine's own apt
sources name, checked against Debian's archive keyring. They are unpacked with ``dpkg-deb -x``
into one tree per release, kept across runs (a marker once complete, a lock so that two test
sessions do not race). A target is compiled against a tree and run through that tree's own
dynamic loader; this machine's glibc is one more release, with no tree: plain ``cc`` and run
directly, so tests read the same for all of them.

``release_tree(version)`` gives a release or None, and ``skip_reason(version)`` then says
why: only when apt-get, dpkg-deb or the mirror cannot be reached. Anything else that goes
wrong (a signature that does not verify, a tree that does not run) raises GlibcReleaseError.
``MEMFORENSICS_GLIBC_CACHE`` names another cache directory (CI caches).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

TARGETS_DIR = Path(__file__).resolve().parent.parent / "targets"
# The releases the live tests run on, and the Debian suite whose glibc each one is.
RELEASES = ("2.31", "2.36", "2.41")
SUITES = {"2.31": "bullseye", "2.36": "bookworm", "2.41": "trixie"}
PACKAGES = ("libc6", "libc6-dev", "linux-libc-dev")
MULTIARCH = "x86_64-linux-gnu"
LOADER = "ld-linux-x86-64.so.2"
ARCHIVE_KEYRING = Path("/usr/share/keyrings/debian-archive-keyring.gpg")
SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_DIR = Path("/etc/apt/sources.list.d")
# Suite names of Debian's own archive: a sources entry carrying one is the Debian mirror.
DEBIAN_SUITES = frozenset(
    {"buster", "bullseye", "bookworm", "trixie", "forky", "sid"}
    | {"oldoldstable", "oldstable", "stable", "testing", "unstable"}
)
LAYOUT = 1  # bump when the tree's fix-ups change: older cached trees are rebuilt

APT_TIMEOUT_SECONDS = 300.0  # each of apt-get update and apt-get download
TOOL_TIMEOUT_SECONDS = 120.0  # dpkg-deb -x, cc, apt-config
RUN_TIMEOUT_SECONDS = 30.0  # the version check program
LOCK_TIMEOUT_SECONDS = 900.0  # another session fetching the same release

# apt-get's words (run with LC_ALL=C) for a mirror it could not reach, and for a signature
# it could not check: the first is a reason to skip, the second a failure to look into.
_UNREACHABLE = re.compile(
    r"Could not resolve|Temporary failure resolving|Name or service not known|"
    r"Could not connect|Unable to connect|Connection failed|Connection refused|"
    r"Connection timed out|timed out|Network is unreachable|No route to host|"
    r"404\s+Not Found",
    re.IGNORECASE,
)
_UNTRUSTED = re.compile(
    r"NO_PUBKEY|EXPKEYSIG|KEYEXPIRED|BADSIG|signatures couldn't be verified|is not signed|"
    r"GPG error|Signed-By",
    re.IGNORECASE,
)
_APT_PROBLEM = re.compile(
    r"^(E:|W: (Failed to fetch|GPG error|Some index files|The repository))", re.M
)
_ONE_LINE_SOURCE = re.compile(r"^deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)((?:\s+\S+)*)\s*$")

# Prints the glibc it runs on and the libc file mapped into it.
_VERSION_PROGRAM = r"""
#include <gnu/libc-version.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    char line[4096];
    FILE *maps = fopen("/proc/self/maps", "r");
    printf("%s\n", gnu_get_libc_version());
    while (maps && fgets(line, sizeof line, maps)) {
        char *path = strchr(line, '/');
        if (path && (strstr(path, "/libc.so.6") || strstr(path, "/libc-2."))) {
            fputs(path, stdout);
            break;
        }
    }
    return 0;
}
"""


class GlibcReleaseError(RuntimeError):
    """A release could be fetched but something about it is wrong: look into it."""


class _Unavailable(Exception):
    """apt-get, dpkg-deb or the mirror cannot be reached: the tests skip saying this."""


@dataclass(frozen=True)
class GlibcRelease:
    """One glibc the tests run targets on: a Debian release's tree, or this machine's own."""

    version: str
    suite: str | None  # the Debian suite it came from; None: this machine's own glibc
    root: Path | None  # the unpacked tree; None: this machine's own glibc
    build_dir: Path  # compiled targets for this release

    @property
    def native(self) -> bool:
        return self.root is None

    @property
    def loader(self) -> Path | None:
        return None if self.root is None else self.root / "lib64" / LOADER

    @property
    def library_dirs(self) -> tuple[Path, ...]:
        if self.root is None:
            return ()
        return (self.root / "lib" / MULTIARCH, self.root / "usr" / "lib" / MULTIARCH)

    def owns(self, path: str) -> bool:
        """Whether a file (a libc path from /proc/PID/maps) lies in this release's tree."""
        if self.root is None:
            return True
        root = os.path.realpath(self.root)
        return os.path.realpath(path).startswith(root + os.sep)

    def __str__(self) -> str:
        if self.root is None:
            return f"glibc {self.version} (this machine's)"
        return f"glibc {self.version} (Debian {self.suite}, {self.root})"


_results: dict[str, GlibcRelease | str] = {}


def native_version() -> str | None:
    """This machine's glibc version ("2.36"), or None when Python does not run on glibc."""
    try:
        banner = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (ValueError, OSError):
        return None
    name, _, version = banner.partition(" ")
    return version if name == "glibc" and version else None


def release_tree(version: str) -> GlibcRelease | None:
    """The release of glibc ``version``: this machine's own, or Debian's fetched and unpacked
    (once per cache directory; later calls and sessions reuse it). None when it cannot be
    fetched here; ``skip_reason`` says why."""
    if version not in _results:
        try:
            _results[version] = _prepare(version)
        except _Unavailable as reason:
            _results[version] = str(reason)
    result = _results[version]
    return result if isinstance(result, GlibcRelease) else None


def skip_reason(version: str) -> str | None:
    """Why glibc ``version`` cannot be had on this machine, or None when it can."""
    if release_tree(version) is not None:
        return None
    return str(_results[version])


def compile_target(
    release: GlibcRelease, source: Path, out: Path, extra_flags: Sequence[str] = ()
) -> Path:
    """Compile one C file for ``release`` into ``out`` (written whole or not at all)."""
    common = ["-O1", "-g0", "-o", f"{out}.{os.getpid()}.tmp", str(source), "-pthread"]
    if release.root is None:
        argv = ["cc", *common, *extra_flags]
    else:
        assert release.loader is not None
        dirs = [str(d) for d in release.library_dirs]
        argv = [
            "cc",
            # Headers (with the multiarch dir) from the tree, and ld reads the absolute paths
            # in the tree's linker scripts (libc.so, libm.so) inside the tree.
            f"--sysroot={release.root}",
            # gcc's own library dirs lead to this machine's /usr/lib/<multiarch> before the
            # sysroot's: the tree's crt files and libraries must be found first.
            f"-B{release.root}/usr/lib/{MULTIARCH}/",
            *(f"-L{d}" for d in dirs),
            f"-Wl,--dynamic-linker={release.loader}",
            f"-Wl,-rpath,{':'.join(dirs)}",  # also right when run without command()
            *common,
            *extra_flags,
        ]
    done = _run(argv, timeout=TOOL_TIMEOUT_SECONDS, what=f"cc for {release}")
    if done.returncode != 0:
        raise GlibcReleaseError(f"cc for {release} failed: {done.stdout.strip()[-2000:]}")
    os.replace(f"{out}.{os.getpid()}.tmp", out)
    return out


def command(release: GlibcRelease, exe: Path, args: Sequence[str] = ()) -> list[str]:
    """The argv that runs ``exe`` on ``release``: through the tree's own loader with its
    libraries first, or directly on this machine's glibc."""
    if release.loader is None:
        return [str(exe), *args]
    path = ":".join(str(d) for d in release.library_dirs)
    return [str(release.loader), "--library-path", path, str(exe), *args]


def build_target(release: GlibcRelease, name: str, *extra_flags: str) -> Path:
    """tests/targets/NAME.c compiled for ``release``, cached by content and flags."""
    source = TARGETS_DIR / f"{name}.c"
    key = source.read_bytes() + " ".join(extra_flags).encode() + str(release.root).encode()
    binary = release.build_dir / f"{name}-{hashlib.sha256(key).hexdigest()[:12]}"
    if not binary.exists():
        compile_target(release, source, binary, extra_flags)
    return binary


# --- preparing a release -------------------------------------------------------------------


def _prepare(version: str) -> GlibcRelease:
    if shutil.which("cc") is None:
        raise _Unavailable("no C compiler (cc) to build the targets")
    if version == native_version():
        build_dir = _private_dir(_cache_root() / f"native-{version}") / "build"
        build_dir.mkdir(mode=0o700, exist_ok=True)
        return GlibcRelease(version=version, suite=None, root=None, build_dir=build_dir)
    suite = SUITES.get(version)
    if suite is None:
        raise GlibcReleaseError(f"no Debian suite known for glibc {version} (SUITES)")
    if platform.machine() != "x86_64":
        raise _Unavailable(f"Debian's amd64 glibc {version} does not run on {platform.machine()}")
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise _Unavailable(f"{tool} is not installed: cannot fetch Debian's glibc {version}")
    home = _private_dir(_cache_root() / suite)
    build_dir = home / "build"
    release = GlibcRelease(version=version, suite=suite, root=home / "tree", build_dir=build_dir)
    marker = home / "complete.json"
    with _locked(home / "lock"):
        if _complete(release, marker):
            return release
        marker.unlink(missing_ok=True)
        for stale in (home / "work", home / "tree.partial", home / "tree", build_dir):
            shutil.rmtree(stale, ignore_errors=True)
        mirror, keyring = _mirror_and_keyring()
        work = home / "work"
        debs = _download(suite, mirror, keyring, work)
        staging = home / "tree.partial"
        staging.mkdir(mode=0o700)
        for deb in debs:
            done = _run(["dpkg-deb", "-x", str(deb), str(staging)], timeout=TOOL_TIMEOUT_SECONDS)
            if done.returncode != 0:
                raise GlibcReleaseError(f"dpkg-deb -x {deb.name} failed: {done.stdout.strip()}")
        _fix_layout(staging)
        staging.rename(release.root)  # type: ignore[arg-type]
        build_dir.mkdir(mode=0o700)
        _verify(release)
        document = {
            "layout": LAYOUT,
            "version": version,
            "suite": suite,
            "packages": sorted(deb.name for deb in debs),
        }
        partial = marker.with_suffix(".tmp")
        partial.write_text(json.dumps(document, indent=1) + "\n")
        os.replace(partial, marker)
        shutil.rmtree(work, ignore_errors=True)  # the tree is the cache; lists and debs go
    return release


def _complete(release: GlibcRelease, marker: Path) -> bool:
    try:
        document = json.loads(marker.read_text())
    except (OSError, ValueError):
        return False
    return (
        document.get("layout") == LAYOUT
        and document.get("version") == release.version
        and release.loader is not None
        and release.loader.exists()
        and release.build_dir.is_dir()
    )


def _cache_root() -> Path:
    configured = os.environ.get("MEMFORENSICS_GLIBC_CACHE")
    if configured:
        return _private_dir(Path(configured))
    shared = Path("/var/tmp")  # kept across reboots, unlike many a /tmp
    base = shared if os.access(shared, os.W_OK | os.X_OK) else Path(tempfile.gettempdir())
    return _private_dir(base / f"memforensics-glibc-releases-{os.getuid()}")


def _private_dir(path: Path) -> Path:
    """``path`` created if need be, and only trusted (libcs are run from it) when it is a
    real directory of ours that nobody else can write to."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise GlibcReleaseError(
            f"{path} is not a directory of uid {os.getuid()} that only it can write to: "
            "not trusted with a libc"
        )
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``, waited for at most LOCK_TIMEOUT_SECONDS."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + LOCK_TIMEOUT_SECONDS
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise GlibcReleaseError(
                        f"{path} stayed locked for {LOCK_TIMEOUT_SECONDS:g} s "
                        "(another test session fetching the same release?)"
                    ) from None
                time.sleep(0.2)
        yield
    finally:
        os.close(fd)  # releases the lock


def _run(
    argv: Sequence[str],
    *,
    timeout: float,
    what: str | None = None,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a tool, output and errors together; a tool that hangs past ``timeout`` is killed
    and raises: _Unavailable for apt-get (a mirror too slow to reach), else an error."""
    try:
        return subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
            cwd=cwd,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        label = what or " ".join(argv[:2])
        if argv[0] == "apt-get":
            raise _Unavailable(f"{label} did not finish within {timeout:g} s") from None
        raise GlibcReleaseError(f"{label} did not finish within {timeout:g} s") from None


# --- the mirror and the download -----------------------------------------------------------


@dataclass(frozen=True)
class AptSource:
    """One ``deb`` entry of the system's apt sources."""

    uri: str
    suites: tuple[str, ...]
    components: tuple[str, ...]
    signed_by: str | None


def _deb822_paragraphs(text: str) -> Iterator[dict[str, str]]:
    paragraph: dict[str, str] = {}
    key = None
    for raw in [*text.splitlines(), ""]:
        if raw.startswith("#"):
            continue
        if not raw.strip():
            if paragraph:
                yield paragraph
            paragraph, key = {}, None
        elif raw[0] in " \t" and key is not None:
            paragraph[key] += "\n" + raw.strip()
        else:
            name, colon, value = raw.partition(":")
            if colon:
                key = name.strip().lower()
                paragraph[key] = value.strip()


def system_sources(
    sources_list: Path = SOURCES_LIST, sources_dir: Path = SOURCES_DIR
) -> list[AptSource]:
    """The ``deb`` entries of the system's apt sources (one-line and deb822), in order."""
    found: list[AptSource] = []
    lists = [sources_list, *sorted(sources_dir.glob("*.list"))]
    for path in lists:
        with contextlib.suppress(OSError):
            for raw in path.read_text().splitlines():
                match = _ONE_LINE_SOURCE.match(raw.split("#", 1)[0].strip())
                if match is None:
                    continue
                options, uri, suite, components = match.groups()
                signed = re.search(r"signed-by=(\S+)", options or "")
                found.append(
                    AptSource(
                        uri=uri,
                        suites=(suite,),
                        components=tuple(components.split()),
                        signed_by=signed.group(1) if signed else None,
                    )
                )
    for path in sorted(sources_dir.glob("*.sources")):
        with contextlib.suppress(OSError):
            for entry in _deb822_paragraphs(path.read_text()):
                if "deb" not in entry.get("types", "").split():
                    continue
                if entry.get("enabled", "yes").lower() == "no":
                    continue
                signed_by = entry.get("signed-by")
                if signed_by and "\n" in signed_by:
                    signed_by = None  # a key embedded in the entry, not a keyring file
                for uri in entry.get("uris", "").split():
                    found.append(
                        AptSource(
                            uri=uri,
                            suites=tuple(entry.get("suites", "").split()),
                            components=tuple(entry.get("components", "").split()),
                            signed_by=signed_by,
                        )
                    )
    return found


def debian_mirror(sources: Sequence[AptSource]) -> AptSource | None:
    """The first entry serving one of Debian's own suites' main component."""
    for source in sources:
        if source.uri.startswith("cdrom:") or "main" not in source.components:
            continue
        if any(suite in DEBIAN_SUITES for suite in source.suites):
            return source
    return None


def _mirror_and_keyring() -> tuple[str, Path | None]:
    source = debian_mirror(system_sources())
    if source is None:
        raise _Unavailable(
            f"no Debian mirror in this machine's apt sources ({SOURCES_LIST}, "
            f"{SOURCES_DIR}/*.list, *.sources): nothing to fetch other glibc releases from"
        )
    # Debian's archive keyring holds the bullseye and trixie signing keys; a machine
    # without it checks with what its own entry names, else with apt's trusted keys.
    keyring: Path | None = ARCHIVE_KEYRING
    if not ARCHIVE_KEYRING.is_file():
        keyring = Path(source.signed_by) if source.signed_by else None
    return source.uri.rstrip("/"), keyring


def _system_proxies() -> list[str]:
    """The proxy lines of the system's apt configuration, which the private one leaves out
    with the rest of /etc/apt/apt.conf.d (post-update hooks, extra index targets)."""
    if shutil.which("apt-config") is None:
        return []
    done = _run(["apt-config", "dump"], timeout=TOOL_TIMEOUT_SECONDS)
    pattern = re.compile(r'^Acquire::[\w-]+::Proxy(::\S+)? ".*";$')
    return [line for line in done.stdout.splitlines() if pattern.match(line)]


def _download(suite: str, mirror: str, keyring: Path | None, work: Path) -> list[Path]:
    """The .deb files of PACKAGES from ``suite``, through a private apt configuration."""
    apt = work / "apt"
    for sub in (
        "state/lists/partial",
        "cache/archives/partial",
        "etc/apt.conf.d",
        "etc/sources.list.d",
        "etc/preferences.d",
        "etc/auth.conf.d",
        "etc/trusted.gpg.d",
        "log",
    ):
        (apt / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
    (apt / "state/status").write_text("")
    options = f"[signed-by={keyring}] " if keyring is not None else ""
    (apt / "etc/sources.list").write_text(f"deb {options}{mirror} {suite} main\n")
    settings = {
        # Read first (APT_CONFIG), so the system's config parts and main file are never read.
        "Dir::Etc::Main": "/dev/null",
        "Dir::Etc::Parts": apt / "etc/apt.conf.d",
        "Dir::Etc::SourceList": apt / "etc/sources.list",
        "Dir::Etc::SourceParts": apt / "etc/sources.list.d",
        "Dir::Etc::Preferences": apt / "etc/preferences",
        "Dir::Etc::PreferencesParts": apt / "etc/preferences.d",
        "Dir::Etc::netrc": apt / "etc/auth.conf",
        "Dir::Etc::netrcparts": apt / "etc/auth.conf.d",
        "Dir::Etc::Trusted": apt / "etc/trusted.gpg",
        "Dir::Etc::TrustedParts": apt / "etc/trusted.gpg.d",
        "Dir::State": apt / "state",
        "Dir::State::status": apt / "state/status",
        "Dir::Cache": apt / "cache",
        "Dir::Log": apt / "log",
        "APT::Architecture": "amd64",
        "APT::Architectures": "amd64",
        "Acquire::Languages": "none",
        "Acquire::Retries": "2",
        "Acquire::http::Timeout": "30",
        "Acquire::https::Timeout": "30",
    }
    if os.geteuid() == 0:
        # As root apt fetches as the _apt user, who cannot write into these private 0700
        # directories; the download is checked against the signed lists all the same.
        settings["APT::Sandbox::User"] = "root"
    lines = [f'{key} "{value}";' for key, value in settings.items()]
    conf = apt / "apt.conf"
    conf.write_text("\n".join([*lines, *_system_proxies()]) + "\n")
    env = dict(os.environ, APT_CONFIG=str(conf), LC_ALL="C", LANG="C")

    def apt_get(*args: str, cwd: Path | None = None) -> None:
        what = f"apt-get {args[0]} ({mirror} {suite})"
        done = _run(
            ["apt-get", "-q", *args], timeout=APT_TIMEOUT_SECONDS, what=what, cwd=cwd, env=env
        )
        output = done.stdout
        if done.returncode == 0 and not _APT_PROBLEM.search(output):
            return
        tail = output.strip()[-1500:]
        if _UNTRUSTED.search(output):
            raise GlibcReleaseError(f"{what}: the signature check with {keyring} failed: {tail}")
        unreachable = _UNREACHABLE.search(output)
        if unreachable:
            line = output[output.rfind("\n", 0, unreachable.start()) + 1 :].split("\n", 1)[0]
            raise _Unavailable(f"{what}: the mirror cannot be reached: {line.strip()}")
        raise GlibcReleaseError(f"{what} failed: {tail}")

    apt_get("update")
    debs = work / "debs"
    debs.mkdir(mode=0o700)
    apt_get("download", *PACKAGES, cwd=debs)
    found = sorted(debs.glob("*.deb"))
    names = sorted(deb.name.split("_", 1)[0] for deb in found)
    if names != sorted(PACKAGES):
        raise GlibcReleaseError(f"apt-get download gave {names}, not {sorted(PACKAGES)}")
    return found


# --- the tree ------------------------------------------------------------------------------


def _fix_layout(tree: Path) -> None:
    """Make the unpacked packages a tree that works where it lies.

    Merged-/usr releases (2.41) ship /lib and /lib64 as links made by base-files, not by
    libc6: they are made here. Absolute symlinks (the -dev package's libpthread.so, 2.31's
    /lib64 loader) point at this machine's files: they are pointed into the tree instead.
    """
    for name in ("lib", "lib64"):
        top, usr = tree / name, tree / "usr" / name
        if not top.exists() and not top.is_symlink() and usr.is_dir():
            top.symlink_to(Path("usr") / name)
    for dirpath, dirnames, filenames in os.walk(tree):
        for name in [*dirnames, *filenames]:
            link = Path(dirpath) / name
            if not link.is_symlink():
                continue
            target = os.readlink(link)
            if target.startswith("/"):
                link.unlink()
                link.symlink_to(os.path.relpath(tree / target.lstrip("/"), link.parent))
    loader = tree / "lib64" / LOADER
    libc = tree / "lib" / MULTIARCH / "libc.so.6"
    for needed in (loader, libc, tree / "usr" / "include" / "stdio.h"):
        if not needed.exists():
            raise GlibcReleaseError(f"the unpacked packages have no {needed.relative_to(tree)}")


def _verify(release: GlibcRelease) -> None:
    """A program built against the tree and run through its loader reports the release's
    version and maps the tree's libc, not this machine's."""
    source = release.build_dir / "libc_version.c"
    source.write_text(_VERSION_PROGRAM)
    exe = compile_target(release, source, release.build_dir / "libc_version")
    done = _run(command(release, exe), timeout=RUN_TIMEOUT_SECONDS)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or len(lines) < 2 or lines[0] != release.version:
        raise GlibcReleaseError(
            f"a program built for {release} reports {done.stdout.strip()!r} "
            f"(exit {done.returncode}), not glibc {release.version}"
        )
    if not release.owns(lines[1].strip()):
        raise GlibcReleaseError(f"a program built for {release} mapped {lines[1].strip()}")
