"""The ``kubernetes`` client's exceptions as :class:`~scheduler.cycle.ports.ClusterError`
subclasses that name the call and the fix."""

from __future__ import annotations

import http.client
import json
import ssl
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

from scheduler.cycle.ports import ApiUnavailable, ClusterError, Forbidden


class _RetryLater(ApiUnavailable):
    """429/503 with a ``Retry-After`` header."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def translate_error(exc: Exception, verb: str, resource: str, host: str) -> ClusterError:
    """A client exception as one of our errors, naming the call and the fix."""
    if isinstance(exc, ClusterError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        detail = status_message(exc.body) or exc.reason or ""
        what = f"{verb} {resource}"
        if status in (401, 403):
            return Forbidden(
                f"the API server refused {what} (HTTP {status}: {detail}); grant the scheduler's"
                f" ServiceAccount verb '{verb}' on '{resource}' in its ClusterRole"
                " (deploy/base/rbac.yaml)"
            )
        if status == 410:
            return ClusterError(f"{what}: 410 Gone ({detail})")
        if status == 429 or status >= 500:
            message = f"{what}: the API server answered HTTP {status} ({detail}); retrying"
            retry_after = _retry_after(exc)
            if retry_after is not None:
                return _RetryLater(message, retry_after)
            return ApiUnavailable(message)
        return ClusterError(f"{what} failed with HTTP {status}: {detail}")
    if isinstance(exc, ssl.SSLError | urllib3.exceptions.SSLError):
        return ApiUnavailable(
            f"TLS with the API server at {host} failed for {verb} {resource} ({exc}); check the"
            " kubeconfig's certificate-authority and client certificate"
        )
    if isinstance(exc, urllib3.exceptions.HTTPError | http.client.HTTPException | OSError):
        return ApiUnavailable(
            f"cannot reach the API server at {host} for {verb} {resource} ({exc}); check the"
            " kubeconfig server address and that the API server is up"
        )
    return ClusterError(f"{verb} {resource}: unexpected client error {exc!r}")


def status_message(body: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` body (its start when not JSON)."""
    if not body:
        return ""
    try:
        parsed = json.loads(body)
        return str(parsed.get("message", "")) if isinstance(parsed, dict) else ""
    except (ValueError, TypeError):
        return str(body)[:200]


def _retry_after(exc: ApiException) -> float | None:
    headers = exc.headers or {}
    value = headers.get("Retry-After") or headers.get("retry-after")
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
