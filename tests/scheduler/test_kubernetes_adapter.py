"""KubernetesCluster with the real ``kubernetes`` client over HTTP against the emulator."""

from __future__ import annotations

import datetime as dt
import http.server
import random
import re
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from kubernetes import client

from interference_infra.kube_watch import Backoff
from scheduler.adapters import event_recorder
from scheduler.adapters.event_recorder import event_name
from scheduler.adapters.kubernetes import REQUIRED_PERMISSIONS, KubernetesCluster
from scheduler.adapters.kubernetes_settings import KubernetesSettings
from scheduler.adapters.leader import LEASE_PERMISSIONS, LeaderElectionSettings, LeaderElector
from scheduler.cycle.ports import (
    ApiUnavailable,
    BindConflict,
    ClusterError,
    EventType,
    Forbidden,
    K8sObject,
    ObjectKind,
    PodRef,
)
from tests.builders import node_obj
from tests.conftest import free_port
from tests.scheduler.k8s_emulator import (
    EmulatorThread,
    observed_rbac_rules,
    pod,
    running_emulator,
)

FAST = KubernetesSettings(page_size=2, backoff_initial_s=0.01, backoff_max_s=0.2)


class RecordingHandler:
    """A ClusterHandler that keeps the informer's view and lets a test wait for it."""

    def __init__(self) -> None:
        self.state: dict[ObjectKind, dict[str, K8sObject]] = {"Node": {}, "Pod": {}}
        self.calls: list[tuple[str, ObjectKind, str]] = []
        self.fail_next_apply = False
        self._cond = threading.Condition()

    def replace(self, kind: ObjectKind, objects: list[K8sObject]) -> None:
        with self._cond:
            self.state[kind] = {_key(o): o for o in objects}
            self.calls.append(("replace", kind, ""))
            self._cond.notify_all()

    def apply(self, kind: ObjectKind, event: EventType, obj: K8sObject) -> None:
        with self._cond:
            if self.fail_next_apply:
                self.fail_next_apply = False
                raise RuntimeError("handler bug")
            if event == "DELETED":
                self.state[kind].pop(_key(obj), None)
            else:
                self.state[kind][_key(obj)] = obj
            self.calls.append(("apply", kind, event))
            self._cond.notify_all()

    def wait_for(self, predicate: Callable[[RecordingHandler], bool], timeout: float = 30) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: predicate(self), timeout), self.calls


def _key(obj: K8sObject) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def api_client(url: str) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = url
    return client.ApiClient(configuration)


@pytest.fixture
def emulator() -> Iterator[EmulatorThread]:
    with running_emulator() as server:
        yield server


@pytest.fixture
def cluster(emulator: EmulatorThread) -> KubernetesCluster:
    return KubernetesCluster(
        api_client(emulator.url), FAST, identity="sched-0", rng=random.Random(1)
    )


@pytest.fixture
def informers(cluster: KubernetesCluster) -> Iterator[Callable[[], RecordingHandler]]:
    """Starts the informers when called (after the test put its objects)."""
    handler = RecordingHandler()
    stop = threading.Event()
    thread = threading.Thread(target=cluster.run_informers, args=(handler, stop), daemon=True)

    def start() -> RecordingHandler:
        thread.start()
        return handler

    yield start
    stop.set()
    if thread.is_alive():
        thread.join(30)
        assert not thread.is_alive(), "run_informers did not return after stop"


def _populate(emulator: EmulatorThread) -> None:
    for name in ("n1", "n2", "n3"):
        emulator.put("nodes", node_obj(name))
    emulator.put("pods", pod("pending"))
    emulator.put("pods", pod("running", node="n1", phase="Running"))
    emulator.put("pods", pod("done", node="n2", phase="Succeeded"))


