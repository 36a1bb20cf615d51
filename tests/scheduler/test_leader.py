"""Lease leader election with the real client against the emulator; only the leader binds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from scheduler.adapters.kubernetes import KubernetesCluster
from scheduler.adapters.leader import LeaderElectionSettings, LeaderElector, default_identity
from scheduler.cycle.ports import PodRef
from scheduler.endpoint.metrics import SchedulerMetrics
from scheduler.standalone.binder import Binder, BindOutcome, BindRequest, BindStatus
from tests.builders import node_obj
from tests.scheduler.k8s_emulator import EmulatorThread, pod, running_emulator

FAST = LeaderElectionSettings(
    lease_name="sched",
    namespace="kube-system",
    lease_duration_s=3,
    renew_deadline_s=2,
    retry_period_s=1,
)


def wait_until(predicate: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.05)


@dataclass
class Replica:
    """One scheduler replica: its elector and a Binder gated by the elector's ``leading``."""

    elector: LeaderElector
    binder: Binder
    stop: threading.Event
    thread: threading.Thread
    outcomes: list[BindOutcome] = field(default_factory=list)

    @property
    def leading(self) -> bool:
        return self.elector.leading.is_set()

    def bind(self, name: str) -> BindOutcome:
        self.binder.bind(BindRequest(PodRef("default", name), f"default/{name}", "n1"))
        assert self.binder.flush()
        return self.outcomes[-1]


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with running_emulator() as server:
        server.put("nodes", node_obj("n1"))
        yield server


@pytest.fixture
def replicas(emulator: EmulatorThread) -> Iterator[Callable[[str], Replica]]:
    started: list[Replica] = []

    def start(identity: str) -> Replica:
        configuration = client.Configuration()
        configuration.host = emulator.url
        api = client.ApiClient(configuration)
        leading = threading.Event()
        elector = LeaderElector(api, FAST, leading, identity=identity)
        outcomes: list[BindOutcome] = []
        binder = Binder(
            KubernetesCluster(api), leading, outcomes.append, SchedulerMetrics(CollectorRegistry())
        )
        stop = threading.Event()
        thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
        replica = Replica(elector, binder, stop, thread, outcomes)
        thread.start()
        started.append(replica)
        return replica

    yield start
    for replica in started:
        replica.stop.set()
    for replica in started:
        replica.thread.join(30)
        replica.binder.close()
        assert not replica.thread.is_alive()


def binding_posts(emulator: EmulatorThread) -> list[str]:
    return [path for method, path, _, _ in emulator.requests() if path.endswith("/binding")]


def test_only_the_leader_binds(
    emulator: EmulatorThread, replicas: Callable[[str], Replica]
) -> None:
    first = replicas("a")
    wait_until(lambda: first.leading)
    second = replicas("b")
    wait_until(lambda: second.elector.holder == "a")  # b has seen a's Lease
    emulator.put("pods", pod("p1"))
    emulator.put("pods", pod("p2"))

    assert second.bind("p1").status is BindStatus.DROPPED
    assert binding_posts(emulator) == []  # the follower never called the API
    assert first.bind("p2").status is BindStatus.BOUND
    assert binding_posts(emulator) == ["/api/v1/namespaces/default/pods/p2/binding"]
    lease = emulator.get("leases", "kube-system", "sched")
    assert lease is not None and lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 3
    assert not second.leading


def test_losing_the_lease_stops_binding_at_the_next_renewal(
    emulator: EmulatorThread, replicas: Callable[[str], Replica]
) -> None:
    leader = replicas("a")
    wait_until(lambda: leader.leading and leader.elector.renewals >= 2)

    def steal(e: object) -> None:  # another replica took the Lease (e.g. after a partition)
        lease = emulator.emulator.objects[("leases", "kube-system", "sched")]  # type: ignore[union-attr]
        lease["spec"]["holderIdentity"] = "intruder"

    emulator.call(steal)
    renewals_at_steal = leader.elector.renewals
    wait_until(lambda: not leader.leading)
    # The very first attempt after the theft cleared `leading`: no renewal succeeded in between.
    assert leader.elector.renewals == renewals_at_steal
    assert leader.elector.holder == "intruder"
    emulator.put("pods", pod("p1"))
    assert leader.bind("p1").status is BindStatus.DROPPED
    assert binding_posts(emulator) == []


def test_follower_takes_over_when_the_leader_stops(
    emulator: EmulatorThread, replicas: Callable[[str], Replica]
) -> None:
    first = replicas("a")
    wait_until(lambda: first.leading)
    second = replicas("b")
    wait_until(lambda: second.elector.holder == "a")
    first.stop.set()
    first.thread.join(30)
    assert not first.leading
    lease = emulator.get("leases", "kube-system", "sched")
    assert lease is not None and not lease["spec"].get("holderIdentity")  # released
    wait_until(lambda: second.leading)
    emulator.put("pods", pod("p1"))
    assert second.bind("p1").status is BindStatus.BOUND


def test_api_outage_clears_leading_and_it_comes_back(
    emulator: EmulatorThread, replicas: Callable[[str], Replica]
) -> None:
    leader = replicas("a")
    wait_until(lambda: leader.leading)
    emulator.fail("GET", r"/leases/sched$", 503, times=1)
    wait_until(lambda: not leader.leading)
    wait_until(lambda: leader.leading)  # the next renewal within the deadline succeeds


def test_disabled_election_leads_without_a_lease(emulator: EmulatorThread) -> None:
    leading = threading.Event()
    configuration = client.Configuration()
    configuration.host = emulator.url
    elector = LeaderElector(
        client.ApiClient(configuration), LeaderElectionSettings(enabled=False), leading, "solo"
    )
    stop = threading.Event()
    thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
    thread.start()
    wait_until(leading.is_set)
    stop.set()
    thread.join(30)
    assert not leading.is_set()
    assert [p for _, p, _, _ in emulator.requests() if "leases" in p] == []


def test_identity_is_pod_name_plus_random_suffix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "interference-scheduler-7d9f-abcde")
    first, second = default_identity(), default_identity()
    assert first.startswith("interference-scheduler-7d9f-abcde_")
    assert first != second
