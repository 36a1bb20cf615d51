"""Attribution: cgroup id / path / pid → pod, for every cgroup driver × runtime × QoS."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from node_agent.attribution import SYSTEM, Attributor, PodIdentity, parse_cgroup_path
from node_agent.pods import StaticPodDirectory
from node_agent.probes.base import ProbeContext
from tests.node_agent.own_cgroups import (
    cgroup_tree,
    kernel_cgroup_id,
    process_in,
    unique_name,
)

UID = "0f5c3b8e-6a1d-4c2e-9b7a-3d2e1f0a9b8c"
CONTAINER = "4a3f0d6a1b2c3d4e5f60718293a4b5c6d7e8f9012345678901234567890abcde"
assert len(CONTAINER) == 64


def systemd_pod_dir(qos: str, uid: str) -> str:
    underscored = uid.replace("-", "_")
    if qos == "guaranteed":
        return f"kubepods.slice/kubepods-pod{underscored}.slice"
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{underscored}.slice"


def cgroupfs_pod_dir(qos: str, uid: str) -> str:
    return f"kubepods/pod{uid}" if qos == "guaranteed" else f"kubepods/{qos}/pod{uid}"


# Container cgroup names as each runtime creates them under each kubelet cgroup driver.
SYSTEMD_CONTAINER = {
    "containerd": f"cri-containerd-{CONTAINER}.scope",
    "crio": f"crio-{CONTAINER}.scope",
    "docker": f"docker-{CONTAINER}.scope",
}
CGROUPFS_CONTAINER = {"containerd": CONTAINER, "crio": f"crio-{CONTAINER}", "docker": CONTAINER}
# Under cgroupfs, containerd and Docker both use the bare id, so the runtime is unknown.
CGROUPFS_RUNTIME = {"containerd": "", "crio": "crio", "docker": ""}


@dataclass(frozen=True)
class Case:
    driver: str
    runtime: str
    qos: str

    @property
    def pod_dir(self) -> str:
        if self.driver == "systemd":
            return systemd_pod_dir(self.qos, UID)
        return cgroupfs_pod_dir(self.qos, UID)

    @property
    def container_dir(self) -> str:
        names = SYSTEMD_CONTAINER if self.driver == "systemd" else CGROUPFS_CONTAINER
        return f"{self.pod_dir}/{names[self.runtime]}"

    @property
    def expected_runtime(self) -> str:
        return self.runtime if self.driver == "systemd" else CGROUPFS_RUNTIME[self.runtime]


CASES = [
    Case(driver, runtime, qos)
    for driver in ("systemd", "cgroupfs")
    for runtime in ("containerd", "crio", "docker")
    for qos in ("guaranteed", "burstable", "besteffort")
]
PREFIXES = ["", "intf-demo/node-a"]

# Cgroups a node has besides pods; all of them are the system bucket.
SYSTEM_DIRS = [
    "system.slice/containerd.service",
    "system.slice/kubelet.service",
    "kubepods.slice",
    "kubepods.slice/kubepods-burstable.slice",
    "kubepods",
    "kubepods/besteffort",
    "user.slice/user-0.slice/session-1.scope",
    # "pod<uid>" outside kubepods is not a pod cgroup
    f"other/pod{UID}",
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.driver}-{c.runtime}-{c.qos}")
def test_parse_cgroup_path_for_every_driver_runtime_qos(case: Case) -> None:
    for prefix in ("", "/intf-demo/node-a", "/kubelet.slice/kubelet-kubepods.slice"):
        assert parse_cgroup_path(f"{prefix}/{case.container_dir}") == (
            UID,
            case.qos,
            CONTAINER,
            case.expected_runtime,
        )
        assert parse_cgroup_path(f"{prefix}/{case.pod_dir}") == (UID, case.qos, "", "")
        # a cgroup the container made for itself belongs to the container
        assert parse_cgroup_path(f"{prefix}/{case.container_dir}/init.scope") == (
            UID,
            case.qos,
            CONTAINER,
            case.expected_runtime,
        )


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", None),
        ("/system.slice/containerd.service", None),
        ("/kubepods.slice/kubepods-besteffort.slice", None),
        ("/kubepods/burstable", None),
        (f"/other/pod{UID}/{CONTAINER}", None),
        (f"/kubepods/burstable/pod{UID}/not-a-container", (UID, "burstable", "", "")),
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
            f"{UID.replace('-', '_')}.slice/crio-conmon-{CONTAINER}.scope",
            (UID, "burstable", "", "crio"),
        ),
        # kubelet on a node with the kubelet's own --cgroup-root=/kubelet (systemd driver)
        (
            f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
            f"kubelet-kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
            f"cri-containerd-{CONTAINER}.scope",
            (UID, "besteffort", CONTAINER, "containerd"),
        ),
        # UIDs are case-insensitive; the kubelet writes them in lower case
        (f"/kubepods/pod{UID.upper()}", (UID, "guaranteed", "", "")),
    ],
)
def test_parse_cgroup_path_edge_cases(
    path: str, expected: tuple[str, str, str, str] | None
) -> None:
    assert parse_cgroup_path(path) == expected


@pytest.mark.parametrize("prefix", PREFIXES, ids=["no-prefix", "prefix"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.driver}-{c.runtime}-{c.qos}")
def test_attributor_over_fake_cgroupfs_tree(tmp_path: Path, case: Case, prefix: str) -> None:
    root = tmp_path / prefix if prefix else tmp_path
    for relative in [case.container_dir, *SYSTEM_DIRS]:
        (root / relative).mkdir(parents=True, exist_ok=True)
    directory = StaticPodDirectory({UID: ("team-a", "trainer-0")})
    ctx = ProbeContext(cgroup_root="/" + prefix, cgroup_v2_mount=str(tmp_path))
    attributor = Attributor(ctx, directory)

    container = attributor.by_id(os.stat(root / case.container_dir).st_ino)
    assert container == PodIdentity(
        uid=UID, namespace="team-a", name="trainer-0", qos=case.qos, container_id=CONTAINER
    )
    pod = attributor.by_id(os.stat(root / case.pod_dir).st_ino)
    assert pod == PodIdentity(uid=UID, namespace="team-a", name="trainer-0", qos=case.qos)
    for relative in SYSTEM_DIRS:
        assert attributor.by_id(os.stat(root / relative).st_ino) is SYSTEM, relative
    expected_path = f"/{prefix}/{case.container_dir}" if prefix else f"/{case.container_dir}"
    assert attributor.path_of(os.stat(root / case.container_dir).st_ino) == expected_path


def test_unknown_uid_is_named_by_uid(tmp_path: Path) -> None:
    container_dir = tmp_path / Case("systemd", "containerd", "burstable").container_dir
    container_dir.mkdir(parents=True)
    attributor = Attributor(ProbeContext(cgroup_v2_mount=str(tmp_path)), StaticPodDirectory())
    identity = attributor.by_id(os.stat(container_dir).st_ino)
    assert (identity.uid, identity.namespace, identity.name) == (UID, "", UID)


def test_cgroups_outside_cgroup_root_are_not_indexed(tmp_path: Path) -> None:
    inside = tmp_path / "intf-demo" / Case("cgroupfs", "crio", "besteffort").container_dir
    outside = tmp_path / Case("cgroupfs", "crio", "besteffort").container_dir
    inside.mkdir(parents=True)
    outside.mkdir(parents=True)
    ctx = ProbeContext(cgroup_root="/intf-demo", cgroup_v2_mount=str(tmp_path))
    attributor = Attributor(ctx, StaticPodDirectory())
    assert attributor.by_id(os.stat(inside).st_ino).uid == UID
    assert attributor.by_id(os.stat(outside).st_ino) is SYSTEM


def test_index_refreshes_on_miss_at_most_once_per_interval(tmp_path: Path) -> None:
    now = [100.0]
    ctx = ProbeContext(cgroup_v2_mount=str(tmp_path))
    attributor = Attributor(ctx, StaticPodDirectory(), refresh_interval_s=1.0, clock=lambda: now[0])
    assert attributor.by_id(12345) is SYSTEM  # first miss walks
    assert attributor.walks == 1
    late = tmp_path / Case("systemd", "docker", "guaranteed").container_dir
    late.mkdir(parents=True)
    late_id = os.stat(late).st_ino
    now[0] += 0.5
    assert attributor.by_id(late_id) is SYSTEM  # within the interval: no second walk
    assert attributor.walks == 1
    now[0] += 0.6
    assert attributor.by_id(late_id).container_id == CONTAINER  # refreshed on miss
    assert attributor.walks == 2
    assert attributor.by_id(late_id).qos == "guaranteed"  # a hit does not walk
    assert attributor.walks == 2


def test_by_pid_reads_proc_cgroup(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    v1_only = Case("cgroupfs", "docker", "burstable")
    v2 = Case("systemd", "containerd", "besteffort")
    lines = {
        101: f"4:memory:/{v1_only.container_dir}\n1:cpu:/{v1_only.container_dir}\n0::/\n",
        102: f"4:memory:/{v2.container_dir}\n0::/intf-demo/{v2.container_dir}\n",
        103: "4:memory:/system.slice/sshd.service\n0::/system.slice/sshd.service\n",
    }
    for pid, text in lines.items():
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cgroup").write_text(text)
    ctx = ProbeContext(cgroup_v2_mount=str(tmp_path), proc_root=str(proc))
    attributor = Attributor(ctx, StaticPodDirectory({UID: ("ns", "web")}))
    assert attributor.by_pid(101) == PodIdentity(UID, "ns", "web", "burstable", CONTAINER)
    assert attributor.by_pid(102) == PodIdentity(UID, "ns", "web", "besteffort", CONTAINER)
    assert attributor.by_pid(103) is SYSTEM
    assert attributor.by_pid(999999) is SYSTEM  # exited


V2_MOUNT = "/sys/fs/cgroup/unified"


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.path.exists(f"{V2_MOUNT}/cgroup.procs"),
    reason="needs root and cgroup v2 at /sys/fs/cgroup/unified",
)
def test_real_cgroup_by_id_and_by_pid() -> None:
    """A real v2 cgroup: the kernel's cgroup id (name_to_handle_at) maps to the pod."""
    top = unique_name()
    case = Case("systemd", "containerd", "burstable")
    with cgroup_tree(V2_MOUNT, f"{top}/{case.container_dir}") as container_dir:
        cgroup_id = kernel_cgroup_id(str(container_dir))
        ctx = ProbeContext(cgroup_root=f"/{top}", cgroup_v2_mount=V2_MOUNT)
        attributor = Attributor(ctx, StaticPodDirectory({UID: ("gpu", "train-1")}))
        assert attributor.by_id(cgroup_id) == PodIdentity(
            UID, "gpu", "train-1", "burstable", CONTAINER
        )
        assert attributor.path_of(cgroup_id) == f"/{top}/{case.container_dir}"
        sibling_id = kernel_cgroup_id(str(Path(V2_MOUNT) / top))
        assert attributor.by_id(sibling_id) is SYSTEM
        with process_in([container_dir / "cgroup.procs"], "exec sleep 60") as proc:
            assert attributor.by_pid(proc.pid).container_id == CONTAINER
