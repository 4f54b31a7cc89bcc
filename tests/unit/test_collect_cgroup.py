"""Container identity from cgroup paths: the kubelet's two drivers, docker, podman, none."""

from __future__ import annotations

import os

import pytest

from memforensics.model.collect import ContainerIdentity
from memforensics.sources.proc.cgroup import (
    container_identity,
    process_cgroup_path,
    read_container_identity,
)

CID = "ef807430361e6e82b45db92e2e9b6fbec98f419b12c591e655c1a725565e73a8"
POD = "fbdfe8e3-1c87-4ff2-907c-b2ec8e25d012"


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        # cgroupfs driver (cadvisor issue #2417's oom-kill line)
        (f"/kubepods/burstable/pod{POD}/{CID}", ContainerIdentity(POD, CID)),
        # systemd driver: underscores in the slice name become the API's dashes
        (
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope",
            ContainerIdentity(POD, CID),
        ),
        # the pod's own cgroup (oom_memcg of a pod-level limit): no container
        (f"/kubepods/besteffort/pod{POD}", ContainerIdentity(POD, None)),
        (f"/system.slice/docker-{CID}.scope", ContainerIdentity(None, CID)),
        (f"/docker/{CID}", ContainerIdentity(None, CID)),
        (f"/machine.slice/libpod-{CID}.scope/container", ContainerIdentity(None, CID)),
        ("/system.slice/postgresql@15-main.service", ContainerIdentity()),
        ("/user.slice/user-1000.slice/session-3.scope", ContainerIdentity()),
        ("/", ContainerIdentity()),
        (None, ContainerIdentity()),
        # a service whose name merely contains hex is not a container
        ("/system.slice/abc123.service", ContainerIdentity()),
    ],
)
def test_identity_from_paths(path: str | None, expected: ContainerIdentity) -> None:
    assert container_identity(path) == expected


def test_v1_prefers_the_memory_controller() -> None:
    """The OOM killer names the memory cgroup: that is the one that must match its labels."""
    text = (
        "12:pids:/system.slice/x.service\n"
        f"9:memory:/kubepods/burstable/pod{POD}/{CID}\n"
        "1:name=systemd:/system.slice/x.service\n"
        "0::/system.slice/x.service\n"
    )
    assert process_cgroup_path(text) == f"/kubepods/burstable/pod{POD}/{CID}"


def test_v2_single_line() -> None:
    assert process_cgroup_path("0::/system.slice/nginx.service\n") == "/system.slice/nginx.service"


def test_own_process_reads_without_error() -> None:
    """This very test process: /proc/self/cgroup is readable and yields some identity."""
    identity = read_container_identity(os.getpid())
    assert isinstance(identity, ContainerIdentity)


def test_vanished_process_has_no_identity() -> None:
    assert read_container_identity(2**22 + 12345) == ContainerIdentity()
