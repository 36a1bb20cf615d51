"""Pod directories: the static file format, and the real kubernetes client against kmock."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from kubernetes import client

from interference_infra.strict import SettingsError
from node_agent.pods import (
    KubernetesPodDirectory,
    PodWatchSettings,
    StaticPodDirectory,
)
from tests.conftest import free_port

FAST = PodWatchSettings(
    watch_timeout_s=5, read_timeout_s=1.0, backoff_initial_s=0.05, backoff_max_s=0.2,
    deleted_grace_s=0.0,
)  # fmt: skip


# -- StaticPodDirectory -----------------------------------------------------------------
def test_static_directory_from_yaml_and_json(tmp_path: Path) -> None:
    yaml_file = tmp_path / "pods.yaml"
    yaml_file.write_text('"0F5C-UID-1": team-a/trainer-0\nuid-2: "kube-system/coredns-x"\n')
    json_file = tmp_path / "pods.json"
    json_file.write_text('{"uid-3": "default/web-1"}')
    from_yaml = StaticPodDirectory.from_file(yaml_file)
    assert from_yaml.lookup("0f5c-uid-1") == ("team-a", "trainer-0")
    assert from_yaml.lookup("uid-2") == ("kube-system", "coredns-x")
    assert from_yaml.lookup("uid-3") is None
    assert StaticPodDirectory.from_file(json_file).lookup("uid-3") == ("default", "web-1")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert StaticPodDirectory.from_file(empty).lookup("uid-3") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "must hold a mapping"),
        ("uid-1: no-slash\n", "'uid-1'.*not \"namespace/name\""),
        ("uid-1: a/b/c\n", 'not "namespace/name"'),
        ("uid-1: 42\n", 'not "namespace/name"'),
        ("uid-1: [unclosed\n", "not valid YAML/JSON"),
    ],
)
def test_static_directory_file_errors(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pods.yaml"
    path.write_text(text)
    with pytest.raises(SettingsError, match=message):
        StaticPodDirectory.from_file(path)


def test_static_directory_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="cannot read"):
        StaticPodDirectory.from_file(tmp_path / "absent.yaml")


# -- KubernetesPodDirectory against the kmock emulator -------------------------------------
class Emulator:
    """kmock's Kubernetes emulator served from its own event loop in a thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.handler: Any = None
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),))

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with kmock.KubernetesEmulator() as handler, kmock.Server(handler) as server:
            self.handler = handler
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Emulator:
        self._thread.start()
        assert self._ready.wait(10), "kmock did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def core_api(url: str) -> client.CoreV1Api:
    configuration = client.Configuration()
    configuration.host = url
    return client.CoreV1Api(client.ApiClient(configuration))


def pod(namespace: str, name: str, uid: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": namespace, "name": name, "uid": uid},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "busybox"}]},
    }


def eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


@pytest.fixture
def emulator() -> Iterator[Emulator]:
    with Emulator() as running:
        yield running


def test_lists_then_watches_pods_of_this_node(emulator: Emulator) -> None:
    api = core_api(emulator.url)
    api.create_namespaced_pod("team-a", pod("team-a", "trainer-0", "uid-a0", "node-a"))
    api.create_namespaced_pod("team-b", pod("team-b", "other-0", "uid-b0", "node-b"))
    directory = KubernetesPodDirectory(api, "node-a", FAST)
    directory.start()
    try:
        assert directory.wait_synced(10)
        assert directory.lookup("uid-a0") == ("team-a", "trainer-0")
        assert directory.lookup("uid-b0") is None  # another node's pod

        api.create_namespaced_pod("team-a", pod("team-a", "trainer-1", "uid-a1", "node-a"))
        assert eventually(lambda: directory.lookup("uid-a1") == ("team-a", "trainer-1"))

        api.delete_namespaced_pod("trainer-0", "team-a")
        assert eventually(lambda: directory.lookup("uid-a0") is None)
        assert directory.errors == 0
    finally:
        directory.stop()
    pod_requests = emulator.handler[kmock.resource("v1/pods")]
    selectors = {r.params.get("fieldSelector") for r in pod_requests if r.method == "GET"}
    assert selectors == {"spec.nodeName=node-a"}


def test_a_watched_pod_carries_its_tolerance(emulator: Emulator) -> None:
    """The tolerance annotations the agent shows on /metrics: from the list, then from the
    watch, gone with the pod."""
    from node_agent.tolerances import PodTolerance

    api = core_api(emulator.url)
    listed = pod("ns", "api-0", "uid-t0", "node-a")
    listed["metadata"]["annotations"] = {"interference.io/max-runq-p99-us": "800"}
    api.create_namespaced_pod("ns", listed)
    directory = KubernetesPodDirectory(api, "node-a", FAST)
    directory.start()
    try:
        assert directory.wait_synced(10)
        assert directory.tolerance("uid-t0") == PodTolerance(max_runq_p99_us=800)
        watched = pod("ns", "api-1", "uid-t1", "node-a")
        watched["metadata"]["annotations"] = {"interference.io/max-index": "30"}
        api.create_namespaced_pod("ns", watched)
        assert eventually(lambda: directory.tolerance("uid-t1") == PodTolerance(max_index=30))
        api.delete_namespaced_pod("api-0", "ns")
        assert eventually(lambda: directory.tolerance("uid-t0") is None)
    finally:
        directory.stop()


def test_unreachable_api_server_backs_off_and_keeps_running() -> None:
    api = core_api(f"http://127.0.0.1:{free_port()}")
    directory = KubernetesPodDirectory(api, "node-a", FAST)
    directory.start()
    try:
        assert not directory.wait_synced(1.0)
        assert eventually(lambda: directory.errors >= 3)
        assert directory._thread is not None and directory._thread.is_alive()
        assert directory.lookup("anything") is None
    finally:
        directory.stop()
    assert not directory._thread.is_alive()


def test_expired_resource_version_relists(emulator: Emulator) -> None:
    """An ERROR 410 event in the watch stream makes the directory list again."""
    api = core_api(emulator.url)
    api.create_namespaced_pod("ns", pod("ns", "web-0", "uid-w0", "node-a"))
    directory = KubernetesPodDirectory(api, "node-a", FAST)
    directory.start()
    try:
        assert directory.wait_synced(10)
        # kmock has no resourceVersion history, so publish the API server's 410 event on the
        # emulator's pods event bus, which feeds every open pods watch.
        assert eventually(lambda: any("pods" in str(key) for key in emulator.handler._buses))
        bus = next(bus for key, bus in emulator.handler._buses.items() if "pods" in str(key))
        gone = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410,
                "reason": "Expired", "message": "too old resource version: 1 (42)"}  # fmt: skip

        def send_gone() -> bool:
            # kmock hands an event only to the watches open at that moment: send it until
            # one has taken it.
            asyncio.run_coroutine_threadsafe(
                bus.put({"type": "ERROR", "object": gone}), emulator.loop
            ).result(5)
            return directory.relists >= 2

        assert eventually(send_gone)
        assert directory.lookup("uid-w0") == ("ns", "web-0")
        assert directory.errors == 0  # a 410 is routine, not an error
    finally:
        directory.stop()
