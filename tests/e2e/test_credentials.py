"""Each node speaks only for itself, on the real kube-apiserver and a real redis-server.

The credential issuer (``interference-credentials``, as a process, logged in to the API
server as deploy/'s ``interference-credentials`` ServiceAccount, whose only right is
creating TokenReviews) issues ``agent:NODE`` for pod-bound tokens of deploy/'s agent
ServiceAccount from the TokenRequest API — what the DaemonSet's projected volume holds.
Node A's credentials write A's keys with the agent's real publisher, and every attempt on
node B's data (write, delete, trim, expire, rename, the rankings, B's pods) is refused by
Redis with NOPERM and counted in its ACL LOG, B's data untouched. Tokens of another
ServiceAccount, for another audience, not bound to a pod on a node, bound to a Node object
alone, of a pod on a node that does not exist, or of a deleted pod get 401/403 and create
no user. The real agent process enrols, and enrols again after Redis
lost its users (ACL DELUSER, then a restart)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from interference import acl, keys, sched_record
from interference.signals import NodeMetrics, NodeReport, PodMetrics
from node_agent.credentials import Enrolment, EnrolmentSettings
from node_agent.publisher import PublisherSettings, RedisPublisher
from tests.conftest import RedisServer, free_port, running_redis_server
from tests.e2e.conftest import AGENT_NAMESPACE, NAMESPACE
from tests.e2e.control_plane import ControlPlane, terminate
from tests.e2e.kube import Kube, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.redis]

AUDIENCE = "interference-credentials"
AGENT_SA = "interference-agent"
ISSUER_SA = "interference-credentials"
NODE_A = "cred-node-a"
NODE_B = "cred-node-b"


@dataclass
class Issuer:
    """The ``interference-credentials`` process."""

    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def post(self, token: str | None) -> tuple[int, dict[str, Any]]:
        """``POST /v1/credentials`` with ``token``; (status, JSON answer)."""
        request = urllib.request.Request(self.url + "/v1/credentials", data=b"", method="POST")
        if token is not None:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text: str = answer.read().decode()
            return text

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


def command(name: str) -> list[str]:
    script = Path(sys.executable).parent / name
    return [str(script)]


@pytest.fixture(scope="module")
def redis_store() -> Iterator[RedisServer]:
    with running_redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def created(kube: Kube) -> Iterator[list[str]]:
    """API paths of the objects this module creates, deleted at its end so the session's
    control plane is left as found."""
    paths: list[str] = []
    yield paths
    for path in reversed(paths):
        try:
            kube.request("DELETE", path, {"gracePeriodSeconds": 0})
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise


@pytest.fixture(scope="module")
def nodes(kube: Kube, created: list[str]) -> dict[str, dict[str, Any]]:
    """Nodes A and B, and a pod of the agent's ServiceAccount bound to each (what the
    DaemonSet creates; no kubelet runs them, their tokens are all the test needs)."""
    create_node(kube, created, NODE_A)
    create_node(kube, created, NODE_B)
    return {
        NODE_A: create_pod(kube, created, "agent-a", AGENT_SA, NODE_A),
        NODE_B: create_pod(kube, created, "agent-b", AGENT_SA, NODE_B),
    }


def create_node(kube: Kube, created: list[str], name: str) -> None:
    """A Node no scheduler places pods on (unschedulable, no allocatable, and tainted
    not-ready by admission), so the other e2e tests sharing the control plane never see
    it as room."""
    kube.request("POST", "/api/v1/nodes", {"metadata": {"name": name},
                                           "spec": {"unschedulable": True}})  # fmt: skip
    created.append(f"/api/v1/nodes/{name}")


def create_pod(
    kube: Kube, created: list[str], name: str, service_account: str, node: str = ""
) -> dict[str, Any]:
    # Pod Security "restricted" holds in interference-system: a pod that would pass it.
    restricted = {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        "containers": [
            {"name": "agent", "image": "registry.invalid/agent:1", "securityContext": restricted}
        ],
    }
    if node:
        spec["nodeName"] = node
    namespace = namespace_of(service_account)
    body = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
    pod: dict[str, Any] = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", body)
    created.append(f"/api/v1/namespaces/{namespace}/pods/{name}")
    return pod


def namespace_of(service_account: str) -> str:
    """deploy/ puts the agent's ServiceAccount in its own namespace, the others in ours."""
    return AGENT_NAMESPACE if service_account == AGENT_SA else NAMESPACE


