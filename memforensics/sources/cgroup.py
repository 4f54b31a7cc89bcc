"""Container identity from a cgroup path: Kubernetes pod UID and runtime container ID.

The kubelet names a pod's cgroup after its UID in both drivers: cgroupfs
``/kubepods/burstable/pod<uid>/<id>`` and systemd
``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/
cri-containerd-<id>.scope`` (also ``docker-``, ``crio-``, podman's ``libpod-``). The kernel's
``oom-kill:`` line carries the same path as ``task_memcg``, so a target and a kill map to the
same labels without asking any API (and without the namespace, which no cgroup path holds).
"""

from __future__ import annotations

import re
from pathlib import Path

from memforensics.model.collect import ContainerIdentity

# A 64-hex container ID as a whole path component or after a runtime prefix in a .scope.
_CONTAINER_RE = re.compile(
    r"(?:^|/)(?:(?:cri-containerd|docker|crio|libpod|containerd)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?(?=/|$)"
)
# "pod" + UID, either with dashes (cgroupfs) or underscores (systemd slice names).
_POD_RE = re.compile(
    r"pod(?P<uid>[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})"
    r"(?:\.slice)?(?=/|$)"
)


def container_identity(cgroup_path: str | None) -> ContainerIdentity:
    """The pod UID and container ID named in ``cgroup_path`` (either may be None)."""
    if not cgroup_path:
        return ContainerIdentity()
    pod = _POD_RE.search(cgroup_path)
    # The innermost container ID wins: nested runtimes (kind, docker-in-docker) put theirs last.
    containers = list(_CONTAINER_RE.finditer(cgroup_path))
    return ContainerIdentity(
        pod_uid=pod.group("uid").replace("_", "-") if pod else None,
        container_id=containers[-1].group("id") if containers else None,
    )


def process_cgroup_path(text: str) -> str | None:
    """The cgroup path of a process from the text of /proc/PID/cgroup.

    cgroup v2 has one line ``0::/path``; v1 has one line per hierarchy, and the memory
    controller's is the one the OOM killer names, so it is preferred.
    """
    unified: str | None = None
    fallback: str | None = None
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if "memory" in controllers.split(","):
            return path
        if hierarchy == "0" and not controllers:
            unified = path
        elif fallback is None:
            fallback = path
    return unified if unified is not None else fallback


def read_container_identity(pid: int) -> ContainerIdentity:
    """Container identity of a running process; empty when it has none or is gone."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ContainerIdentity()
    return container_identity(process_cgroup_path(text))
