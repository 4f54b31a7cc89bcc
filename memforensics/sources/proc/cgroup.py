"""Who a cgroup path belongs to: Kubernetes pod UID, QoS class and runtime container ID.

The kubelet names a pod's cgroup after its UID in both drivers: cgroupfs
``/kubepods/burstable/pod<uid>/<id>`` and systemd
``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/
cri-containerd-<id>.scope`` (also ``docker-``, ``crio-``, podman's ``libpod-``). The kernel's
``oom-kill:`` line carries the same path as ``task_memcg``, so a target and a kill map to the
same labels without asking any API (and without the namespace, which no cgroup path holds).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Imported where used: the OOM scan identifies cgroups without the collect model.
    from memforensics.model.collect import ContainerIdentity

_POD_RE = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?:\.slice)?$"
)
# "kubepods-burstable.slice" and the pod's own "kubepods-burstable-pod<uid>.slice" (systemd
# driver); the cgroupfs driver's "/kubepods/burstable/" is two components.
_QOS_RE = re.compile(r"^kubepods-(burstable|besteffort)(?:\.slice$|-pod)")
# The container's own cgroup; "crio-conmon-<id>" is CRI-O's monitor process, not the container.
_CONTAINER_RE = re.compile(
    r"^(?:(?:cri-containerd|crio|docker|libpod)-)?([0-9a-f]{64})(?:\.scope)?$"
)
_COLON_CONTAINER_RE = re.compile(r":(?:cri-containerd|crio|docker):([0-9a-f]{64})$")


@dataclass(frozen=True, slots=True)
class CgroupIdentity:
    """What a cgroup path says about its owner; ``None`` where it says nothing."""

    pod_uid: str | None = None
    container_id: str | None = None
    qos_class: str | None = None
    kubernetes: bool = False


def identify(path: str | None) -> CgroupIdentity:
    """Pod uid (dashed), container id (64 hex), QoS class from one cgroup path."""
    if not path:
        return CgroupIdentity()
    components = [part for part in path.split("/") if part]
    pod_uid = container_id = qos = None
    kubernetes = any(part.startswith("kubepods") for part in components)
    previous = ""
    for component in components:
        part = component
        if previous == "kubepods" and part in ("burstable", "besteffort"):
            qos = part  # cgroupfs driver: /kubepods/<qos>/pod<uid>/<container>
        previous = part
        colon = _COLON_CONTAINER_RE.search(part)
        if colon:
            container_id = colon.group(1)
            part = part[: colon.start()]
        pod = _POD_RE.search(part)
        if pod and (kubernetes or part.startswith("pod")):
            pod_uid = pod.group(1).replace("_", "-")
            kubernetes = True
        qos_match = _QOS_RE.match(part)
        if qos_match:
            qos = qos_match.group(1)
        container = _CONTAINER_RE.match(part)
        if container:
            container_id = container.group(1)
    if kubernetes and pod_uid is not None and qos is None:
        qos = "guaranteed"  # a Guaranteed pod sits right under kubepods, with no QoS level
    return CgroupIdentity(pod_uid, container_id, qos, kubernetes)


def container_identity(cgroup_path: str | None) -> ContainerIdentity:
    """The pod UID and container ID named in ``cgroup_path`` (either may be None)."""
    from memforensics.model.collect import ContainerIdentity

    identity = identify(cgroup_path)
    return ContainerIdentity(pod_uid=identity.pod_uid, container_id=identity.container_id)


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
        return container_identity(None)
    return container_identity(process_cgroup_path(text))