def token(
    plane: ControlPlane,
    service_account: str,
    pod: dict[str, Any] | None,
    audience: str = AUDIENCE,
    seconds: int = 3600,
    bound: dict[str, Any] | None = None,
) -> str:
    """A TokenRequest token of ``service_account``, bound to ``pod`` when given (what the
    kubelet puts in a projected volume), or to the object ``bound`` (a Node)."""
    spec: dict[str, Any] = {"audiences": [audience], "expirationSeconds": seconds}
    target = pod if pod is not None else bound
    if target is not None:
        meta = target["metadata"]
        spec["boundObjectRef"] = {
            "kind": target.get("kind", "Pod"), "apiVersion": "v1", "name": meta["name"],
            "uid": meta["uid"],
        }  # fmt: skip
    answer = plane.request(
        "POST",
        f"/api/v1/namespaces/{namespace_of(service_account)}/serviceaccounts/{service_account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
    )
    return str(answer["status"]["token"])


@pytest.fixture(scope="module")
def issuer(
    control_plane: ControlPlane, redis_store: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Issuer]:
    """``interference-credentials`` as deploy/'s issuer ServiceAccount (TokenReview only),
    writing users to the test's Redis, on a free loopback port."""
    workdir = tmp_path_factory.mktemp("issuer")
    kubeconfig = _issuer_kubeconfig(control_plane, workdir)
    port = free_port()
    env = {
        "PATH": os.environ["PATH"],
        "REDIS_URL": redis_store.url,
        "HTTP_ADDRESS": "127.0.0.1",
        "HTTP_PORT": str(port),
        "KUBECONFIG": str(kubeconfig),
        "LOG_LEVEL": "INFO",
        "AGENT_SERVICE_ACCOUNT": deployed_agent_service_account(),
    }
    log_path = workdir / "issuer.log"
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            command("interference-credentials"), env=env, stdout=log, stderr=subprocess.STDOUT
        )
    running = Issuer(f"http://127.0.0.1:{port}", proc, log_path)
    try:
        wait_for(lambda: _ready(running), "the issuer to answer /readyz", 30)
        yield running
    finally:
        terminate(proc)
        print("--- issuer log ---\n" + running.log()[-6000:])


def deployed_agent_service_account() -> str:
    """``AGENT_SERVICE_ACCOUNT`` as deploy/'s issuer Deployment sets it."""
    from tests.deploy.manifests import DEPLOY, container, find, render

    issuer = container(find(render(DEPLOY), "Deployment", "interference-credentials"), "issuer")
    (value,) = [e["value"] for e in issuer["env"] if e["name"] == "AGENT_SERVICE_ACCOUNT"]
    assert value == f"{AGENT_NAMESPACE}/{AGENT_SA}"
    return str(value)


def _issuer_kubeconfig(plane: ControlPlane, workdir: Path) -> Path:
    """A kubeconfig holding a plain TokenRequest token of the issuer's ServiceAccount."""
    issued = plane.service_account_token(NAMESPACE, ISSUER_SA)
    return plane.kubeconfig(workdir / "issuer.kubeconfig", issued, "issuer")


def _ready(issuer: Issuer) -> bool:
    assert issuer.proc.poll() is None, f"the issuer exited: {issuer.log()[-2000:]}"
    try:
        with urllib.request.urlopen(issuer.url + "/readyz", timeout=5) as answer:
            return answer.status == 200
    except OSError:
        return False


def agent_users(server: RedisServer) -> list[str]:
    users: list[str] = server.client().execute_command("ACL", "USERS")
    return sorted(u for u in users if u.startswith(acl.USERNAME_PREFIX))