def test_lists_in_pages_then_watches_from_the_list_resource_version(
    emulator: EmulatorThread, cluster: KubernetesCluster, informers: Callable[[], RecordingHandler]
) -> None:
    _populate(emulator)
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())
    assert set(handler.state["Node"]) == {"/n1", "/n2", "/n3"}
    assert set(handler.state["Pod"]) == {"default/pending", "default/running"}  # finished excluded

    emulator.put("pods", pod("new"))
    handler.wait_for(lambda h: "default/new" in h.state["Pod"])

    requests = emulator.requests()
    node_lists = [r for r in requests if r[1] == "/api/v1/nodes" and "watch" not in r[2]]
    assert len(node_lists) == 2  # 3 nodes, pages of 2
    assert "continue" in node_lists[1][2]
    pod_list = next(r for r in requests if r[1] == "/api/v1/pods" and "watch" not in r[2])
    assert pod_list[2]["fieldSelector"] == "status.phase!=Succeeded,status.phase!=Failed"
    pod_watch = next(r for r in requests if r[1] == "/api/v1/pods" and "watch" in r[2])
    assert pod_watch[2]["resourceVersion"] == "106"  # the list's, after 3 nodes + 3 pods
    assert pod_watch[2]["allowWatchBookmarks"] == "true"
    assert handler.calls.count(("apply", "Pod", "ADDED")) == 1  # no replays of listed pods


def test_watch_events_update_and_delete(
    emulator: EmulatorThread, informers: Callable[[], RecordingHandler]
) -> None:
    _populate(emulator)
    handler = informers()
    handler.wait_for(lambda h: "default/pending" in h.state["Pod"])
    bound = pod("pending", node="n2")
    emulator.put("pods", bound)
    handler.wait_for(lambda h: h.state["Pod"]["default/pending"]["spec"]["nodeName"] == "n2")
    emulator.delete("nodes", "", "n3")
    handler.wait_for(lambda h: "/n3" not in h.state["Node"])
    # Leaving the field selector (phase Succeeded) is a DELETED for the informer.
    emulator.put("pods", pod("running", node="n1", phase="Succeeded"))
    handler.wait_for(lambda h: "default/running" not in h.state["Pod"])


def test_relists_on_410_gone(
    emulator: EmulatorThread, cluster: KubernetesCluster, informers: Callable[[], RecordingHandler]
) -> None:
    _populate(emulator)
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())
    emulator.put("pods", pod("seen-by-watch"))
    handler.wait_for(lambda h: "default/seen-by-watch" in h.state["Pod"])
    assert handler.calls.count(("replace", "Pod", "")) == 1

    emulator.compact()  # etcd compaction: the informer's resourceVersion is now too old
    emulator.drop_watches()  # the watch ends, the informer rewatches from its old RV → 410
    handler.wait_for(lambda h: h.calls.count(("replace", "Pod", "")) == 2)
    emulator.put("pods", pod("after-relist"))
    handler.wait_for(lambda h: "default/after-relist" in h.state["Pod"])
    gone_watch = [r for r in emulator.requests() if r[1] == "/api/v1/pods" and "watch" in r[2]][1]
    relist = [r for r in emulator.requests() if r[1] == "/api/v1/pods" and "watch" not in r[2]][1]
    assert "resourceVersion" not in relist[2]  # a fresh list, not from the expired version
    assert int(gone_watch[2]["resourceVersion"]) < emulator.call(lambda e: e.compacted_below)


def test_backs_off_and_recovers_on_429_and_5xx(
    emulator: EmulatorThread, cluster: KubernetesCluster, informers: Callable[[], RecordingHandler]
) -> None:
    emulator.fail("GET", r"^/api/v1/nodes\?limit=", 500, times=2)
    emulator.fail("GET", r"^/api/v1/nodes\?limit=", 429, times=1)
    emulator.put("nodes", node_obj("n1"))
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())
    node_gets = [r for r in emulator.requests() if r[1] == "/api/v1/nodes"]
    assert len(node_gets) >= 4  # three refused lists, then the good one (and its watch)
    assert set(handler.state["Node"]) == {"/n1"}


def test_bookmarks_advance_the_resource_version_and_errors_rewatch_without_relisting(
    emulator: EmulatorThread,
    cluster: KubernetesCluster,
    informers: Callable[[], RecordingHandler],
) -> None:
    _populate(emulator)
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())

    def pod_watches() -> list[dict[str, str]]:
        return [q for _, p, q, _ in emulator.requests() if p == "/api/v1/pods" and "watch" in q]

    deadline = time.monotonic() + 30
    while emulator.watch_count("pods") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    bookmark_rv = emulator.bookmark("pods")
    emulator.drop_watches()  # queued after the bookmark, so the stream carries it first
    deadline = time.monotonic() + 30
    while len(pod_watches()) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pod_watches()[1]["resourceVersion"] == bookmark_rv

    while emulator.watch_count("pods") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    error = {"kind": "Status", "code": 500, "message": "etcd leader changed"}
    emulator.emit("pods", {"type": "ERROR", "object": error})
    while len(pod_watches()) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pod_watches()[2]["resourceVersion"] == bookmark_rv  # resumed, not relisted
    assert handler.calls.count(("replace", "Pod", "")) == 1


