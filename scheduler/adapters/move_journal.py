"""The rebalancer's journal of moves in a ConfigMap, so a new leader keeps the cool-downs,
the move budgets, the marks and the RebalancedAway departures of the old one.

Why a ConfigMap and not Redis: the shipped Redis keeps nothing on disk (it holds signals
that are worthless a minute later), and a Redis restart followed by a leader change left
the new leader without the old one's moves, free to move a workload straight back. The
API server's store (etcd) outlives both. The ConfigMap lives beside the Lease (same
namespace, named ``{lease_name}-moves``), only the Lease holder writes it, and an update
carries the ``resourceVersion`` it read, so a write racing another is retried on a fresh
read, never lost silently.

One ConfigMap, ``data.moves``: a JSON list of moves, oldest first. :meth:`record` adds one
and drops those older than the longest window that still needs them (and, past
:data:`MAX_MOVES`, the oldest: at most a few hundred KiB, under the 1 MiB object limit);
:meth:`since` reads the recent ones back. A ConfigMap that does not exist is an empty
journal (nothing was ever moved); one that cannot be read, or whose ``moves`` is not a
JSON list, raises, and the rebalancer waits (docs/design.md §11). A member that does not
read as a move is left out and logged (never taken for one).
"""

from __future__ import annotations

import json
import logging
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from scheduler.adapters.api_errors import translate_error
from scheduler.cycle.ports import ClusterError
from scheduler.plugins.rebalanced_away import Departure
from scheduler.rebalancing.rebalance import Moved

log = logging.getLogger(__name__)

JOURNAL_PERMISSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("", "configmaps", ("get", "create", "update")),
)
"""(apiGroup, resource, verbs) :class:`ConfigMapMoveJournal` calls, in the Lease's
namespace only (deploy/base/rebalancer/rbac.yaml)."""

DATA_KEY = "moves"
MAX_MOVES = 2000
"""Moves kept at most (each about 300 bytes of JSON); the oldest go first."""
WRITE_ATTEMPTS = 3
"""Read-modify-write attempts when another writer changed the ConfigMap in between."""


def journal_name(lease_name: str) -> str:
    """The journal's ConfigMap: one per Lease, so per scheduler name."""
    return f"{lease_name}-moves"


class ConfigMapMoveJournal:
    """:class:`scheduler.rebalancing.ports.MoveJournal` in a ConfigMap."""

    def __init__(
        self, api: client.ApiClient, namespace: str, name: str, timeout_s: float = 10.0
    ) -> None:
        self._core = client.CoreV1Api(api)
        self._host = str(api.configuration.host)
        self.namespace = namespace
        self.name = name
        self._timeout_s = timeout_s

    def add(self, moved: Moved, departure: Departure | None, keep_s: float) -> None:
        for _ in range(WRITE_ATTEMPTS):
            found, resource_version = self._read()
            entries = [e for e in found if _at(e) >= moved.at - keep_s]
            entries.append(_entry(moved, departure))
            entries.sort(key=_at)
            body = client.V1ConfigMap(
                metadata=client.V1ObjectMeta(
                    name=self.name,
                    namespace=self.namespace,
                    resource_version=resource_version,
                    labels={"app.kubernetes.io/name": "interference-scheduler"},
                ),
                data={DATA_KEY: json.dumps(entries[-MAX_MOVES:], sort_keys=True)},
            )
            try:
                if resource_version is None:
                    self._core.create_namespaced_config_map(
                        self.namespace, body, _request_timeout=self._timeout_s
                    )
                else:
                    self._core.replace_namespaced_config_map(
                        self.name, self.namespace, body, _request_timeout=self._timeout_s
                    )
                return
            except ApiException as exc:
                if exc.status == 409:  # changed (or created) since our read: read again
                    continue
                verb = "create" if resource_version is None else "update"
                raise translate_error(exc, verb, "configmaps", self._host) from exc
        raise ClusterError(
            f"the rebalancer's journal {self.namespace}/{self.name} changed under "
            f"{WRITE_ATTEMPTS} writes in a row"
        )

    def since(self, at: float) -> list[tuple[Moved, Departure | None]]:
        found: list[tuple[Moved, Departure | None]] = []
        for entry in self._read()[0]:
            try:
                move = _move(entry)
            except (ValueError, TypeError, KeyError) as exc:
                log.warning("a rebalancer journal entry does not read as a move: %s", exc)
                continue
            if move[0].at >= at:
                found.append(move)
        return found

    def _read(self) -> tuple[list[Any], str | None]:
        """The journal's entries and the ConfigMap's resourceVersion (``None``: absent)."""
        try:
            config_map = self._core.read_namespaced_config_map(
                self.name, self.namespace, _request_timeout=self._timeout_s
            )
        except ApiException as exc:
            if exc.status == 404:
                return [], None
            raise translate_error(exc, "get", "configmaps", self._host) from exc
        raw = (config_map.data or {}).get(DATA_KEY, "[]")
        entries = json.loads(raw)
        if not isinstance(entries, list):
            raise ValueError(
                f"{self.namespace}/{self.name} data.{DATA_KEY} is not a JSON list of moves"
            )
        metadata = config_map.metadata
        return entries, (metadata.resource_version if metadata is not None else None) or ""


def _at(entry: Any) -> float:
    try:
        return float(entry["at"])
    except (TypeError, KeyError, ValueError):
        return float("-inf")  # unreadable: dropped at the next write


def _entry(moved: Moved, departure: Departure | None) -> dict[str, Any]:
    return {
        "at": moved.at,
        "node": moved.node,
        "namespace": moved.namespace,
        "workload_uid": moved.workload_uid,
        "workload": departure.workload if departure else "",
        "reason": departure.reason if departure else "",
        "departed": departure is not None,
        "dry_run": moved.dry_run,
        "unhelpful": moved.unhelpful,
        "helped": moved.helped,
    }


def _move(data: Any) -> tuple[Moved, Departure | None]:
    if not isinstance(data, dict):
        raise TypeError(f"expected an object, got {type(data).__name__}")
    at = float(data["at"])
    fields = ("node", "namespace", "workload_uid", "workload", "reason")
    if not all(isinstance(data[name], str) for name in fields):
        raise TypeError("node, namespace, workload_uid, workload and reason must be strings")
    flags = ("departed", "dry_run", "unhelpful", "helped")
    if not all(isinstance(data.get(name, False), bool) for name in flags):
        raise TypeError("departed, dry_run, unhelpful and helped must be true or false")
    moved = Moved(
        at,
        data["node"],
        data["namespace"],
        data["workload_uid"],
        dry_run=data.get("dry_run", False),
        unhelpful=data.get("unhelpful", False),
        helped=data.get("helped", False),
    )
    if data["departed"] is not True:
        return moved, None
    return moved, Departure(
        data["workload_uid"], data["workload"], data["node"], at, data["reason"]
    )
