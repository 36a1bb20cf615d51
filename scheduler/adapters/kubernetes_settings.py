"""How to reach and follow the API server: the ``kubernetes:`` settings and the
``ApiClient`` of a kubeconfig or the in-cluster service account."""

from __future__ import annotations

import os
from dataclasses import dataclass

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from scheduler.cycle.ports import ClusterError


@dataclass(frozen=True, slots=True)
class KubernetesSettings:
    """How to reach and follow the API server."""

    kubeconfig: str = ""
    """Path of a kubeconfig file; empty: in-cluster service account, else ``$KUBECONFIG``
    or ``~/.kube/config``."""
    context: str = ""
    """kubeconfig context; empty: the file's current context."""
    page_size: int = 500
    """Objects per list page (``limit``)."""
    watch_timeout_s: int = 300
    """Server-side watch timeout; each watch asks for a random value in [t, 2t) like client-go."""
    request_timeout_s: float = 30.0
    """Client-side timeout of non-watch calls (and of connecting)."""
    backoff_initial_s: float = 0.5
    """First retry delay after a 429/5xx/connection error; doubles per failure."""
    backoff_max_s: float = 30.0
    """Cap of the retry delay."""

    def __post_init__(self) -> None:
        if self.page_size < 1:
            raise ValueError(f"page_size: {self.page_size!r} must be an integer ≥ 1, e.g. 500")
        if self.watch_timeout_s < 1:
            raise ValueError(f"watch_timeout_s: {self.watch_timeout_s!r} must be an integer ≥ 1")
        for name in ("request_timeout_s", "backoff_initial_s", "backoff_max_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: {getattr(self, name)!r} must be a number > 0")


def make_api_client(kubeconfig: str = "", context: str = "") -> client.ApiClient:
    """An ApiClient from a kubeconfig path, the in-cluster service account, or the default
    kubeconfig; :class:`ClusterError` saying which sources were tried."""
    try:
        if kubeconfig:
            return _new_client(kubeconfig, context)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            return client.ApiClient(configuration)
        return _new_client(None, context)
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        raise ClusterError(
            f"no usable Kubernetes credentials ({exc}); pass --kubeconfig FILE, set KUBECONFIG,"
            " or run in a pod with a service account"
        ) from exc


def _new_client(kubeconfig: str | None, context: str) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=kubeconfig, context=context or None
    )
    return api