def test_relists_from_scratch_when_a_continue_token_expires(
    emulator: EmulatorThread,
    cluster: KubernetesCluster,
    informers: Callable[[], RecordingHandler],
) -> None:
    for name in ("n1", "n2", "n3"):
        emulator.put("nodes", node_obj(name))
    emulator.fail("GET", r"^/api/v1/nodes\?continue=", 410)
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())
    assert set(handler.state["Node"]) == {"/n1", "/n2", "/n3"}
    lists = [q for _, p, q, _ in emulator.requests() if p == "/api/v1/nodes" and "watch" not in q]
    assert ["continue" in q for q in lists] == [False, True, False, True]  # 410, then anew
    assert handler.calls.count(("replace", "Node", "")) == 1  # no partial list reached it


def test_retry_after_is_honoured(emulator: EmulatorThread, cluster: KubernetesCluster) -> None:
    emulator.put("pods", pod("p1"))
    emulator.fail("POST", r"/binding$", 429, retry_after=7)
    with pytest.raises(ApiUnavailable) as caught:
        cluster.bind(PodRef("default", "p1"), "n1")
    assert getattr(caught.value, "retry_after_s", None) == 7.0


def test_a_failing_handler_does_not_kill_the_informer(
    emulator: EmulatorThread, cluster: KubernetesCluster, informers: Callable[[], RecordingHandler]
) -> None:
    _populate(emulator)
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())
    handler.fail_next_apply = True
    emulator.put("pods", pod("lost-to-a-bug"))
    # The informer relists after the exception, so the pod still reaches the handler.
    handler.wait_for(lambda h: "default/lost-to-a-bug" in h.state["Pod"])
    assert handler.calls.count(("replace", "Pod", "")) == 2


def test_bind_posts_a_binding(emulator: EmulatorThread, cluster: KubernetesCluster) -> None:
    emulator.put("nodes", node_obj("n1"))
    created = emulator.put("pods", pod("p1", namespace="ml"))
    uid = created["metadata"]["uid"]
    cluster.bind(PodRef("ml", "p1", uid), "n1")
    method, path, _, body = emulator.requests()[-1]
    assert (method, path) == ("POST", "/api/v1/namespaces/ml/pods/p1/binding")
    assert body == {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p1", "namespace": "ml", "uid": uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
    }
    stored = emulator.get("pods", "ml", "p1")
    assert stored is not None and stored["spec"]["nodeName"] == "n1"


@pytest.mark.parametrize(
    ("setup", "name"),
    [
        pytest.param(lambda e: e.put("pods", pod("p1", node="n2")), "p1", id="409-already-bound"),
        pytest.param(lambda e: None, "ghost", id="404-pod-gone"),
    ],
)
def test_bind_conflicts(
    emulator: EmulatorThread,
    cluster: KubernetesCluster,
    setup: Callable[[EmulatorThread], Any],
    name: str,
) -> None:
    setup(emulator)
    with pytest.raises(BindConflict, match=name):
        cluster.bind(PodRef("default", name), "n1")


@pytest.mark.parametrize(
    ("status", "error", "match"),
    [
        (403, Forbidden, "verb 'create' on 'pods/binding'"),
        (401, Forbidden, "ClusterRole"),
        (500, ApiUnavailable, "HTTP 500"),
        (429, ApiUnavailable, "HTTP 429"),
        (422, ClusterError, "HTTP 422"),
    ],
)
def test_bind_errors_are_translated(
    emulator: EmulatorThread,
    cluster: KubernetesCluster,
    status: int,
    error: type[ClusterError],
    match: str,
) -> None:
    emulator.put("pods", pod("p1"))
    emulator.fail("POST", r"/binding$", status)
    with pytest.raises(error, match=re.escape(match)) as caught:
        cluster.bind(PodRef("default", "p1"), "n1")
    assert not isinstance(caught.value, BindConflict)


