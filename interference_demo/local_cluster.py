"""A cluster on one machine: each "node" is a cgroup partition, each bound pod a process.

:class:`LocalCluster` implements :class:`scheduler.cycle.ports.Cluster`, so the real scheduling
loop runs against it unchanged. Nodes come from a YAML file (``deploy/demo/nodes.yaml``),
pods from Kubernetes-style manifests (``deploy/demo/pods/*.yaml``). Binding a pod starts
each container's ``command + args`` as a process inside the node's partition:

* cgroup v2 (what the agent attributes by): ``<v2 mount>/<partition>/<node>/kubepods/
  <qos>/pod<uid>/<container id>`` — the kubelet's cgroupfs layout below the node's root,
  so the agent started with ``--cgroup-root /<partition>/<node>`` names the pod;
* cgroup v1 ``cpuset`` (on hybrid hosts): ``<cpuset mount>/<partition>/<node>`` holding
  the node's CPUs, so every node has its own CPU set.

Every process is started in its own session and ended by PID; every cgroup created is
removed by :meth:`LocalCluster.close`.

Size: just over 500 lines: the cluster port's calls and the cgroups and processes behind
them, created and removed in one place.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import queue
import shlex
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from scheduler.cycle.ports import (
    INFORMED_KINDS,
    BindConflict,
    ClusterError,
    ClusterHandler,
    K8sObject,
    PodRef,
)

CGROUP_V2_MOUNT = "/sys/fs/cgroup/unified"
"""cgroup v2 hierarchy of a hybrid host (``/sys/fs/cgroup`` itself on a pure-v2 host)."""
CPUSET_V1_MOUNT = "/sys/fs/cgroup/cpuset"
"""cgroup v1 cpuset controller of a hybrid host."""
JOIN_TIMEOUT_S = 10.0
"""How long a started container may take to enter its cgroups."""
STOP_GRACE_S = 3.0
"""How long a pod's processes get between SIGTERM and SIGKILL."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One demo node as ``nodes.yaml`` describes it."""

    name: str
    cpus: str
    """CPU list of the node's cpuset, e.g. ``"0"`` or ``"0-1"``."""
    allocatable: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True, slots=True)
class LocalSettings:
    """Where the local cluster puts its cgroups."""

    partition: str
    """Top-level cgroup directory of this cluster, unique per run (e.g. ``intf-demo-4711``)."""
    cgroup_v2_mount: str = CGROUP_V2_MOUNT
    cpuset_mount: str | None = CPUSET_V1_MOUNT
    """v1 cpuset controller; None on pure-v2 hosts, where the v2 ``cpuset`` controller is
    enabled down to the node directories instead."""
    log: Callable[[str], None] = print
    """Where events and conditions are printed."""


@dataclass
class _Container:
    name: str
    argv: list[str]
    v2_dir: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class _Pod:
    obj: K8sObject
    containers: list[_Container] = field(default_factory=list)
    pod_dirs: list[Path] = field(default_factory=list)


def host_settings(partition: str, log: Callable[[str], None] = print) -> LocalSettings:
    """Settings for this host: hybrid (v1 cpuset + ``unified`` v2) or pure cgroup v2."""
    if Path("/sys/fs/cgroup/cgroup.controllers").exists():
        return LocalSettings(partition, "/sys/fs/cgroup", None, log)
    return LocalSettings(partition, CGROUP_V2_MOUNT, CPUSET_V1_MOUNT, log)


def load_nodes(path: str | Path) -> list[NodeSpec]:
    """Nodes from a ``nodes.yaml``; :class:`ClusterError` saying what is wrong."""
    try:
        data = yaml.safe_load(Path(path).read_text())
        nodes = data["nodes"]
        specs = [
            NodeSpec(
                name=str(n["name"]),
                cpus=str(n["cpus"]),
                allocatable={str(k): str(v) for k, v in n["allocatable"].items()},
                labels={str(k): str(v) for k, v in (n.get("labels") or {}).items()},
                description=str(n.get("description", "")),
            )
            for n in nodes
        ]
    except (OSError, yaml.YAMLError) as exc:
        raise ClusterError(f"cannot read node file {path}: {exc}") from exc
    except (KeyError, TypeError, AttributeError) as exc:
        raise ClusterError(
            f"node file {path} is malformed ({exc!r}); expected `nodes:` entries with "
            "name, cpus and allocatable"
        ) from exc
    if not specs:
        raise ClusterError(f"node file {path} lists no nodes")
    return specs


