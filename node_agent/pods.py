"""Pod UID → (namespace, name) for the pods on this node.

:class:`KubeletPodDirectory` (the DaemonSet's) asks this node's kubelet for its pods
(``GET /pods`` on its authenticated port, authorised as ``get nodes/pods``): the agent
needs no pod list in the API server, where RBAC cannot hold a list to one node's pods.
:class:`KubernetesPodDirectory` lists and watches the pods bound to this node
(``fieldSelector=spec.nodeName=NODE``) through the API server with the ``kubernetes``
client, for an agent run with a kubeconfig: it resumes watches from the last
resourceVersion, relists on ``410 Gone``, backs off on errors and never lets an exception
end the thread. :class:`StaticPodDirectory` is a fixed mapping for tests and the demo.
Without either the agent names pods by UID (see :func:`kubernetes_directory_from_environment`).
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from interference_infra.kube_watch import Backoff, Gone, list_and_watch
from interference_infra.strict import SettingsError

log = logging.getLogger(__name__)


class PodDirectory(Protocol):
    """Looks up the namespace and name of a pod on this node by its UID."""

    def lookup(self, uid: str) -> tuple[str, str] | None:
        """``(namespace, name)``, or ``None`` when the UID is unknown."""


class StaticPodDirectory:
    """A fixed ``{uid: (namespace, name)}`` mapping (tests, demo, hosts without an API)."""

    def __init__(
        self,
        pods: Mapping[str, tuple[str, str]] | None = None,
        degradable: frozenset[str] = frozenset(),
    ) -> None:
        self._pods = {uid.lower(): ref for uid, ref in (pods or {}).items()}
        self._degradable = frozenset(uid.lower() for uid in degradable)

    def degradable(self, uid: str) -> bool:
        """Whether the pod was given as degradable (:data:`DEGRADABLE_ANNOTATION`)."""
        return uid.lower() in self._degradable

    def lookup(self, uid: str) -> tuple[str, str] | None:
        """``(namespace, name)`` for a known UID, else ``None``."""
        return self._pods.get(uid.lower())

    @classmethod
    def from_file(cls, path: str | Path) -> StaticPodDirectory:
        """Load a YAML or JSON file holding ``{uid: "namespace/name"}``.

        Raises :class:`~interference_infra.strict.SettingsError` (``--pods-file`` is a
        setting) saying which entry is wrong and why.
        """
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SettingsError(f"cannot read pod directory file {path}: {exc}") from exc
        try:
            # YAML is a superset of JSON, so one parser reads both.
            data: Any = yaml.safe_load(text) if text.strip() else {}
        except yaml.YAMLError as exc:
            raise SettingsError(f"{path} is not valid YAML/JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise SettingsError(
                f'{path} must hold a mapping {{uid: "namespace/name"}}, got {type(data).__name__}'
            )
        pods: dict[str, tuple[str, str]] = {}
        for uid, ref in data.items():
            namespace, _, name = str(ref).partition("/")
            if not isinstance(ref, str) or not namespace or not name or "/" in name:
                raise SettingsError(
                    f'{path}: entry {uid!r}: {json.dumps(ref)} is not "namespace/name"'
                )
            pods[str(uid)] = (namespace, name)
        return cls(pods)


@dataclass(frozen=True)
class PodWatchSettings:
    """How :class:`KubernetesPodDirectory` talks to the API server."""

    watch_timeout_s: int = 300
    """Server-side timeout of one watch request; the watch is then resumed."""
    read_timeout_s: float = 30.0
    """Client-side read timeout; an idle stream is reopened after this long."""
    backoff_initial_s: float = 1.0
    """First wait after an error; doubles on each consecutive error."""
    backoff_max_s: float = 30.0
    """Longest wait between retries."""
    deleted_grace_s: float = 60.0
    """Deleted pods stay known this long, so their last interval is still attributed."""


class _NodePods:
    """The pods of one node by UID, with deleted ones kept ``deleted_grace_s`` so their
    last interval is still attributed (shared by the kubelet and API directories)."""

    def __init__(self, deleted_grace_s: float, clock: Callable[[], float]) -> None:
        self._grace_s = deleted_grace_s
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, tuple[str, str]] = {}
        self._deleted_at: dict[str, float] = {}

    def lookup(self, uid: str) -> tuple[str, str] | None:
        """``(namespace, name)`` of a pod on this node (or deleted within the grace)."""
        with self._lock:
            self._forget_expired()
            return self._pods.get(uid)

    def deleted_since(self, uid: str) -> float | None:
        """When the pod ``uid`` was seen deleted (clock time), ``None`` while it exists or
        once forgotten."""
        with self._lock:
            return self._deleted_at.get(uid)

    def replace_all(self, pods: Mapping[str, tuple[str, str]]) -> None:
        """A full listing: ``pods`` exist, every other known pod was deleted now."""
        with self._lock:
            gone = set(self._pods) - set(pods)
            self._pods.update(pods)
            for uid in pods:
                self._deleted_at.pop(uid, None)
            now = self._clock()
            for uid in gone:
                self._deleted_at.setdefault(uid, now)

    def put(self, uid: str, ref: tuple[str, str]) -> None:
        with self._lock:
            self._pods[uid] = ref
            self._deleted_at.pop(uid, None)

    def mark_deleted(self, uid: str) -> None:
        with self._lock:
            if uid in self._pods:
                self._deleted_at.setdefault(uid, self._clock())

    def _forget_expired(self) -> None:
        horizon = self._clock() - self._grace_s
        for uid in [uid for uid, at in self._deleted_at.items() if at <= horizon]:
            del self._deleted_at[uid]
            self._pods.pop(uid, None)


class KubernetesPodDirectory:
    """Pods on ``node_name``, listed and then watched in a daemon thread.

    ``api`` is a ``kubernetes.client.CoreV1Api``. Errors are logged (once per streak,
    then at DEBUG) and retried with exponential backoff; ``410 Gone`` relists at once.
    """

    def __init__(
        self,
        api: Any,
        node_name: str,
        settings: PodWatchSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._node = node_name
        self._settings = settings or PodWatchSettings()
        self._known = _NodePods(self._settings.deleted_grace_s, clock)
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.relists = 0
        """Number of full lists done (the first one included)."""
        self.errors = 0
        """Number of failed list/watch requests."""

    # -- PodDirectory ---------------------------------------------------------------
    def lookup(self, uid: str) -> tuple[str, str] | None:
        """``(namespace, name)`` of a pod on this node (or deleted within the grace)."""
        return self._known.lookup(uid)

    def deleted_since(self, uid: str) -> float | None:
        """When the pod ``uid`` was seen deleted (clock time), ``None`` while it exists or
        once forgotten."""
        return self._known.deleted_since(uid)

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Start the list+watch thread (returns at once; see :meth:`wait_synced`)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()

    def wait_synced(self, timeout_s: float) -> bool:
        """Whether the first list completed within ``timeout_s``."""
        return self._synced.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to stop and wait for it up to ``timeout_s``."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    # -- the loop (interference_infra.kube_watch runs it) ----------------------------
    def _run(self) -> None:
        from kubernetes.client.exceptions import ApiException  # lazy: optional at import
        from urllib3.exceptions import HTTPError

        list_and_watch(
            self,
            self._stopping,
            Backoff(self._settings.backoff_initial_s, self._settings.backoff_max_s),
            name=f"pod list/watch for node {self._node}",
            expected=(ApiException, HTTPError, OSError),
            hint="pods keep being reported by UID meanwhile; check the API server address "
            "and the agent's RBAC (list/watch pods)",
            logger=log,
            on_failure=self._count_failure,
        )

    def _count_failure(self, _error: Exception) -> None:
        self.errors += 1

    def relist(self) -> str:
        """List the pods on this node; the list's resourceVersion."""
        with _gone_on_410():
            pod_list = self._api.list_pod_for_all_namespaces(
                field_selector=f"spec.nodeName={self._node}",
                _request_timeout=self._settings.read_timeout_s,
            )
        pods = {
            pod.metadata.uid: (pod.metadata.namespace, pod.metadata.name)
            for pod in pod_list.items
            if self._on_this_node(pod)
        }
        self._known.replace_all(pods)
        self.relists += 1
        self._synced.set()
        return str(pod_list.metadata.resource_version or "")

    def follow(self, resource_version: str, stop: threading.Event) -> tuple[str, int]:
        """Apply pod events from ``resource_version`` until the watch ends."""
        from kubernetes import watch

        stream = watch.Watch()  # type: ignore[no-untyped-call]
        events = 0
        try:
            for event in stream.stream(  # type: ignore[no-untyped-call]
                self._api.list_pod_for_all_namespaces,
                field_selector=f"spec.nodeName={self._node}",
                resource_version=resource_version or None,
                allow_watch_bookmarks=True,
                timeout_seconds=self._settings.watch_timeout_s,
                _request_timeout=self._settings.read_timeout_s,
            ):
                if stop.is_set():
                    stream.stop()  # type: ignore[no-untyped-call]
                    break
                events += 1
                self._apply(event["type"], event["object"])
                resource_version = stream.resource_version or resource_version
        except Exception as exc:
            if not _is_read_timeout(exc):
                with _gone_on_410():
                    raise
            # an idle stream: the loop reopens it from the same resourceVersion
        return resource_version, events

    def _apply(self, kind: str, pod: Any) -> None:
        if kind == "BOOKMARK" or not hasattr(pod, "metadata") or pod.metadata is None:
            return
        uid = pod.metadata.uid
        if kind == "DELETED" or not self._on_this_node(pod):
            self._known.mark_deleted(uid)
        else:
            self._known.put(uid, (pod.metadata.namespace, pod.metadata.name))

    def _on_this_node(self, pod: Any) -> bool:
        # The field selector already filters server-side; this guards against servers
        # (and emulators) that ignore it.
        return bool(pod.spec is not None and pod.spec.node_name == self._node)


