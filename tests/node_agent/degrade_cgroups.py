"""Real pod cgroups and hand-built reports for the degrader's tests (test_degrade.py,
test_degrade_crash.py and the crashing agent they start, degrade_crash_child.py)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from interference.signals import NodeMetrics, NodeReport, PodMetrics
from node_agent.probes.base import ProbeContext
from tests.node_agent.own_cgroups import cgroup_tree, unique_name

CTX = ProbeContext()
NS = "degrade"


@dataclass
class RecordedEvents:
    events: list[tuple[str, str, str, bool]] = field(default_factory=list)

    def emit(self, pod: PodMetrics, reason: str, message: str, warning: bool) -> None:
        self.events.append((pod.key, reason, message, warning))

    def reasons(self) -> list[tuple[str, str]]:
        return [(key, reason) for key, reason, _, _ in self.events]


@dataclass(frozen=True)
class Tree:
    root: str
    uids: dict[str, str]
    """pod name → UID."""
    qos: dict[str, str]


def hierarchies() -> dict[str, str]:
    found = {"v2": CTX.cgroup_v2_mount}
    for controller in ("cpu", "memory"):
        mount = f"{CTX.cgroup_v1_mount}/{controller}"
        if Path(mount, "tasks").exists():
            found[controller] = mount
    return found


@contextmanager
def pod_cgroups() -> Iterator[Tree]:
    """A unique ``kubepods/<qos>/pod<uid>`` tree in every hierarchy; removed afterwards."""
    top = unique_name("intf-test-degrade")
    pods = {"hog": "besteffort", "victim": "burstable", "batch": "burstable", "hog2": "besteffort"}
    uids = {name: str(uuid.uuid4()) for name in pods}
    with ExitStack() as stack:
        for mount in hierarchies().values():
            kubepods = stack.enter_context(cgroup_tree(mount, f"{top}/kubepods"))
            for name, qos in pods.items():
                (kubepods / qos / f"pod{uids[name]}").mkdir(parents=True)
        yield Tree(f"/{top}", uids, pods)


def pod(tree: Tree, name: str, **values: object) -> PodMetrics:
    return PodMetrics(NS, name, uid=tree.uids[name], qos=tree.qos[name], **values)  # type: ignore[arg-type]


def contended(tree: Tree, culprit: str = "hog", reclaim_stall: float = 0.0) -> NodeReport:
    """The victim waits 600 ms/s behind ``culprit`` (and a little behind system)."""
    victim = pod(
        tree,
        "victim",
        cpu_ms_per_s=300.0,
        runq_wait_ms_per_s=700.0,
        neighbour_wait_ms_per_s=700.0,
        culprits=((f"{NS}/{culprit}", 600.0), ("system", 100.0)),
    )
    return NodeReport(
        node="n1",
        ts=time.time(),
        interval_s=1.0,
        metrics=NodeMetrics(runq_p99_us=30_000.0, reclaim_stall_ms_per_s=reclaim_stall),
        pods=[victim, *(pod(tree, n, cpu_ms_per_s=900.0) for n in tree.uids if n != "victim")],
        measured=("reclaim", "runq", "throttle"),
    )


def quiet(tree: Tree) -> NodeReport:
    return replace(
        contended(tree),
        metrics=NodeMetrics(),
        pods=[pod(tree, n, cpu_ms_per_s=100.0) for n in tree.uids],
    )
