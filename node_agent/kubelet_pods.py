"""Pod names from this node's kubelet: ``GET /pods`` on its authenticated port, which the
kubelet authorises as ``get nodes/pods``. The agent then needs no pod list in the API server,
where RBAC cannot hold a list to one node's pods (docs/operations.md, "The agent's
privileges")."""

from __future__ import annotations

import json
import logging
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from interference.annotations import flag_value
from node_agent.pods import NodePods
from node_agent.tolerances import PodTolerance, tolerances_of_node

log = logging.getLogger(__name__)

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
        self._known = NodePods(settings.deleted_grace_s, clock)
        self._degradable: frozenset[str] = frozenset()
        self._tolerances: dict[str, PodTolerance] = {}
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

    def tolerance(self, uid: str) -> PodTolerance | None:
        """The pod's declared interference tolerance (latest listing), if any."""
        return self._tolerances.get(uid)

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
        self._tolerances = tolerances_of_node(body, self._node)
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
    :data:`DEGRADABLE_ANNOTATION` true (``"true"``, ``"yes"``, ``"on"``, ``"1"``, any case:
    :func:`interference.annotations.flag_value`, as the scheduler reads it)."""
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
        if isinstance(value, str) and flag_value(value) is True and isinstance(uid, str):
            found.add(uid)
    return frozenset(found)