@contextmanager
def _gone_on_410() -> Iterator[None]:
    """The API server's 410 raised as :class:`Gone` (relist), anything else as it is."""
    from kubernetes.client.exceptions import ApiException

    try:
        yield
    except ApiException as exc:
        if exc.status == 410:
            raise Gone(exc.reason or "410 Gone") from exc
        raise


def _is_read_timeout(exc: Exception) -> bool:
    from urllib3.exceptions import ReadTimeoutError

    return isinstance(exc, ReadTimeoutError) or isinstance(
        getattr(exc, "reason", None), ReadTimeoutError
    )


SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"

KUBELET_PERMISSION = ("", "nodes/pods", "get")
"""What the kubelet checks for ``GET /pods`` (API group, resource/subresource, verb):
fine-grained kubelet authorisation, Kubernetes >= 1.33 (GA in 1.36); older kubelets ask
for ``nodes/proxy`` instead, which the agent is not given."""


@dataclass(frozen=True)
class KubeletSettings:
    """How :class:`KubeletPodDirectory` asks this node's kubelet for its pods."""

    url: str
    """The kubelet's authenticated endpoint, ``https://NODE_IP:10250`` (``KUBELET_URL``)."""
    token_file: str = SERVICE_ACCOUNT_TOKEN
    """Bearer token the kubelet reviews with the API server (the ServiceAccount's)."""
    ca_file: str | None = None
    """CA of the kubelet's serving certificate (``KUBELET_CA_FILE``); None: not verified,
    because most kubelets serve a self-signed certificate (the address is this node's own)."""
    poll_interval_s: float = 30.0
    """Full listing at least this often (deletions are seen within it)."""
    min_interval_s: float = 5.0
    """A UID nobody knows asks for a listing at once, but not more often than this."""
    timeout_s: float = 10.0
    deleted_grace_s: float = 60.0
    """Deleted pods stay known this long, so their last interval is still attributed."""
    backoff_max_s: float = 30.0
    """Longest wait between attempts while the kubelet refuses or is away."""