def test_unreachable_api_server_is_api_unavailable() -> None:
    cluster = KubernetesCluster(
        api_client(f"http://127.0.0.1:{free_port()}"),
        KubernetesSettings(request_timeout_s=5),
    )
    with pytest.raises(ApiUnavailable, match="cannot reach the API server"):
        cluster.bind(PodRef("default", "p1"), "n1")
    with pytest.raises(ApiUnavailable, match="list nodes"):
        cluster.list_page("Node")


def test_events_in_kube_scheduler_style(
    emulator: EmulatorThread, cluster: KubernetesCluster
) -> None:
    cluster.record_event(
        PodRef("ml", "p1", "u-1"), "Normal", "Scheduled", "Successfully assigned ml/p1 to n1"
    )
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    cluster.record_event(
        PodRef("ml", "p2", "u-2"), "Warning", "FailedScheduling", message + "x" * 2000
    )
    events = sorted(emulator.all("events"), key=lambda e: e["regarding"]["name"])
    assert [e["metadata"]["namespace"] for e in events] == ["ml", "ml"]
    scheduled, failed = events
    assert scheduled["apiVersion"] == "events.k8s.io/v1"
    assert scheduled["reason"] == "Scheduled" and scheduled["type"] == "Normal"
    assert scheduled["action"] == "Binding"
    assert scheduled["reportingController"] == "interference-scheduler"
    assert scheduled["reportingInstance"] == "sched-0"
    assert scheduled["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "p1",
        "uid": "u-1",
    }
    event_time = dt.datetime.fromisoformat(scheduled["eventTime"])  # RFC 3339 MicroTime
    assert event_time.utcoffset() == dt.timedelta(0)
    assert abs(event_time.timestamp() - time.time()) < 3600
    assert failed["action"] == "Scheduling" and failed["type"] == "Warning"
    assert failed["note"].startswith(message) and len(failed["note"]) == 1024


@pytest.mark.parametrize(
    ("pod_name", "now_ns", "expected"),
    [
        ("web-0", 0x187A3B2C4D5E6F70, "web-0.187a3b2c4d5e6f70"),
        ("a" * 253, 0x10, "a" * 250 + ".10"),  # shortened to stay ≤ 253 characters
        ("a" * 249 + "-b", 0x10, "a" * 249 + ".10"),  # never ends a label with "-"
    ],
)
def test_event_names_are_kube_schedulers(pod_name: str, now_ns: int, expected: str) -> None:
    assert event_name(pod_name, now_ns) == expected


