"""Pod UID → (namespace, name) for the pods on this node.

The DaemonSet's directory asks this node's kubelet instead (:mod:`node_agent.kubelet_pods`).
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
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from interference_infra.kube_watch import Backoff, Gone, list_and_watch
from interference_infra.strict import SettingsError
from node_agent.tolerances import PodTolerance, tolerance_of

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
        tolerances: Mapping[str, PodTolerance] | None = None,
    ) -> None:
        self._pods = {uid.lower(): ref for uid, ref in (pods or {}).items()}
        self._degradable = frozenset(uid.lower() for uid in degradable)
        self._tolerances = {uid.lower(): t for uid, t in (tolerances or {}).items()}

    def tolerance(self, uid: str) -> PodTolerance | None:
        """The pod's declared interference tolerance, if any."""
        return self._tolerances.get(uid.lower())

    def degradable(self, uid: str) -> bool:
        """Whether the pod was given as degradable (:data:`DEGRADABLE_ANNOTATION`)."""
        return uid.lower() in self._degradable

    def lookup(self, uid: str) -> tuple[str, str] | None:
        """``(namespace, name)`` for a known UID, else ``None``."""
        return self._pods.get(uid.lower())

    @classmethod
    def from_file(cls, path: str | Path) -> StaticPodDirectory:
        """Load a YAML or JSON file holding ``{uid: "namespace/name"}``; an entry may also
        be ``{pod: "namespace/name", annotations: {…}}``, whose interference tolerance
        annotations the agent then shows (:mod:`node_agent.tolerances`).

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
        tolerances: dict[str, PodTolerance] = {}
        for uid, entry in data.items():
            ref = entry.get("pod") if isinstance(entry, dict) else entry
            annotations = entry.get("annotations") if isinstance(entry, dict) else None
            if annotations is not None and not isinstance(annotations, dict):
                raise SettingsError(f"{path}: entry {uid!r}: annotations must be a mapping")
            if (found := tolerance_of(annotations)) is not None:
                tolerances[str(uid)] = found
            namespace, _, name = str(ref).partition("/")
            if not isinstance(ref, str) or not namespace or not name or "/" in name:
                raise SettingsError(
                    f'{path}: entry {uid!r}: {json.dumps(ref)} is not "namespace/name"'
                )
            pods[str(uid)] = (namespace, name)
        return cls(pods, tolerances=tolerances)


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


class NodePods:
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
        self._known = NodePods(self._settings.deleted_grace_s, clock)
        self._tolerances: dict[str, PodTolerance] = {}
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

    def tolerance(self, uid: str) -> PodTolerance | None:
        """The pod's declared interference tolerance (its latest annotations), if any."""
        return self._tolerances.get(uid)

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
        self._tolerances = {
            pod.metadata.uid: found
            for pod in pod_list.items
            if self._on_this_node(pod)
            and (found := tolerance_of(pod.metadata.annotations)) is not None
        }
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
            self._tolerances.pop(uid, None)
        else:
            self._known.put(uid, (pod.metadata.namespace, pod.metadata.name))
            if (found := tolerance_of(pod.metadata.annotations)) is not None:
                self._tolerances[uid] = found
            else:
                self._tolerances.pop(uid, None)

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