def load_manifests(paths: Iterable[str | Path]) -> list[K8sObject]:
    """Every ``kind: Pod`` document of the given YAML files, in order."""
    pods: list[K8sObject] = []
    for path in paths:
        try:
            docs = list(yaml.safe_load_all(Path(path).read_text()))
        except (OSError, yaml.YAMLError) as exc:
            raise ClusterError(f"cannot read pod manifest {path}: {exc}") from exc
        for doc in docs:
            if not isinstance(doc, dict) or doc.get("kind") != "Pod":
                continue
            if not doc.get("metadata", {}).get("name") or not doc.get("spec", {}).get("containers"):
                raise ClusterError(f"pod in {path} lacks metadata.name or spec.containers")
            pods.append(doc)
    return pods


def qos_class(pod: K8sObject) -> str:
    """The pod's QoS class as the kubelet derives it.

    ``Guaranteed`` when every container sets cpu and memory limits equal to its requests
    (requests default to limits); ``BestEffort`` when no container sets any request or
    limit; ``Burstable`` otherwise.
    """
    containers = pod["spec"]["containers"]
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        limits = res.get("limits") or {}
        requests = {**limits, **(res.get("requests") or {})}
        any_set = any_set or bool(limits) or bool(requests)
        for resource in ("cpu", "memory"):
            if resource not in limits or str(requests.get(resource)) != str(limits[resource]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def container_id(pod_uid: str, container: str) -> str:
    """A stable 64-hex-digit id, the shape containerd gives its containers."""
    return hashlib.sha256(f"{pod_uid}/{container}".encode()).hexdigest()


class LocalCluster:
    """Nodes as cgroup partitions of this host; :class:`scheduler.cycle.ports.Cluster`."""

    def __init__(self, nodes: list[NodeSpec], pods: list[K8sObject], settings: LocalSettings):
        self.settings = settings
        self.nodes = {n.name: n for n in nodes}
        self.events: list[tuple[str, str, str, str]] = []
        """``(ns/name, type, reason, message)`` of every recorded Event."""
        self._lock = threading.RLock()
        self._version = 0
        self._handlers: list[queue.SimpleQueue[tuple[str, str, K8sObject]]] = []
        self._created: list[Path] = []
        self._pods: dict[tuple[str, str], _Pod] = {}
        self._node_objs = {n.name: self._node_object(n) for n in nodes}
        for manifest in pods:
            obj = self._pod_object(manifest)
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if key in self._pods:
                raise ClusterError(f"pod {key[0]}/{key[1]} is defined twice")
            node = obj["spec"].get("nodeName")
            if node and node not in self.nodes:
                raise ClusterError(f"pod {key[0]}/{key[1]} names unknown node {node!r}")
            self._pods[key] = _Pod(obj)

    # -- partitions -------------------------------------------------------------------

    def node_cgroup_root(self, node: str) -> str:
        """The node's cgroup path inside each hierarchy (the agent's ``--cgroup-root``)."""
        return f"/{self.settings.partition}/{node}"

    def create_partitions(self) -> None:
        """Create every node's v2 root and cpuset, then start the pods already bound."""
        v2_top = Path(self.settings.cgroup_v2_mount, self.settings.partition)
        self._mkdir(v2_top)
        if self.settings.cpuset_mount is not None:
            cpuset_top = Path(self.settings.cpuset_mount, self.settings.partition)
            self._mkdir(cpuset_top)
            all_cpus = Path(self.settings.cpuset_mount, "cpuset.cpus").read_text().strip()
            all_mems = Path(self.settings.cpuset_mount, "cpuset.mems").read_text().strip()
            _write(cpuset_top / "cpuset.cpus", all_cpus)
            _write(cpuset_top / "cpuset.mems", all_mems)
        else:
            for parent in (Path(self.settings.cgroup_v2_mount), v2_top):
                _write(parent / "cgroup.subtree_control", "+cpuset")
        for spec in self.nodes.values():
            self._mkdir(v2_top / spec.name)
            if self.settings.cpuset_mount is None:
                _write(v2_top / spec.name / "cpuset.cpus", spec.cpus)
            else:
                node_cpuset = Path(self.settings.cpuset_mount, self.settings.partition, spec.name)
                self._mkdir(node_cpuset)
                _write(node_cpuset / "cpuset.cpus", spec.cpus)
                _write(node_cpuset / "cpuset.mems", all_mems)
        with self._lock:
            for pod in self._pods.values():
                if pod.obj["spec"].get("nodeName"):
                    self._start(pod, pod.obj["spec"]["nodeName"])

    def pods_file_content(self) -> dict[str, str]:
        """``{uid: "namespace/name"}`` of every pod, for the agents' ``--pods-file``."""
        with self._lock:
            return {
                p.obj["metadata"]["uid"]: f"{ns}/{name}" for (ns, name), p in self._pods.items()
            }

    def write_pods_file(self, path: str | Path) -> None:
        """Write :meth:`pods_file_content` as JSON (a YAML subset) for the agents."""
        Path(path).write_text(json.dumps(self.pods_file_content(), indent=1))

    def pod_pids(self, namespace: str, name: str) -> list[int]:
        """PIDs of the pod's running container processes."""
        with self._lock:
            pod = self._pods[(namespace, name)]
            return [c.proc.pid for c in pod.containers if c.proc and c.proc.poll() is None]

    def pod(self, namespace: str, name: str) -> K8sObject:
        """A copy of the pod object as the cluster holds it now."""
        with self._lock:
            return copy.deepcopy(self._pods[(namespace, name)].obj)

    def add_pod(self, manifest: K8sObject) -> K8sObject:
        """Create a pod (as ``kubectl apply`` would) and announce it to the informers."""
        obj = self._pod_object(manifest)
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        with self._lock:
            if key in self._pods:
                raise ClusterError(f"pod {key[0]}/{key[1]} already exists")
            self._pods[key] = _Pod(obj)
            self._broadcast("ADDED", obj)
        return copy.deepcopy(obj)

    def delete_pod(self, namespace: str, name: str) -> None:
        """Stop the pod's processes (by PID and by what its cgroups hold) and remove it,
        as the kubelet does after an eviction; its cgroups go at :meth:`close`."""
        with self._lock:
            pod = self._pods.pop((namespace, name), None)
            if pod is None:
                raise ClusterError(f"pod {namespace}/{name} does not exist")
            self._broadcast("DELETED", pod.obj)
        for container in pod.containers:
            if container.proc is not None and container.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(container.proc.pid, signal.SIGKILL)
                container.proc.wait()
            _kill_cgroup_members(container.v2_dir)

    # -- Cluster protocol ------------------------------------------------------------

    def run_informers(self, handler: ClusterHandler, stop: threading.Event) -> None:
        """Hand the full state to ``handler``, then every change until ``stop`` is set."""
        events: queue.SimpleQueue[tuple[str, str, K8sObject]] = queue.SimpleQueue()
        with self._lock:
            handler.replace("Node", [copy.deepcopy(o) for o in self._node_objs.values()])
            for other in INFORMED_KINDS:  # the demo has no namespace labels, claims or volumes
                if other not in ("Node", "Pod"):
                    handler.replace(other, [])
            handler.replace("Pod", [copy.deepcopy(p.obj) for p in self._pods.values()])
            self._handlers.append(events)
        try:
            while not stop.is_set():
                self.reap()
                try:
                    kind, event, obj = events.get(timeout=0.2)
                except queue.Empty:
                    continue
                handler.apply(kind, event, obj)  # type: ignore[arg-type]
        finally:
            with self._lock:
                self._handlers.remove(events)

    def bind(self, pod: PodRef, node: str) -> None:
        """Assign the pod to ``node`` and start its containers inside the node's partition."""
        with self._lock:
            entry = self._pods.get((pod.namespace, pod.name))
            if entry is None or (pod.uid and entry.obj["metadata"]["uid"] != pod.uid):
                raise BindConflict(f"pod {pod.namespace}/{pod.name} no longer exists")
            if entry.obj["spec"].get("nodeName"):
                raise BindConflict(
                    f"pod {pod.namespace}/{pod.name} is already bound to "
                    f"{entry.obj['spec']['nodeName']}"
                )
            if node not in self.nodes:
                raise ClusterError(f"cannot bind {pod.namespace}/{pod.name}: no node {node!r}")
            entry.obj["spec"]["nodeName"] = node
            self._set_condition(entry.obj, "True", "", "")
            self._start(entry, node)
            self._broadcast("MODIFIED", entry.obj)
        self.settings.log(f"bind   {pod.namespace}/{pod.name} → {node} ({self._cpus_note(node)})")

    def record_event(self, pod: PodRef, event_type: str, reason: str, message: str) -> None:
        """Keep the Event and print it the way ``kubectl get events`` would."""
        self.events.append((f"{pod.namespace}/{pod.name}", event_type, reason, message))
        self.settings.log(
            f"event  {event_type:<7} {reason:<17} {pod.namespace}/{pod.name}: {message}"
        )

    def set_unschedulable(self, pod: PodRef, message: str) -> None:
        """Set ``PodScheduled=False/Unschedulable`` on the pod and announce the change."""
        with self._lock:
            entry = self._pods.get((pod.namespace, pod.name))
            if entry is None:
                raise BindConflict(f"pod {pod.namespace}/{pod.name} no longer exists")
            self._set_condition(entry.obj, "False", "Unschedulable", message)
            self._broadcast("MODIFIED", entry.obj)
        self.settings.log(f"status {pod.namespace}/{pod.name}: PodScheduled=False Unschedulable")

    # -- lifecycle ---------------------------------------------------------------------

    def reap(self) -> None:
        """Mark pods whose processes have all exited as Succeeded or Failed."""
        with self._lock:
            for pod in self._pods.values():
                status = pod.obj["status"]
                if status.get("phase") != "Running" or not pod.containers:
                    continue
                codes = [c.proc.poll() if c.proc else 0 for c in pod.containers]
                if any(code is None for code in codes):
                    continue
                status["phase"] = "Succeeded" if all(code == 0 for code in codes) else "Failed"
                self._broadcast("MODIFIED", pod.obj)

    def close(self) -> None:
        """End every process this cluster started (by PID) and remove every cgroup it made."""
        with self._lock:
            procs = [c.proc for p in self._pods.values() for c in p.containers if c.proc]
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # Children that outlived their session leader (stress-ng workers) still sit in
        # the cgroups; end them by the PIDs the cgroups list before removing the dirs.
        for path in reversed(self._created):
            _kill_cgroup_members(path)
        for path in reversed(self._created):
            _rmdir(path)
        self._created.clear()

    # -- internals -------------------------------------------------------------------

    def _start(self, pod: _Pod, node: str) -> None:
        meta = pod.obj["metadata"]
        uid = meta["uid"]
        qos = qos_class(pod.obj)
        node_root = Path(self.settings.cgroup_v2_mount, self.settings.partition, node)
        kubepods = node_root / "kubepods"
        parent = kubepods if qos == "Guaranteed" else kubepods / qos.lower()
        pod_dir = parent / f"pod{uid}"
        for path in (kubepods, parent, pod_dir):
            if not path.exists():
                self._mkdir(path)
        cpuset = (
            Path(self.settings.cpuset_mount, self.settings.partition, node, "cgroup.procs")
            if self.settings.cpuset_mount is not None
            else None
        )
        for spec in pod.obj["spec"]["containers"]:
            argv = [str(a) for a in (spec.get("command") or []) + (spec.get("args") or [])]
            if not argv:
                raise ClusterError(
                    f"container {spec['name']} of {meta['namespace']}/{meta['name']} has no "
                    "command; the local cluster runs commands, not images"
                )
            container = _Container(spec["name"], argv, pod_dir / container_id(uid, spec["name"]))
            self._mkdir(container.v2_dir)
            joins = [container.v2_dir / "cgroup.procs", *([cpuset] if cpuset else [])]
            # The shell joins the cgroups before it execs the command, so the command and
            # everything it forks start inside them (no window outside, no preexec_fn).
            script = "".join(f"echo $$ > {shlex.quote(str(j))} && " for j in joins)
            container.proc = subprocess.Popen(
                ["/bin/sh", "-c", script + 'exec "$@"', "sh", *argv],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
            pod.containers.append(container)
            _await_join(container, f"{meta['namespace']}/{meta['name']}")
        pod.obj["status"]["phase"] = "Running"
        pod.obj["status"]["qosClass"] = qos

    def _pod_object(self, manifest: K8sObject) -> K8sObject:
        obj = copy.deepcopy(manifest)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        meta["resourceVersion"] = self._next_version()
        obj.setdefault("spec", {})
        obj["status"] = {"phase": "Pending", "conditions": []}
        return obj

    def _node_object(self, spec: NodeSpec) -> K8sObject:
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": spec.name,
                "uid": str(
                    uuid.uuid5(uuid.NAMESPACE_DNS, f"{self.settings.partition}.{spec.name}")
                ),
                "labels": {"kubernetes.io/hostname": spec.name, **spec.labels},
                "resourceVersion": self._next_version(),
            },
            "spec": {},
            "status": {
                "allocatable": dict(spec.allocatable),
                "capacity": dict(spec.allocatable),
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
            },
        }

    def _set_condition(self, obj: K8sObject, status: str, reason: str, message: str) -> None:
        conditions = [c for c in obj["status"]["conditions"] if c.get("type") != "PodScheduled"]
        condition = {"type": "PodScheduled", "status": status}
        if reason:
            condition.update(reason=reason, message=message)
        obj["status"]["conditions"] = [*conditions, condition]
        obj["metadata"]["resourceVersion"] = self._next_version()

    def _broadcast(self, event: str, obj: K8sObject) -> None:
        for events in self._handlers:
            events.put(("Pod", event, copy.deepcopy(obj)))

    def _next_version(self) -> str:
        self._version += 1
        return str(self._version)

    def _mkdir(self, path: Path) -> None:
        try:
            path.mkdir()
        except FileExistsError as exc:
            raise ClusterError(
                f"cgroup {path} already exists; another demo uses the partition name "
                f"{self.settings.partition!r} (or a crashed one left it: rmdir it)"
            ) from exc
        except OSError as exc:
            raise ClusterError(
                f"cannot create cgroup {path}: {exc}; the local cluster needs root and a "
                "cgroup v2 hierarchy"
            ) from exc
        self._created.append(path)

    def _cpus_note(self, node: str) -> str:
        return f"cpuset {self.nodes[node].cpus}"


def _await_join(container: _Container, pod: str) -> None:
    """Wait until the container's process sits in its cgroup (the shell's first step)."""
    assert container.proc is not None
    procs = container.v2_dir / "cgroup.procs"
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    while time.monotonic() < deadline:
        if str(container.proc.pid) in procs.read_text().split():
            return
        if container.proc.poll() is not None:
            if container.proc.returncode == 0:
                return  # joined, ran and finished already
            break
        time.sleep(0.01)
    raise ClusterError(
        f"container {container.name} of {pod} did not start inside {container.v2_dir} "
        f"(exit status {container.proc.poll()}); is the cgroup writable and "
        f"{container.argv[0]!r} installed?"
    )


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise ClusterError(f"cannot write {value!r} to {path}: {exc}") from exc


def _kill_cgroup_members(path: Path) -> None:
    procs = path / "cgroup.procs"
    for _ in range(50):
        try:
            pids = [int(p) for p in procs.read_text().split()]
        except OSError:
            return
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _rmdir(path: Path) -> None:
    # A cgroup whose last task just died can be busy for a moment; retry briefly.
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.05)
    path.rmdir()