def test_repeated_events_are_one_series(
    emulator: EmulatorThread, cluster: KubernetesCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """First occurrence: a create named ``<pod>.<hex>``; second: PATCH ``series.count=2``;
    further ones within the interval are only counted, the next one after it writes the
    count; another reason is its own Event; a deleted Event starts a new series Event."""
    ref = PodRef("ml", "p1", "u-1")
    clock = [1_000.0]
    monkeypatch.setattr(event_recorder.time, "time", lambda: clock[0])
    cluster.record_event(ref, "Warning", "FailedScheduling", "0/3 nodes are available: a.")
    (event,) = emulator.all("events")
    assert re.fullmatch(r"p1\.[0-9a-f]+", event["metadata"]["name"])
    assert "series" not in event
    clock[0] += 10
    cluster.record_event(ref, "Warning", "FailedScheduling", "0/3 nodes are available: b.")
    (event,) = emulator.all("events")
    assert event["series"]["count"] == 2
    assert event["note"] == "0/3 nodes are available: a."  # a series keeps its first note
    for _ in range(3):
        clock[0] += 1
        cluster.record_event(ref, "Warning", "FailedScheduling", "again")
    (event,) = emulator.all("events")
    assert event["series"]["count"] == 2  # counted, not written yet
    clock[0] += event_recorder.SERIES_PATCH_INTERVAL_S
    cluster.record_event(ref, "Warning", "FailedScheduling", "again")
    (event,) = emulator.all("events")
    assert event["series"]["count"] == 6
    last = dt.datetime.fromisoformat(event["series"]["lastObservedTime"]).timestamp()
    assert last == pytest.approx(clock[0])
    cluster.record_event(ref, "Normal", "Scheduled", "Successfully assigned ml/p1 to n1")
    assert sorted(e["reason"] for e in emulator.all("events")) == ["FailedScheduling", "Scheduled"]
    emulator.delete("events", "ml", event["metadata"]["name"])
    clock[0] += event_recorder.SERIES_PATCH_INTERVAL_S
    cluster.record_event(ref, "Warning", "FailedScheduling", "again")
    recreated = [e for e in emulator.all("events") if e["reason"] == "FailedScheduling"]
    assert len(recreated) == 1 and recreated[0]["series"]["count"] == 7


def test_unschedulable_condition_is_merged_into_pod_status(
    emulator: EmulatorThread, cluster: KubernetesCluster
) -> None:
    existing = pod("p1")
    existing["status"]["conditions"] = [{"type": "Initialized", "status": "True"}]
    emulator.put("pods", existing)
    cluster.set_unschedulable(PodRef("default", "p1"), "0/3 nodes are available: 3 Too many pods.")
    method, path, _, body = emulator.requests()[-1]
    assert (method, path) == ("PATCH", "/api/v1/namespaces/default/pods/p1/status")
    assert body["status"]["conditions"][0]["type"] == "PodScheduled"
    stored = emulator.get("pods", "default", "p1")
    assert stored is not None
    conditions = {c["type"]: c for c in stored["status"]["conditions"]}
    assert conditions["Initialized"]["status"] == "True"  # strategic merge kept it
    assert conditions["PodScheduled"]["status"] == "False"
    assert conditions["PodScheduled"]["reason"] == "Unschedulable"
    assert conditions["PodScheduled"]["message"] == "0/3 nodes are available: 3 Too many pods."


def test_every_call_is_covered_by_required_permissions(
    emulator: EmulatorThread, cluster: KubernetesCluster, informers: Callable[[], RecordingHandler]
) -> None:
    """Exercises every API method of the adapter and the elector; each recorded request
    maps to exactly the RBAC rules they declare (deploy/ checks its ClusterRole against
    ``REQUIRED_PERMISSIONS + LEASE_PERMISSIONS``)."""
    _populate(emulator)
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())
    cluster.bind(PodRef("default", "pending"), "n1")
    for _ in range(2):  # the repeat PATCHes the Event's series
        cluster.record_event(PodRef("default", "pending"), "Normal", "Scheduled", "ok")
    cluster.set_unschedulable(PodRef("default", "running"), "no")
    leading, stop = threading.Event(), threading.Event()
    settings = LeaderElectionSettings(
        namespace="kube-system", lease_duration_s=3, renew_deadline_s=2, retry_period_s=1
    )
    elector = LeaderElector(api_client(emulator.url), settings, leading, "rbac-check")
    thread = threading.Thread(target=elector.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while elector.renewals < 2 and time.monotonic() < deadline:  # create, then get + update
        time.sleep(0.05)
    stop.set()
    thread.join(30)

    granted = {
        (group, resource, verb)
        for group, resource, verbs in REQUIRED_PERMISSIONS + LEASE_PERMISSIONS
        for verb in verbs
    }
    assert observed_rbac_rules(emulator) == granted  # all used, nothing more granted


@pytest.mark.parametrize(
    ("failures", "ceiling"),
    [(0, 1.0), (1, 2.0), (3, 8.0), (5, 10.0), (50, 10.0)],
)
def test_backoff_is_capped_exponential_with_jitter(failures: int, ceiling: float) -> None:
    backoff = Backoff(1.0, 10.0, random.Random(7))
    backoff.failures = failures
    delays = []
    for _ in range(50):
        backoff.failures = failures
        delays.append(backoff.next_delay())
    assert all(ceiling / 2 <= d <= ceiling for d in delays)
    assert len(set(delays)) > 1  # jittered
    backoff.failures = failures
    assert backoff.next_delay(at_least_s=30.0) == 30.0  # Retry-After wins
    backoff.reset()
    assert backoff.next_delay() <= 1.0


def test_stop_ends_informers_promptly_even_mid_watch(
    emulator: EmulatorThread, cluster: KubernetesCluster
) -> None:
    handler = RecordingHandler()
    stop = threading.Event()
    thread = threading.Thread(target=cluster.run_informers, args=(handler, stop), daemon=True)
    thread.start()
    handler.wait_for(lambda h: cluster.synced())
    deadline = time.monotonic() + 30
    while emulator.watch_count("pods") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    thread.join(30)
    assert not thread.is_alive()


def test_writes_send_the_current_bearer_token_and_the_user_agent(
    emulator: EmulatorThread,
) -> None:
    """Writes bypass the generated client but authenticate like it: the token is read
    through the Configuration on every request, so its refresh hook can rotate it."""
    configuration = client.Configuration()
    configuration.host = emulator.url
    configuration.api_key = {"authorization": "token-0"}
    configuration.api_key_prefix = {"authorization": "Bearer"}
    refreshed = iter(range(1, 100))

    def refresh(config: client.Configuration) -> None:
        config.api_key["authorization"] = f"token-{next(refreshed)}"

    configuration.refresh_api_key_hook = refresh  # type: ignore[assignment]  # typed as None
    api = client.ApiClient(configuration)
    api.user_agent = "interference-scheduler/test"
    cluster = KubernetesCluster(api, FAST)
    emulator.put("nodes", node_obj("n1"))
    emulator.put("pods", pod("p1"))
    cluster.bind(PodRef("default", "p1"), "n1")
    cluster.record_event(PodRef("default", "p1"), "Normal", "Scheduled", "ok")
    cluster.set_unschedulable(PodRef("default", "p1"), "no")
    seen = emulator.call(
        lambda e: [
            (r.url.path, r.headers.get("Authorization"), r.headers.get("Content-Type"))
            for r in e._requests
            if r.method.value.upper() in ("POST", "PATCH")
        ]
    )
    assert seen == [
        ("/api/v1/namespaces/default/pods/p1/binding", "Bearer token-1", "application/json"),
        (
            "/apis/events.k8s.io/v1/namespaces/default/events",
            "Bearer token-2",
            "application/json",
        ),
        (
            "/api/v1/namespaces/default/pods/p1/status",
            "Bearer token-3",
            "application/strategic-merge-patch+json",
        ),
    ]
    assert set(emulator.user_agents("/binding$|/events$|/status$")) == {
        "interference-scheduler/test"
    }


class _ClosingHandler(http.server.BaseHTTPRequestHandler):
    """Answers a Binding 201 and closes the connection without saying so, as an API
    server (or a load balancer in front of it) does with an idle keep-alive connection.
    ``server.posts`` collects the paths POSTed."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        posts: list[str] = self.server.posts  # type: ignore[attr-defined]  # _binding_server
        posts.append(self.path)
        body = b'{"kind":"Status","status":"Success","code":201}'
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def _binding_server(tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, list[str]]]:
    """A stdlib HTTP(S) server answering Bindings; yields its URL and the paths POSTed."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ClosingHandler)
    posts: list[str] = []
    server.posts = posts  # type: ignore[attr-defined]
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_port}", posts
    finally:
        server.shutdown()
        server.server_close()