def report(node: str, pods: list[PodMetrics] | None = None) -> NodeReport:
    return NodeReport(
        node=node,
        ts=time.time(),
        interval_s=1.0,
        metrics=NodeMetrics(runq_p99_us=800.0, runq_wait_ratio=0.1),
        histograms={"runq_us": [0, 3, 9, 4, 1]},
        pods=pods or [],
        measured=("runq",),
    )


def publisher_as(redis_store: RedisServer, username: str, password: str) -> RedisPublisher:
    return RedisPublisher(
        PublisherSettings(redis_url=redis_store.url, username=username, password=password)
    )


def test_node_a_writes_only_its_own_keys(
    control_plane: ControlPlane,
    nodes: dict[str, dict[str, Any]],
    issuer: Issuer,
    redis_store: RedisServer,
) -> None:
    admin = redis_store.client()
    raw = redis.Redis(port=redis_store.port)  # binary values: records, DUMP
    status, issued_a = issuer.post(token(control_plane, AGENT_SA, nodes[NODE_A]))
    assert status == 200, issued_a
    assert issued_a["node"] == NODE_A and issued_a["username"] == f"agent:{NODE_A}"
    status, issued_b = issuer.post(token(control_plane, AGENT_SA, nodes[NODE_B]))
    assert status == 200 and issued_b["username"] == f"agent:{NODE_B}"

    # Both agents publish with the real publisher: B first, so there is data of B to attack.
    pod_b = PodMetrics(namespace="shop", name="api-0", uid="u-b", cpu_ms_per_s=100.0)
    pub_b = publisher_as(redis_store, issued_b["username"], issued_b["password"])
    pub_a = publisher_as(redis_store, issued_a["username"], issued_a["password"])
    try:
        assert pub_b.publish(report(NODE_B, [pod_b]))
        assert pub_a.publish(report(NODE_A, [PodMetrics(namespace="ml", name="t", uid="u-a")]))
        assert pub_a.publish(report(NODE_A))  # the departed pod's SREM too
    finally:
        pub_a.close()
        pub_b.close()
    record = raw.get(keys.sched_key(NODE_A))
    assert record is not None
    assert sched_record.decode(record)["node_id"] == sched_record.node_id(NODE_A)
    before_b = {key: raw.dump(key) for key in raw.keys(f"intf:node:{NODE_B}*")}
    assert keys.pod_key(NODE_B, "shop", "api-0").encode() in before_b
    assert keys.sched_key(NODE_B).encode() in before_b
    admin.zadd(keys.NODES_BY_INDEX, {NODE_B: 10.0})

    # As A, every way to change, delete or trim B's data — each refused by Redis.
    admin.execute_command("ACL", "LOG", "RESET")
    denied_before = _denied(admin)
    a = redis.Redis(
        port=redis_store.port, username=issued_a["username"], password=issued_a["password"]
    )
    b_sched, b_hash = keys.sched_key(NODE_B), keys.node_key(NODE_B)
    attempts: list[tuple[str, Callable[[], object]]] = [
        ("set", lambda: a.set(b_sched, sched_record.encode(report(NODE_A)), ex=5)),
        ("hset", lambda: a.hset(b_hash, "runq_p99_us", "0")),
        ("del", lambda: a.delete(b_sched, b_hash)),
        ("xadd", lambda: a.xadd(keys.reports_key(NODE_B), {"r": b"x"}, maxlen=0)),
        ("expire", lambda: a.expire(keys.gpu_key(NODE_B), 1)),
        ("srem", lambda: a.srem(keys.node_pods_key(NODE_B), "shop/api-0")),
        ("sadd", lambda: a.sadd(keys.node_pods_key(NODE_B), "x/forged")),
        ("hset", lambda: a.hset(keys.pod_key(NODE_B, "shop", "api-0"), "cpu_ms_per_s", "0")),
        ("del", lambda: a.delete(keys.pod_key(NODE_B, "shop", "api-0"))),
        ("zadd", lambda: a.zadd(keys.NODES_BY_INDEX, {NODE_B: 100.0})),
        ("zrem", lambda: a.zrem(keys.NODES_BY_INDEX, NODE_B)),
        ("rename", lambda: a.rename(keys.sched_key(NODE_A), b_sched)),
        ("set", lambda: a.set(keys.sched_key("cred-node-new"), b"forged")),
        ("flushall", lambda: a.flushall()),
        ("acl", lambda: a.execute_command("ACL", "SETUSER", f"agent:{NODE_A}", "+@all")),
    ]
    for name, attempt in attempts:
        with pytest.raises(redis.exceptions.NoPermissionError):
            attempt()
        assert name  # the table names what was tried, for a failing run's traceback
    a.close()

    # Counted by Redis: one ACL LOG entry per refused attempt, all of user agent:A.
    entries = admin.acl_log(100)
    # (redis-py names itself with CLIENT SETINFO on connect, which Redis ≥ 7.2 refuses
    # to every agent user and logs too: not an attempt on B's data.)
    setinfo = sum(
        int(_field(e, "count")) for e in entries if _field(e, "object") == "client|setinfo"
    )
    mine = [e for e in entries if _field(e, "username") == f"agent:{NODE_A}"
            and _field(e, "object") != "client|setinfo"]  # fmt: skip
    assert sum(int(_field(e, "count")) for e in mine) == len(attempts)
    assert {_field(e, "reason") for e in mine} == {"key", "command"}
    touched = {_field(e, "object") for e in mine if _field(e, "reason") == "key"}
    assert {b_sched, b_hash, keys.reports_key(NODE_B)} <= touched
    denied_after = _denied(admin)
    if denied_before is not None and denied_after is not None:  # INFO has them from 7.2
        assert denied_after - denied_before == len(attempts) + setinfo
    # ...and B's data is exactly as B wrote it.
    assert {key: raw.dump(key) for key in raw.keys(f"intf:node:{NODE_B}*")} == before_b
    assert admin.zscore(keys.NODES_BY_INDEX, NODE_B) == 10.0
    assert not admin.exists(keys.sched_key("cred-node-new"))


