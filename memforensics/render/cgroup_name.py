"""A short readable name for a cgroup path in narrow tables: pod/container, or the unit name."""

from __future__ import annotations

from memforensics.sources.proc.cgroup import identify

_UNIT_SUFFIXES = (".service", ".scope", ".slice", ".socket", ".mount", ".swap")


def short_cgroup(path: str | None) -> str | None:
    """A readable name for a narrow column, at most 12 characters a line: a pod and its
    container on two lines (``pod 1a2b3c4d`` / ``0123456789ab``, the id as `docker ps` and
    `crictl ps` shorten it), ``container`` / id, the systemd unit name, or the last path
    component."""
    if not path:
        return path
    identity = identify(path)
    if identity.pod_uid is not None:
        pod = f"pod {identity.pod_uid[:8]}"
        return f"{pod}\n{identity.container_id[:12]}" if identity.container_id else pod
    if identity.container_id is not None:
        return f"container\n{identity.container_id[:12]}"
    if path == "/":
        return path
    last = path.rstrip("/").rsplit("/", 1)[-1]
    if last.endswith(_UNIT_SUFFIXES):
        # systemd escapes "-" inside unit names as \x2d; show the name as the unit is known.
        return last.replace("\\x2d", "-")
    return last
