"""Who a cgroup path belongs to: Kubernetes pod and container, QoS class, Docker container,
systemd unit; and a short readable name for narrow tables.

Paths as the kernel prints them (``task_memcg=``, ``oom_memcg=``, ``Task in``), cgroup v1 and
v2, with the cgroupfs driver (``/kubepods/burstable/pod<uid>/<id>``) or the systemd driver
(``/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_with_underscores>.slice/
cri-containerd-<id>.scope``), containerd's v1 systemd form (``…pod<uid>.slice:cri-containerd:
<id>``), CRI-O (``crio-<id>.scope``), Docker (``/docker/<id>``, ``docker-<id>.scope``) and
podman (``libpod-<id>.scope``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
_UNIT_SUFFIXES = (".service", ".scope", ".slice", ".socket", ".mount", ".swap")


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