def _field(entry: Any, name: str) -> Any:
    """One field of an ``ACL LOG`` entry (redis-py returns a dict, or a flat list)."""
    if isinstance(entry, dict):
        return entry[name]
    pairs = dict(zip(entry[::2], entry[1::2], strict=True))
    return pairs[name]


def _denied(admin: redis.Redis[str]) -> int | None:
    """Commands Redis refused for a key or a command since it started (INFO stats of
    Redis ≥ 7.2; None before)."""
    stats = admin.info("stats")
    if "acl_access_denied_key" not in stats:
        return None
    return int(stats["acl_access_denied_key"]) + int(stats["acl_access_denied_cmd"])


@pytest.mark.parametrize(
    ("case", "status", "reason"),
    [
        ("another ServiceAccount's pod on node A", 403, "wrong_service_account"),
        ("the agent's token for another audience", 401, "unauthenticated"),
        ("the agent's token bound to no pod", 403, "no_node_claim"),
        ("the agent's token of a pod on no node", 403, "no_node_claim"),
        ("the agent's token of a deleted pod", 401, "unauthenticated"),
        ("the agent's token bound to a Node object, no pod", 403, "no_pod_claim"),
        ("the agent's token of a pod on a node that does not exist", 403, "unknown_node"),
        ("a token whose claims were altered", 401, "unauthenticated"),
        ("no token", 401, "no_token"),
    ],
)
def test_tokens_that_do_not_name_an_agents_node_get_nothing(
    control_plane: ControlPlane,
    kube: Kube,
    created: list[str],
    nodes: dict[str, dict[str, Any]],
    issuer: Issuer,
    redis_store: RedisServer,
    case: str,
    status: int,
    reason: str,
) -> None:
    suffix = f"{abs(hash(case)) % 10**8}"
    presented: str | None
    if case.startswith("another ServiceAccount"):
        pod = create_pod(kube, created, f"sched-{suffix}", "interference-scheduler", NODE_A)
        presented = token(control_plane, "interference-scheduler", pod)
    elif case.endswith("another audience"):
        presented = token(control_plane, AGENT_SA, nodes[NODE_A], audience="kubernetes")
    elif case.endswith("bound to no pod"):
        presented = token(control_plane, AGENT_SA, None)
    elif case.endswith("Node object, no pod"):
        node = kube.request("GET", f"/api/v1/nodes/{NODE_A}", None)
        presented = token(control_plane, AGENT_SA, None, bound=node)
    elif case.endswith("node that does not exist"):
        pod = create_pod(kube, created, f"ghost-{suffix}", AGENT_SA, "cred-no-such-node")
        presented = token(control_plane, AGENT_SA, pod)
    elif case.endswith("on no node"):
        pod = create_pod(kube, created, f"pending-{suffix}", AGENT_SA)
        presented = token(control_plane, AGENT_SA, pod)
    elif case.endswith("deleted pod"):
        pod = create_pod(kube, created, f"gone-{suffix}", AGENT_SA, NODE_A)
        presented = token(control_plane, AGENT_SA, pod)
        kube.delete_pod(AGENT_NAMESPACE, f"gone-{suffix}")
        wait_for(lambda: not _pod_exists(kube, f"gone-{suffix}"), "the pod to be deleted")
    elif case.startswith("a token whose claims"):
        genuine = token(control_plane, AGENT_SA, nodes[NODE_A])
        head, claims, signature = genuine.split(".")
        presented = f"{head}.{claims[:-4]}AAAA.{signature}"  # altered claims: signature fails
    else:
        presented = None
    users_before = agent_users(redis_store)
    refused_before = _refused(issuer, reason)
    got, answer = issuer.post(presented)
    assert (got, answer["error"]) == (status, reason), answer
    assert "password" not in answer
    assert agent_users(redis_store) == users_before
    assert _refused(issuer, reason) == refused_before + 1


