"""Who a bearer token belongs to, as the API server says (TokenReview,
``authentication.k8s.io/v1``).

A pod-bound ServiceAccount token of a pod with ``spec.nodeName`` set carries the node in
its claims; the review returns it as ``status.user.extra["authentication.kubernetes.io/
node-name"]`` (and the pod as ``…/pod-name``). The API server also checks that the pod
still exists with the same UID, so a token outlives neither its pod nor its expiry.

A token can also be bound to a Node object alone (node claims, no pod): the issuer wants a
pod. :class:`KubernetesPodBinding` then reads the pod and the Node: the pod must exist with
the token's UID, run on the node the token names, and that Node must exist.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Protocol

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

log = logging.getLogger(__name__)

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"
POD_UID_EXTRA = "authentication.kubernetes.io/pod-uid"


@dataclass(frozen=True)
class Identity:
    """An authenticated token's user."""

    username: str
    """``system:serviceaccount:NAMESPACE:NAME`` for a ServiceAccount token."""
    extra: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """``status.user.extra``: the node and pod claims of a bound token."""

    def claim(self, key: str) -> tuple[str, ...]:
        """The values of one ``extra`` entry (empty when absent)."""
        return self.extra.get(key, ())


class TokenRejected(Exception):
    """The API server does not authenticate the token (invalid, expired, revoked, another
    audience, its pod gone): the caller answers 401."""


class ReviewUnavailable(Exception):
    """The review could not be made (API server unreachable, the issuer not allowed to
    create TokenReviews): the caller answers 503 and the agent retries."""


class TokenReviewer(Protocol):
    """Reviews one token; raises :class:`TokenRejected` or :class:`ReviewUnavailable`."""

    def review(self, token: str) -> Identity: ...


def identity_from_status(status: Any, audience: str) -> Identity:
    """The identity in a TokenReview ``status`` (the client's model or a plain dict);
    :class:`TokenRejected` when not authenticated for ``audience``."""
    get = _getter(status)
    if not get("authenticated"):
        raise TokenRejected(str(get("error") or "not authenticated"))
    audiences = get("audiences") or []
    if audience not in audiences:
        # An authenticator that ignores audiences answers without them: not good enough.
        raise TokenRejected(f"the token is not for the audience {audience!r} ({audiences})")
    user = get("user")
    if user is None:
        raise TokenRejected("the review names no user")
    user_get = _getter(user)
    extra_raw = user_get("extra") or {}
    extra = {str(k): tuple(str(v) for v in (values or ())) for k, values in extra_raw.items()}
    return Identity(username=str(user_get("username") or ""), extra=extra)


def _getter(obj: Any) -> Any:
    if isinstance(obj, dict):
        return obj.get
    return lambda name: getattr(obj, name, None)


class KubernetesTokenReviewer:
    """Creates a TokenReview per token with the API server the client points at."""

    def __init__(self, api_client: client.ApiClient, audience: str, timeout_s: float) -> None:
        self._api = client.AuthenticationV1Api(api_client)
        self._audience = audience
        self._timeout_s = timeout_s

    def review(self, token: str) -> Identity:
        body = client.V1TokenReview(
            api_version="authentication.k8s.io/v1",
            kind="TokenReview",
            spec=client.V1TokenReviewSpec(token=token, audiences=[self._audience]),
        )
        try:
            answer = self._api.create_token_review(body, _request_timeout=self._timeout_s)
        except ApiException as exc:
            if exc.status in (401, 403):
                raise ReviewUnavailable(
                    f"the API server refused the issuer's TokenReview (HTTP {exc.status}): "
                    "its ServiceAccount needs create on tokenreviews.authentication.k8s.io "
                    "(the ClusterRole interference-credentials in deploy/)"
                ) from exc
            raise ReviewUnavailable(
                f"TokenReview failed with HTTP {exc.status}: {exc.reason}"
            ) from exc
        except Exception as exc:  # urllib3's errors, timeouts, a reply that does not parse
            raise ReviewUnavailable(f"TokenReview failed: {exc!r}") from exc
        return identity_from_status(answer.status, self._audience)


def api_client(kubeconfig: str | None, pool_size: int = 64) -> client.ApiClient:
    """A client from ``kubeconfig``, else the in-cluster ServiceAccount, else
    ``~/.kube/config``, keeping up to ``pool_size`` connections to the API server (one per
    request served at once); ``ValueError`` saying which were tried."""
    configuration = client.Configuration()
    try:
        if kubeconfig:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            try:
                config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
            except ConfigException:
                config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except (ConfigException, OSError, TypeError, ValueError) as exc:
        raise ValueError(
            f"no usable Kubernetes credentials for TokenReviews ({exc}); pass --kubeconfig "
            "FILE, set KUBECONFIG, or run in a pod with a ServiceAccount"
        ) from exc
    configuration.connection_pool_maxsize = pool_size
    return client.ApiClient(configuration)


class PodBinding(Protocol):
    """Whether a bound token's pod runs on its node: ``("", "")``, else ``(reason,
    message)`` with reason ``pod_not_found``, ``pod_not_on_node`` or ``unknown_node``;
    :class:`ReviewUnavailable` when it cannot be told."""

    def check(self, namespace: str, pod: str, uid: str, node: str) -> tuple[str, str]: ...


class KubernetesPodBinding:
    """Reads the pod (in the agents' namespace) and the Node from the API server."""

    def __init__(self, api_client: client.ApiClient, timeout_s: float) -> None:
        self._core = client.CoreV1Api(api_client)
        self._timeout_s = timeout_s

    def check(self, namespace: str, pod: str, uid: str, node: str) -> tuple[str, str]:
        found = self._read(
            lambda: self._core.read_namespaced_pod(
                pod, namespace, _request_timeout=self._timeout_s
            ),
            f"get pods in {namespace} (the Role interference-credentials in deploy/)",
        )
        if found is None or found.metadata.uid != uid:
            return "pod_not_found", f"pod {namespace}/{pod} with UID {uid} does not exist"
        on = found.spec.node_name if found.spec is not None else None
        if on != node:
            return "pod_not_on_node", f"pod {namespace}/{pod} runs on {on!r}, not {node!r}"
        if self._read(
            lambda: self._core.read_node(node, _request_timeout=self._timeout_s),
            "get nodes (the ClusterRole interference-credentials in deploy/)",
        ) is None:  # fmt: skip
            return "unknown_node", f"node {node!r} does not exist"
        return "", ""

    @staticmethod
    def _read(call: Any, right: str) -> Any:
        """The object, ``None`` when it does not exist."""
        try:
            return call()
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status in (401, 403):
                raise ReviewUnavailable(
                    f"the API server refused the issuer's read (HTTP {exc.status}): its"
                    f" ServiceAccount needs {right}"
                ) from exc
            raise ReviewUnavailable(
                f"reading from the API server failed with HTTP {exc.status}"
            ) from exc
        except Exception as exc:  # urllib3's errors, timeouts
            raise ReviewUnavailable(f"reading from the API server failed: {exc!r}") from exc