def test_writes_reconnect_after_the_server_closed_an_idle_connection() -> None:
    """A kept-alive connection the server has closed is replaced before the next write,
    never used for it (a Binding must not be sent twice, nor fail for nothing)."""
    with _binding_server() as (url, posts):
        cluster = KubernetesCluster(api_client(url), FAST)
        for name in ("p1", "p2", "p3"):
            cluster.bind(PodRef("default", name), "n1")
            time.sleep(0.05)  # let the server's close arrive, as it would while idle
        assert posts == [
            f"/api/v1/namespaces/default/pods/{name}/binding" for name in ("p1", "p2", "p3")
        ]


def test_writes_recover_after_the_server_was_down() -> None:
    """A write that finds its idle connection closed and the server gone fails as
    unavailable; once the server is back on the same port the same thread writes again
    (it must not keep the closed socket: found by tests/e2e's apiserver restart)."""
    with _binding_server() as (url, posts):
        port = int(url.rsplit(":", 1)[1])
        cluster = KubernetesCluster(api_client(url), FAST)
        cluster.bind(PodRef("default", "p1"), "n1")
    time.sleep(0.05)  # the server closed the kept-alive connection and is gone
    for _ in range(2):
        with pytest.raises(ApiUnavailable, match="cannot reach"):
            cluster.bind(PodRef("default", "p2"), "n1")
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), _ClosingHandler)
    server.posts = posts  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        cluster.bind(PodRef("default", "p3"), "n1")
    finally:
        server.shutdown()
        server.server_close()
    assert posts == [f"/api/v1/namespaces/default/pods/{name}/binding" for name in ("p1", "p3")]


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """A certificate for 127.0.0.1 that is its own CA, and its key (made by openssl)."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", key, "-out", cert, "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_writes_over_tls_verify_the_server_with_the_configured_ca(
    self_signed: tuple[str, str],
) -> None:
    cert, key = self_signed
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    with _binding_server(tls) as (url, posts):
        trusting = client.Configuration()
        trusting.host = url
        trusting.ssl_ca_cert = cert
        KubernetesCluster(client.ApiClient(trusting), FAST).bind(PodRef("default", "p1"), "n1")
        assert posts == ["/api/v1/namespaces/default/pods/p1/binding"]

        untrusting = api_client(url)  # the system CAs do not know this certificate
        with pytest.raises(ApiUnavailable, match=r"TLS with the API server .* certificate-auth"):
            KubernetesCluster(untrusting, FAST).bind(PodRef("default", "p2"), "n1")

        unverified = api_client(url)
        unverified.configuration.verify_ssl = False
        KubernetesCluster(unverified, FAST).bind(PodRef("default", "p3"), "n1")
        assert posts[-1] == "/api/v1/namespaces/default/pods/p3/binding"
        assert len(posts) == 2  # the refused handshake sent nothing

        # tls_server_name is beyond our HTTP/1.1 connection: the client's own urllib3 pool sends it.
        named = client.Configuration()
        named.host = url
        named.ssl_ca_cert = cert
        named.tls_server_name = "127.0.0.1"
        KubernetesCluster(client.ApiClient(named), FAST).bind(PodRef("default", "p4"), "n1")
        assert posts[-1] == "/api/v1/namespaces/default/pods/p4/binding"


def test_namespaces_are_listed_and_watched_for_their_labels(
    emulator: EmulatorThread, cluster: KubernetesCluster, informers: Callable[[], RecordingHandler]
) -> None:
    _populate(emulator)
    emulator.put("namespaces", {"metadata": {"name": "team-a", "labels": {"team": "a"}}})
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())
    assert handler.state["Namespace"]["/team-a"]["metadata"]["labels"] == {"team": "a"}
    emulator.put("namespaces", {"metadata": {"name": "team-a", "labels": {"team": "b"}}})
    handler.wait_for(
        lambda h: h.state["Namespace"]["/team-a"]["metadata"]["labels"] == {"team": "b"}
    )
    emulator.delete("namespaces", "", "team-a")
    handler.wait_for(lambda h: "/team-a" not in h.state["Namespace"])


@pytest.mark.parametrize(
    ("kind", "plural", "namespace", "obj"),
    [
        (
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            "shop",
            {"spec": {"volumeName": "pv-1", "accessModes": ["ReadWriteOnce"]}},
        ),
        ("PersistentVolume", "persistentvolumes", "", {"spec": {"local": {"path": "/mnt"}}}),
        ("StorageClass", "storageclasses", "", {"volumeBindingMode": "WaitForFirstConsumer"}),
        ("CSINode", "csinodes", "", {"spec": {"drivers": []}}),
    ],
)
def test_volume_kinds_are_listed_and_watched(
    emulator: EmulatorThread,
    cluster: KubernetesCluster,
    informers: Callable[[], RecordingHandler],
    kind: str,
    plural: str,
    namespace: str,
    obj: dict[str, Any],
) -> None:
    _populate(emulator)
    metadata = {"name": "v1", "labels": {"round": "1"}}
    if namespace:
        metadata["namespace"] = namespace
    emulator.put(plural, {**obj, "metadata": dict(metadata)})
    handler = informers()
    handler.wait_for(lambda h: cluster.synced())
    key = f"{namespace}/v1"
    assert handler.state[kind][key]["metadata"]["labels"] == {"round": "1"}
    emulator.put(plural, {**obj, "metadata": {**metadata, "labels": {"round": "2"}}})
    handler.wait_for(lambda h: h.state[kind][key]["metadata"]["labels"] == {"round": "2"})
    emulator.delete(plural, namespace, "v1")
    handler.wait_for(lambda h: key not in h.state[kind])