CUT_OFF_NODE = "cred-node-cut-off"


def test_a_node_cut_off_by_the_warden_gets_a_warning_event_on_its_node_object(
    control_plane: ControlPlane, kube: Kube, created: list[str], issuer: Issuer,
    redis_store: RedisServer,
) -> None:  # fmt: skip
    """A node of its own (a cut-off node gets no password for the cool-down): its agent
    sets its record without expiry, the warden cuts it off, and the issuer — with deploy/'s
    RBAC, nothing more — records why on the Node, where ``kubectl describe node`` shows it."""
    create_node(kube, created, CUT_OFF_NODE)
    pod = create_pod(kube, created, "agent-cut-off", AGENT_SA, CUT_OFF_NODE)
    status, issued = issuer.post(token(control_plane, AGENT_SA, pod))
    assert status == 200, issued
    bad = redis.Redis(
        port=redis_store.port, username=issued["username"], password=issued["password"]
    )
    try:
        bad.set(keys.sched_key(CUT_OFF_NODE), b"x" * 100)  # no EX: the agent always sets one
    finally:
        bad.close()

    def node_events() -> list[dict[str, Any]]:
        listed = kube.request(
            "GET",
            "/apis/events.k8s.io/v1/namespaces/default/events"
            f"?fieldSelector=regarding.kind=Node,regarding.name={CUT_OFF_NODE}",
        )
        return [e for e in listed["items"] if e.get("reason") == "InterferenceAgentCutOff"]

    wait_for(lambda: bool(node_events()), "the cut-off's Event on the Node", 30)
    (event,) = node_events()
    created.append(f"/apis/events.k8s.io/v1/namespaces/default/events/{event['metadata']['name']}")
    assert event["type"] == "Warning"
    assert event["reportingController"] == "interference.io/credential-issuer"
    assert "no_expiry" in event["note"] and CUT_OFF_NODE in event["note"], event["note"]
    assert f"agent:{CUT_OFF_NODE}" not in agent_users(redis_store) or "off" in (
        redis_store.client().acl_getuser(f"agent:{CUT_OFF_NODE}") or {}
    ).get("flags", [])
    assert "interference_credentials_node_events_written_total 1.0" in issuer.metrics()


