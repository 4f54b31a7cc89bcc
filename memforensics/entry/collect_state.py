"""The cursor `collect` keeps between runs: cumulative OOM kill counts and the kills seen.

A kill must be counted once however often the log is read and however late an entry
arrives, so each run reads from a little before the previous run (``OVERLAP``) and
remembers the keys of the kills inside that window. The state is a small JSON file written
through a temporary file and a rename, so a run killed mid-write leaves the old state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from memforensics.entry import state_dir
from memforensics.errors import ToolingError, UnsafeDirectoryError
from memforensics.model.collect import OomKillCount, OomKillKey
from memforensics.model.oom import OomEvent
from memforensics.sources.files.atomic_file import write_atomically
from memforensics.sources.proc.cgroup import container_identity

# Where the state lives unless told otherwise (see default_state_dir).
STATE_DIR_ENV = state_dir.STATE_DIR_ENV
SYSTEM_STATE_DIR = state_dir.SYSTEM_STATE_DIR
STATE_FILE = "collect-state.json"
_WRITABLE_HINT = "choose a writable state directory"
LOCK_FILE = "collect-state.lock"
LOCK_TIMEOUT_SECONDS = 30.0
SCHEMA = "memforensics/collect-state/1"
# Read back this far before the newest kill seen: journal entries and kmsg-derived times
# can arrive out of order by a little; the keys remembered for this window stop recounts.
OVERLAP = timedelta(minutes=10)
# A counter with no new kill for this long is dropped, so that per-container series (a new
# container ID on every restart) do not pile up for ever.
RETENTION = timedelta(days=7)
# Bound on remembered keys of kills the log gives no wall-clock time for.
_MAX_UNTIMED_KEYS = 1000


@dataclass
class CollectState:
    """Counts by key, the cursor time, and the keys of the kills at or after it."""

    counts: dict[OomKillKey, OomKillCount] = field(default_factory=dict)
    cursor: datetime | None = None  # None: no run yet (the next one is a baseline)
    seen_keys: set[str] = field(default_factory=set)
    untimed_keys: list[str] = field(default_factory=list)
    created: datetime | None = None

    @property
    def since(self) -> datetime | None:
        """Where the next read of the log starts."""
        return self.cursor - OVERLAP if self.cursor is not None else None


def default_state_dir(environ: Mapping[str, str] | None = None, euid: int | None = None) -> Path:
    """Where `collect` keeps its state when no directory is given (state_dir.py holds the
    rule, importable without this module)."""
    return state_dir.default_state_dir(environ, euid)


def prepare_state_dir(directory: Path) -> Path:
    """Create ``directory`` (mode 0700, parents as the umask says) or check the existing one:
    it must be a directory owned by this user and not world-writable, or UnsafeDirectoryError
    (exit 4) says why. Returns ``directory``."""
    try:
        directory.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        pass
    except OSError as exc:
        raise ToolingError(
            f"cannot create the state directory {directory}: {exc.strerror}",
            hint=_WRITABLE_HINT,
        ) from exc
    else:
        with contextlib.suppress(OSError):
            os.chmod(directory, 0o700)  # whatever the umask took away or left
    try:
        info = os.stat(directory)
    except OSError as exc:
        raise ToolingError(
            f"cannot use the state directory {directory}: {exc.strerror}", hint=_WRITABLE_HINT
        ) from exc
    if not stat.S_ISDIR(info.st_mode):
        raise ToolingError(f"the state directory {directory} is not a directory")
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid():
        raise UnsafeDirectoryError(
            f"the state directory {directory} is owned by uid {info.st_uid}, not by this user "
            f"(uid {os.geteuid()}): its OOM counts could be forged",
            hint=f"chown it to this user and chmod 700 {directory}, or choose another",
        )
    if mode & stat.S_IWOTH:
        raise UnsafeDirectoryError(
            f"the state directory {directory} is world-writable (mode {mode:04o}): "
            "its OOM counts could be forged",
            hint=f"chmod 700 {directory}, or choose another",
        )
    return directory


def event_key(event: OomEvent) -> str:
    """What identifies one kill in any source: time (UTC) or uptime, boot, pid, name, killer.

    The time comes first so that the window of remembered keys can be cut by it.
    """
    when = _utc(event.time).astimezone(timezone.utc).isoformat() if event.time else ""
    uptime = f"{event.uptime_seconds:.6f}" if event.uptime_seconds is not None else ""
    return "|".join(
        (when, event.boot_id or "", uptime, str(event.pid or ""), event.process or "", event.killer)
    )


def _key_time(key: str) -> datetime | None:
    stamp = key.split("|", 1)[0]
    try:
        return datetime.fromisoformat(stamp) if stamp else None
    except ValueError:
        return None


def kill_key(event: OomEvent) -> OomKillKey:
    """The counter labels of one kill: process name, scope or killer, container identity."""
    identity = container_identity(event.cgroup)
    return OomKillKey(
        process=event.process or "unknown",
        scope=event.scope or event.killer,
        pod_uid=identity.pod_uid or "",
        container_id=identity.container_id or "",
    )


def _utc(moment: datetime) -> datetime:
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def count_new_kills(
    state: CollectState, events: Iterable[OomEvent], *, now: datetime
) -> tuple[CollectState, int]:
    """Add the kills not counted before to the state; returns the new state and how many.

    On the first run (no cursor) nothing up to ``now`` is counted: the log's history is the
    `oom` command's job, and counting it would make every old kill look new to an alert.
    """
    baseline = state.cursor is None
    since = state.since
    counts = dict(state.counts)
    new = 0
    # The log was read up to now; what arrives later dated before it falls in OVERLAP.
    cursor = now
    timed: list[tuple[datetime, str]] = []
    untimed = list(state.untimed_keys)
    untimed_seen = set(untimed)
    for event in events:
        key = event_key(event)
        if event.time is None:
            if key in untimed_seen:
                continue
            untimed.append(key)
            untimed_seen.add(key)
            when = None
        else:
            when = _utc(event.time)
            timed.append((when, key))
            if key in state.seen_keys or (since is not None and when < since):
                continue
        if baseline and (when is None or when <= now):
            continue  # history from before collect was set up
        labels = kill_key(event)
        previous = counts.get(labels)
        last_times = [t for t in (when, previous.last_time if previous else None) if t]
        counts[labels] = OomKillCount(
            labels, (previous.count if previous else 0) + 1, max(last_times, default=now)
        )
        new += 1
    window_start = cursor - OVERLAP
    seen = {key for key in state.seen_keys if (_key_time(key) or cursor) >= window_start}
    seen.update(key for when, key in timed if when >= window_start)
    expired = now - RETENTION
    kept = {
        key: entry
        for key, entry in counts.items()
        if entry.last_time is None or _utc(entry.last_time) >= expired
    }
    return (
        replace(
            state,
            counts=kept,
            cursor=cursor,
            seen_keys=seen,
            untimed_keys=untimed[-_MAX_UNTIMED_KEYS:],
            created=state.created or now,
        ),
        new,
    )


def _iso(moment: datetime | None) -> str | None:
    return moment.astimezone(timezone.utc).isoformat() if moment is not None else None


def _time(value: Any) -> datetime | None:
    return _utc(datetime.fromisoformat(value)) if isinstance(value, str) else None


def state_json(state: CollectState) -> dict[str, Any]:
    """The state as the JSON document kept in the state directory."""
    return {
        "schema": SCHEMA,
        "created": _iso(state.created),
        "oom": {
            "cursor": _iso(state.cursor),
            "seen_keys": sorted(state.seen_keys),
            "untimed_keys": state.untimed_keys,
            "kills": [
                {
                    "process": entry.key.process,
                    "scope": entry.key.scope,
                    "pod_uid": entry.key.pod_uid,
                    "container_id": entry.key.container_id,
                    "count": entry.count,
                    "last_time": _iso(entry.last_time),
                }
                for entry in sorted(state.counts.values(), key=lambda e: _sort_key(e.key))
            ],
        },
    }


def _sort_key(key: OomKillKey) -> tuple[str, str, str, str]:
    return (key.process, key.scope, key.pod_uid, key.container_id)


def state_from_json(document: Any) -> CollectState:
    """Parse a state document; ValueError when it is not one."""
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise ValueError("not a memforensics collect state")
    oom = document.get("oom") or {}
    counts: dict[OomKillKey, OomKillCount] = {}
    for row in oom.get("kills", []):
        key = OomKillKey(
            process=str(row["process"]),
            scope=str(row["scope"]),
            pod_uid=str(row.get("pod_uid", "")),
            container_id=str(row.get("container_id", "")),
        )
        count = int(row["count"])
        if count < 0:
            raise ValueError("negative kill count")
        counts[key] = OomKillCount(key, count, _time(row.get("last_time")))
    return CollectState(
        counts=counts,
        cursor=_time(oom.get("cursor")),
        seen_keys={str(k) for k in oom.get("seen_keys", [])},
        untimed_keys=[str(k) for k in oom.get("untimed_keys", [])],
        created=_time(document.get("created")),
    )


def load_state(directory: Path) -> tuple[CollectState, str | None]:
    """The saved state, or a fresh one plus a note saying why the saved one was not used."""
    path = directory / STATE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return CollectState(), None
    except OSError as exc:
        raise ToolingError(
            f"cannot read {path}: {exc.strerror}", hint="check the state directory's permissions"
        ) from exc
    try:
        return state_from_json(json.loads(text)), None
    except (ValueError, KeyError, TypeError) as exc:
        # Kept aside for a person to look at; counting restarts (Prometheus sees a reset).
        aside = path.with_name(f"{path.name}.corrupt")
        with contextlib.suppress(OSError):
            os.replace(path, aside)
        return CollectState(), f"state file {path} was unreadable ({exc}); moved to {aside}"


def save_state(directory: Path, state: CollectState) -> None:
    """Write the state atomically: a temporary file in the same directory, then a rename."""
    path = directory / STATE_FILE
    data = json.dumps(state_json(state), indent=1).encode()
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ToolingError(f"cannot write {path}: {exc.strerror}", hint=_WRITABLE_HINT) from exc
    write_atomically(path, data, hint=_WRITABLE_HINT, mode=0o600)


@contextlib.contextmanager
def state_lock(directory: Path, timeout_seconds: float = LOCK_TIMEOUT_SECONDS) -> Iterator[None]:
    """Hold the state directory's lock: a manual run beside the timer's must not count a
    kill twice or lose one (read-modify-write of the state)."""
    path = directory / LOCK_FILE
    prepare_state_dir(directory)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise ToolingError(
            f"cannot open {path}: {exc.strerror}", hint="choose a writable state directory"
        ) from exc
    try:
        deadline = time.monotonic() + timeout_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ToolingError(
                        f"another collect run holds {path} for over {timeout_seconds:g} s"
                    ) from None
                time.sleep(0.05)
        yield
    finally:
        os.close(fd)  # closing releases the lock