class KubeletPodDirectory:
    """Pods on this node from its kubelet's ``GET /pods``, polled in a daemon thread.

    The kubelet has no watch: the directory lists every ``poll_interval_s`` and at once
    (at most every ``min_interval_s``) when asked for a UID it does not know — a pod that
    just started. Failures are logged once per streak with what to check, and retried
    with a doubling wait; pods keep their last names meanwhile.
    """

    def __init__(
        self,
        settings: KubeletSettings,
        node_name: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._settings = settings
        self._node = node_name
        self._known = _NodePods(settings.deleted_grace_s, clock)
        self._degradable: frozenset[str] = frozenset()
        self._context = _kubelet_tls(settings.ca_file)
        self._wanted = threading.Event()
        self._synced = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.listings = 0
        """Successful listings."""
        self.errors = 0
        """Failed listings."""

    def lookup(self, uid: str) -> tuple[str, str] | None:
        """``(namespace, name)`` of a pod on this node (or deleted within the grace); an
        unknown UID asks the kubelet again."""
        found = self._known.lookup(uid)
        if found is None:
            self._wanted.set()
        return found

    def deleted_since(self, uid: str) -> float | None:
        """When the pod ``uid`` was seen gone (clock time), ``None`` while it exists."""
        return self._known.deleted_since(uid)

    def degradable(self, uid: str) -> bool:
        """Whether the pod carries ``interference.io/degradable: "true"`` (latest listing)."""
        return uid in self._degradable

    def start(self) -> None:
        """Start the polling thread (returns at once; see :meth:`wait_synced`)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kubelet-pods", daemon=True)
            self._thread.start()

    def wait_synced(self, timeout_s: float) -> bool:
        """Whether the first listing completed within ``timeout_s``."""
        return self._synced.wait(timeout_s)

    def stop(self, timeout_s: float = 5.0) -> None:
        """Ask the thread to stop and wait for it up to ``timeout_s``."""
        self._stopping.set()
        self._wanted.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def list_once(self) -> int:
        """List this node's pods from the kubelet now; how many. Raises
        :class:`KubeletRefused` or ``OSError``."""
        try:
            token = Path(self._settings.token_file).read_text().strip()
        except OSError as exc:
            raise KubeletRefused(
                f"cannot read the token {self._settings.token_file} to show the kubelet: "
                f"{exc.strerror}"
            ) from exc
        request = urllib.request.Request(
            self._settings.url.rstrip("/") + "/pods",
            headers={"Authorization": f"Bearer {token}", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(
                request, timeout=self._settings.timeout_s, context=self._context
            ) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            raise KubeletRefused(_refusal(exc.code, self._settings.url)) from exc
        except json.JSONDecodeError as exc:
            raise KubeletRefused(f"the kubelet's /pods is not JSON: {exc}") from exc
        pods = pods_of_node(body, self._node)
        self._known.replace_all(pods)
        self._degradable = degradable_of_node(body, self._node)
        self.listings += 1
        self._synced.set()
        return len(pods)

    def _run(self) -> None:
        settings = self._settings
        wait_s = settings.min_interval_s
        failing = False
        while not self._stopping.is_set():
            self._wanted.clear()
            try:
                self.list_once()
            except (KubeletRefused, OSError) as exc:
                self.errors += 1
                log.log(
                    logging.DEBUG if failing else logging.WARNING,
                    "listing the pods of %s from its kubelet failed (%s); pods keep being "
                    "reported by their last names or UIDs; retrying",
                    self._node,
                    exc,
                )
                failing = True
                wait_s = min(max(wait_s * 2, settings.min_interval_s), settings.backoff_max_s)
                self._stopping.wait(wait_s)
                continue
            if failing:
                log.info("listing the pods of %s from its kubelet works again", self._node)
            failing, wait_s = False, settings.min_interval_s
            # Never more often than min_interval_s, at least every poll_interval_s.
            if self._stopping.wait(settings.min_interval_s):
                break
            self._wanted.wait(settings.poll_interval_s - settings.min_interval_s)


class KubeletRefused(Exception):
    """The kubelet did not list the pods (its status, or a token that cannot be read)."""


def _refusal(status: int, url: str) -> str:
    if status == 401:
        return (
            f"401 from {url}/pods: the kubelet does not accept the ServiceAccount token "
            "(it needs authentication.webhook.enabled in its configuration)"
        )
    if status == 403:
        return (
            f"403 from {url}/pods: the kubelet refused get nodes/pods (ClusterRole "
            "interference-agent; kubelets before 1.33 check nodes/proxy instead)"
        )
    return f"HTTP {status} from {url}/pods"


def _kubelet_tls(ca_file: str | None) -> ssl.SSLContext:
    if ca_file:
        return ssl.create_default_context(cafile=ca_file)
    # Self-signed serving certificates are the kubelet's default; the address is the
    # node's own (status.hostIP), and the token shown is the pod's own.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def pods_of_node(pod_list: Any, node_name: str) -> dict[str, tuple[str, str]]:
    """``{uid: (namespace, name)}`` of the pods in a ``PodList`` body bound to ``node_name``.

    Raises :class:`KubeletRefused` when the body is not a pod list."""
    items = pod_list.get("items") if isinstance(pod_list, dict) else None
    if not isinstance(items, list):
        raise KubeletRefused("the kubelet's /pods answer holds no items list")
    pods: dict[str, tuple[str, str]] = {}
    for item in items:
        metadata = item.get("metadata") if isinstance(item, dict) else None
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            continue
        uid, namespace, name = metadata.get("uid"), metadata.get("namespace"), metadata.get("name")
        if spec.get("nodeName") not in (None, node_name):
            continue
        if isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str):
            pods[uid] = (namespace, name)
    return pods


DEGRADABLE_ANNOTATION = "interference.io/degradable"
"""``"true"`` lets the agent degrade the pod (node_agent/degrade.py)."""


def degradable_of_node(pod_list: Any, node_name: str) -> frozenset[str]:
    """UIDs of the pods in a ``PodList`` body bound to ``node_name`` that carry
    :data:`DEGRADABLE_ANNOTATION` ``"true"`` (any case)."""
    items = pod_list.get("items") if isinstance(pod_list, dict) else None
    found: set[str] = set()
    for item in items if isinstance(items, list) else []:
        metadata = item.get("metadata") if isinstance(item, dict) else None
        spec = item.get("spec") if isinstance(item, dict) else None
        if not isinstance(metadata, dict) or not isinstance(spec, dict):
            continue
        annotations = metadata.get("annotations")
        if spec.get("nodeName") not in (None, node_name) or not isinstance(annotations, dict):
            continue
        value, uid = annotations.get(DEGRADABLE_ANNOTATION), metadata.get("uid")
        if isinstance(value, str) and value.strip().lower() == "true" and isinstance(uid, str):
            found.add(uid)
    return frozenset(found)


def kubernetes_directory_from_environment(
    node_name: str, settings: PodWatchSettings | None = None
) -> KubernetesPodDirectory | None:
    """A started directory using in-cluster config, else ``~/.kube/config``; ``None`` if neither.

    ``None`` is logged once at INFO: the agent then names pods by UID.
    """
    from kubernetes import client, config

    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        try:
            config.load_kube_config()  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            log.info(
                "no Kubernetes credentials (not in a pod, no kubeconfig: %s); pods are "
                "reported by UID — mount a service account that can list/watch pods to get names",
                exc,
            )
            return None
    directory = KubernetesPodDirectory(client.CoreV1Api(), node_name, settings)
    directory.start()
    return directory