def _pod_exists(kube: Kube, name: str) -> bool:
    try:
        kube.pod(AGENT_NAMESPACE, name)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise
    return True


def _refused(issuer: Issuer, reason: str) -> float:
    prefix = f'interference_credentials_refused_total{{reason="{reason}"}} '
    for line in issuer.metrics().splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise AssertionError(f"no {prefix!r} in the issuer's metrics")


def test_the_agent_enrols_and_enrols_again_when_redis_loses_its_users(
    control_plane: ControlPlane,
    kube: Kube,
    created: list[str],
    issuer: Issuer,
    redis_store: RedisServer,
    tmp_path: Path,
) -> None:
    """The real ``interference-agent`` process with the DaemonSet's way of getting
    credentials (CREDENTIALS_URL, TOKEN_FILE): it publishes as agent:NODE, and after Redis
    forgot the user (ACL DELUSER; then a restart, which loses users and data) it enrols
    again and publishes again."""
    node = "cred-node-c"
    create_node(kube, created, node)
    pod = create_pod(kube, created, "agent-c", AGENT_SA, node)
    token_path = tmp_path / "token"
    token_path.write_text(token(control_plane, AGENT_SA, pod))
    # The library path first: an Enrolment from the token file names this node's user.
    enrolment = Enrolment(EnrolmentSettings(url=issuer.url, token_file=str(token_path)), node)
    assert enrolment.attempt(), enrolment.problem()
    assert enrolment.credentials() is not None
    assert enrolment.credentials().username == f"agent:{node}"  # type: ignore[union-attr]

    env = {
        "PATH": os.environ["PATH"],
        "NODE_NAME": node,
        "REDIS_URL": redis_store.url,
        "CREDENTIALS_URL": issuer.url,
        "TOKEN_FILE": str(token_path),
        "INTERVAL_S": "0.5",
        "HTTP_ADDRESS": "127.0.0.1",
        "HTTP_PORT": str(free_port()),
        "LOG_LEVEL": "INFO",
    }
    log_path = tmp_path / "agent.log"
    started = time.time()
    with log_path.open("ab") as log:
        agent = subprocess.Popen(
            [*command("interference-agent"), "--no-kubernetes", "--probes", "psi"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    admin = redis_store.client()

    def published_since(moment: float) -> bool:
        raw = redis.Redis(port=redis_store.port).get(keys.sched_key(node))
        return raw is not None and sched_record.decode(raw)["ts"] > moment

    try:
        wait_for(lambda: published_since(started), "the agent's first report", 30)
        assert agent_users(redis_store).count(f"agent:{node}") == 1
        # Redis forgets the user (what a restart does to runtime users).
        admin.execute_command("ACL", "DELUSER", f"agent:{node}")
        forgotten = time.time()
        wait_for(lambda: published_since(forgotten), "a report after ACL DELUSER", 30)
        assert f"agent:{node}" in agent_users(redis_store)
        # A real restart: users and data gone.
        redis_store.stop()
        redis_store.start()
        restarted = time.time()
        wait_for(lambda: published_since(restarted), "a report after Redis restarted", 40)
        assert agent.poll() is None
        metrics_url = f"http://127.0.0.1:{env['HTTP_PORT']}/metrics"
        with urllib.request.urlopen(metrics_url, timeout=10) as answer:
            exposed = answer.read().decode()
        counted = {
            event: float(line.rsplit(" ", 1)[1])
            for line in exposed.splitlines()
            for event in ("issued", "refused_by_redis")
            if line.startswith(f'interference_agent_credentials_total{{event="{event}"}}')
        }
        assert counted["issued"] >= 3 and counted["refused_by_redis"] >= 2, counted
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGTERM)
            try:
                agent.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait(5)
        print("--- agent log ---\n" + log_path.read_text(errors="replace")[-6000:])
    text = log_path.read_text(errors="replace")
    assert text.count(f"enrolled: writing to Redis as agent:{node}") >= 3, text[-3000:]
    assert "Traceback" not in text
