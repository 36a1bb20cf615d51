"""Read-only access to the interference store in Redis for the ``interference`` CLI.

What it reads (docs/design.md §4): the ranking the scheduler writes (``intf:nodes``,
``intf:nodes:updated``) when there is one, else every node that has a scheduling record
(``SCAN MATCH intf:node:*:sched``); each node's hash, pod set and pod hashes under its
own prefix; each node's report stream (``intf:node:NODE:reports``) for ``record``; a
pod's placement and rebalancing records (``intf:decision:{ns}/{pod}``,
``intf:rebalance:decision:{ns}/{pod}``) for ``explain``.

The viewer's Redis user needs :data:`VIEWER_COMMANDS` on ``intf:*``, reads only. ``SCAN``
(:data:`SCAN_COMMAND`) is optional: without it the CLI sees only the nodes the scheduler
ranks (``top`` without a ranking, and ``top --all``, say that they need it).

Every failure the user can fix (Redis unreachable, nothing published yet, unknown node
or pod, a malformed record) becomes a :class:`~interference_cli.errors.CliError` whose
message is the one line the CLI prints. What the reads return, and the parse of the
hashes into it, is :mod:`interference_cli.store_model`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.crc import key_slot
from redis.exceptions import RedisClusterException

from interference import freshness, keys
from interference.codec import PayloadError, decoded_hash, index_history
from interference.decision import Decision, parse_decision_hash
from interference_cli.errors import CliError
from interference_cli.store_model import (
    NodeDetail,
    NodeRow,
    PodRecords,
    PodRow,
    node_histograms,
    node_windows,
    parse_node_row,
    parse_pod_row,
    rank_index,
    split_pod_member,
)
from interference_infra.logsetup import mask_credentials
from interference_infra.redis_client import (
    DEFAULT_SENTINEL_MASTER,
    REDIS_ERRORS,
    Client,
    RedisConnection,
    RedisTarget,
    unreachable_reason,
)
from interference_infra.redis_tls import RedisTls
from interference_infra.strict import SettingsError, mask_url

T = TypeVar("T")

VIEWER_COMMANDS = ("zrange", "zscore", "hgetall", "smembers", "xread", "xrevrange")
"""The Redis commands every CLI command needs (the viewer user: ``+`` each, ``%R~intf:*``)."""
SCAN_COMMAND = "scan"
"""Optional: lets the CLI find nodes the scheduler does not rank (:meth:`Store.node_rows`,
:meth:`Store.report_streams`)."""

SCAN_COUNT = 1000
"""``COUNT`` hint of each ``SCAN`` step."""
STREAM_BATCH = 500
"""Report streams per ``XREAD`` (on a Redis Cluster, per hash slot)."""


class Store:
    """The Redis store, read through one connection."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 3.0,
        username: str | None = None,
        password: str | None = None,
        password_file: str | None = None,
        tls: RedisTls | None = None,
        sentinels: tuple[tuple[str, int], ...] = (),
        sentinel_master: str = DEFAULT_SENTINEL_MASTER,
        cluster: bool = False,
    ) -> None:
        """``username``/``password`` (REDIS_USERNAME/REDIS_PASSWORD, or ``password_file``,
        REDIS_PASSWORD_FILE, read at every login) win over the URL's;
        ``sentinels`` or ``cluster`` as in :class:`~interference_infra.redis_client.RedisTarget`."""
        self.url = url
        self.shown_url = mask_url(url)
        """The URL as printed: its password masked."""
        try:
            target = RedisTarget(
                url,
                sentinels=sentinels,
                sentinel_master=sentinel_master,
                cluster=cluster,
                tls=tls or RedisTls(),
                username=username,
                password=password,
                password_file=password_file,
            )
            self._connection = RedisConnection(target, timeout_s)
        except SettingsError:
            raise  # a setting that cannot work: a usage error, as the other settings
        except (ValueError, TypeError) as exc:
            raise CliError(
                f"bad Redis URL: {mask_credentials(str(exc))}; "
                "use e.g. redis://127.0.0.1:6379/0 in --redis-url or REDIS_URL"
            ) from exc
        self.where = target.describe()
        """Where the store is, as printed (a password masked)."""
        self._may_scan = True

    @property
    def may_scan(self) -> bool:
        """False once this user was refused ``SCAN``: only the ranked nodes can be found."""
        return self._may_scan

    @property
    def _redis(self) -> Client:
        return self._connection.client()

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        where = self.where
        try:
            return fn()
        except (
            redis.AuthenticationError,  # a ConnectionError: before those
            redis.exceptions.AuthenticationWrongNumberOfArgsError,  # a user on Redis < 6
        ) as exc:
            raise CliError(
                f"Redis at {where} refused the credentials ({exc}); "
                "set REDIS_USERNAME and REDIS_PASSWORD (or user:password in the URL)"
            ) from exc
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            if "closed by server" in str(exc) and self._answers():
                raise CliError(
                    f"Redis at {where} cut its reply while sending {what}: over its limit"
                    " per client (client-output-buffer-limit, 32 MB in the shipped"
                    " redis.conf), so a node's keys hold far more than an agent writes"
                    " (docs/operations.md, What one node can and cannot do)"
                ) from exc
            reason = unreachable_reason(self._connection.target, exc)
            if reason != str(exc):  # a rediss:// URL on a plaintext server, said plainly
                raise CliError(
                    f"cannot reach Redis at {where} while reading {what}: {reason}"
                ) from exc
            raise CliError(
                f"cannot reach Redis at {where} while reading {what} "
                f"({mask_credentials(str(exc))}); start redis-server or pass --redis-url / "
                "REDIS_URL"
            ) from exc
        except redis.exceptions.NoPermissionError as exc:
            raise CliError(
                f"Redis at {where} does not let this user read {what} ({exc}); use the "
                "viewer user (REDIS_USERNAME=interference-viewer), which needs "
                f"{', '.join(c.upper() for c in VIEWER_COMMANDS)} on intf:* (and SCAN to "
                "find nodes the scheduler does not rank)"
            ) from exc
        except redis.ResponseError as exc:
            raise CliError(f"Redis at {where} rejected reading {what}: {exc}") from exc
        except RedisClusterException as exc:
            raise CliError(
                f"cannot read {what} from the Redis Cluster at {where} "
                f"({mask_credentials(str(exc))}); check --redis-url / REDIS_URL and REDIS_CLUSTER"
            ) from exc
        except redis.RedisError as exc:
            # e.g. InvalidResponse: something that is not Redis answers on that port
            raise CliError(
                f"{where} did not answer like a Redis server while reading {what} "
                f"({type(exc).__name__}: {mask_credentials(str(exc))}); check --redis-url"
            ) from exc

    def _answers(self) -> bool:
        """Whether Redis answers a small command (``TIME``) now."""
        try:
            self._redis.time()
        except REDIS_ERRORS:
            return False
        return True

    def node_rows(self, now: float | None = None, *, scan: bool = False) -> list[NodeRow]:
        """Every known node, highest interference index first; degraded, then stale ones
        last.

        The nodes are those of the scheduler's ranking (``intf:nodes``, with the index it
        computed) when it has one; else, or with ``scan``, also every node with a
        scheduling record, found with ``SCAN`` (which walks the whole key space: the
        ranking leaves out nodes the scheduler cannot use, degraded ones included).
        Members of the ranking whose hash expired more than a freshness window ago are
        left out (the scheduler removes them at its next ranking).

        Raises :class:`CliError` when no node has reported to this Redis.
        """
        now = time.time() if now is None else now

        def read() -> tuple[list[str], dict[str, float], dict[str, float], list[Any]]:
            client = self._redis
            ranking = client.zrange(keys.NODES_BY_INDEX, 0, -1, withscores=True)
            updated = client.zrange(keys.NODES_UPDATED, 0, -1, withscores=True)
            index_by_node = {_text(m): float(s) for m, s in ranking}
            updated_at = {_text(m): float(s) for m, s in updated}
            found = set(index_by_node) | set(updated_at)
            if scan or not found:
                scanned = self._nodes_with_records()
                if scanned is None:
                    raise CliError(_needs_scan(scan))
                found |= scanned
            names = sorted(found)
            pipe = client.pipeline(transaction=False)
            for name in names:
                pipe.hgetall(keys.node_key(name))
            return names, index_by_node, updated_at, list(pipe.execute())

        names, index_by_node, updated_at, hashes = self._call("the node list", read)
        if not names:
            raise CliError(
                f"no node reports in Redis at {self.shown_url} (no {keys.NODES_BY_INDEX} "
                f"ranking and no {keys.SCHED_KEY_PATTERN} records); is an interference-agent "
                "running with --redis-url pointing here?"
            )
        rows = [
            parse_node_row(name, raw, updated_at.get(name, 0.0), now, index_by_node.get(name))
            for name, raw in zip(names, hashes, strict=True)
            if raw or now - updated_at.get(name, 0.0) <= 2 * freshness.MIN_STALE_AFTER_S
        ]
        order = {"ok": 0, "degraded": 1, "stale": 2}
        rows.sort(key=lambda r: (order[r.state], -rank_index(r), r.node))
        return rows

    def _nodes_with_records(self) -> set[str] | None:
        """Nodes with a scheduling record key (``SCAN``; every primary of a Cluster); None
        when this user may not ``SCAN``."""
        found: set[str] = set()
        for key in self._scan(keys.SCHED_KEY_PATTERN) or ():
            try:
                found.add(keys.node_from_sched_key(key))
            except ValueError:
                continue  # a pod named "sched" without a namespace: not a record
        return found if self._may_scan else None

    def _scan(self, pattern: str) -> list[str]:
        """Keys matching ``pattern``; none when this user may not ``SCAN`` (remembered:
        :attr:`_may_scan` turns False and it is not tried again)."""
        if not self._may_scan:
            return []
        try:
            return [_text(k) for k in self._redis.scan_iter(match=pattern, count=SCAN_COUNT)]
        except redis.exceptions.NoPermissionError:
            self._may_scan = False
            return []

    def node_detail(self, node: str, now: float | None = None) -> NodeDetail:
        """A node's metrics, histograms and pods; :class:`CliError` for an unknown node."""
        now = time.time() if now is None else now

        def read() -> tuple[dict[bytes, bytes], float | None, float | None, set[bytes]]:
            pipe = self._redis.pipeline(transaction=False)
            pipe.hgetall(keys.node_key(node))
            pipe.zscore(keys.NODES_UPDATED, node)
            pipe.zscore(keys.NODES_BY_INDEX, node)
            pipe.smembers(keys.node_pods_key(node))
            raw, updated, index, members = pipe.execute()
            return raw, updated, index, members

        raw, updated, index, members = self._call(f"node {node!r}", read)
        if not raw:
            if updated is None:
                raise CliError(
                    f"unknown node {node!r}: no agent has reported it to {self.shown_url}; "
                    "`interference top` lists the known nodes"
                )
            raise CliError(
                f"node {node!r} is stale: its last report ({now - float(updated):.0f} s ago) "
                "has expired; check that its interference-agent is running"
            )
        row = parse_node_row(
            node, raw, float(updated or 0.0), now, None if index is None else float(index)
        )
        data = decoded_hash(raw)
        return NodeDetail(
            row=row,
            histograms=node_histograms(node, data),
            pods=self._pods(node, sorted(_text(m) for m in members)),
            disabled_probes=data.get("disabled_probes", ""),
            windows=node_windows(node, raw),
        )

    def decision(self, namespace: str, pod: str) -> Decision:
        """The scheduler's latest decision for a pod, its placement record; :class:`CliError`
        when there is none."""
        placement = self._record("the decision", keys.decision_key, namespace, pod)
        if placement is None:
            raise CliError(self._no_record(namespace, pod))
        return placement

    def pod_records(self, namespace: str, pod: str) -> PodRecords:
        """A pod's placement record and rebalancing record, either of which may be gone;
        :class:`CliError` when both are."""
        records = PodRecords(
            placement=self._record("the decision", keys.decision_key, namespace, pod),
            rebalancing=self._record(
                "the rebalancing record", keys.rebalance_decision_key, namespace, pod
            ),
        )
        if records.placement is None and records.rebalancing is None:
            raise CliError(self._no_record(namespace, pod))
        return records

    def _record(
        self, what: str, key_of: Callable[[str, str], str], namespace: str, pod: str
    ) -> Decision | None:
        """The record under ``key_of(namespace, pod)``, None when there is none."""
        key = key_of(namespace, pod)
        raw = self._call(f"{what} for {namespace}/{pod}", lambda: self._redis.hgetall(key))
        if not raw:
            return None
        try:
            return parse_decision_hash(raw)
        except PayloadError as exc:
            raise CliError(f"decision record {key} is malformed: {exc}") from exc

    def _no_record(self, namespace: str, pod: str) -> str:
        return (
            f"no scheduling decision for pod {namespace}/{pod} in {self.shown_url}; "
            "is the pod scheduled by interference-scheduler (spec.schedulerName) "
            f"and younger than {keys.DECISION_TTL_S // 3600} h?"
        )

    def index_history(self, node: str) -> list[tuple[float, float]]:
        """The node's interference index in its report stream (its last
        ``NODE_REPORTS_MAXLEN`` reports) as ``(unix time, index)``, oldest first; reports
        that do not decode are left out."""
        entries = self._call(
            f"the report stream of {node}",
            lambda: self._redis.xrevrange(keys.reports_key(node), count=keys.NODE_REPORTS_MAXLEN),
        )
        return index_history(entries, keys.REPORTS_FIELD)

    def pod_row(self, node: str, namespace: str, name: str) -> PodRow | None:
        """A pod's latest metrics on ``node``, None while it has none; CliError when
        malformed."""
        raw = self._call(
            f"pod {namespace}/{name} on node {node!r}",
            lambda: self._redis.hgetall(keys.pod_key(node, namespace, name)),
        )
        return parse_pod_row(raw, f"pod {namespace}/{name}") if raw else None

    def report_streams(self) -> dict[str, str]:
        """Node → key of its report stream: every stream in Redis (``SCAN``) and the
        stream of every node the scheduler ranks (which may not exist: reading a missing
        stream reads nothing). Without ``SCAN`` permission, only the ranked nodes'."""

        def find() -> dict[str, str]:
            found: dict[str, str] = {}
            for key in self._scan(keys.reports_key("*")):
                try:
                    node = keys.node_from_key(key.removesuffix(REPORTS_SUFFIX))
                except ValueError:
                    continue
                if key == keys.reports_key(node):
                    found[node] = key
            for ranking in (keys.NODES_BY_INDEX, keys.NODES_UPDATED):
                for member in self._redis.zrange(ranking, 0, -1):
                    node = _text(member)
                    if keys.valid_node_name(node):
                        found.setdefault(node, keys.reports_key(node))
            return found

        return self._call(f"the report streams ({keys.reports_key('*')})", find)

    def last_stream_ids(self, stream_keys: list[str]) -> dict[str, str]:
        """Id of the newest entry of each stream, ``0-0`` for one empty or gone."""

        def read() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for key in stream_keys:
                pipe.xrevrange(key, count=1)
            return list(pipe.execute())

        replies = self._call("the report streams", read) if stream_keys else []
        return {
            key: _text(reply[0][0]) if reply else "0-0"
            for key, reply in zip(stream_keys, replies, strict=True)
        }

    def streams_after(
        self, last_ids: dict[str, str], *, count: int = 100
    ) -> list[tuple[str, str, bytes]]:
        """Entries after each stream's last id (``{key: id}``), at most ``count`` per
        stream, as ``(key, id, payload)`` in id order; no waiting. Two streams' entries of
        one millisecond can share an id: those go by stream key, so a recording never
        depends on the order of the replies. Streams are read :data:`STREAM_BATCH` keys
        per ``XREAD`` (on a Cluster, keys of one hash slot per ``XREAD``), every batch in
        one pipelined round trip. Entries without a report field are skipped."""

        def read() -> list[Any]:
            pipe = self._redis.pipeline(transaction=False)
            for batch in _stream_batches(list(last_ids), self._connection.target.cluster):
                pipe.xread({key: last_ids[key] for key in batch}, count=count)
            return list(pipe.execute())

        replies = self._call("the report streams", read) if last_ids else []
        entries: list[tuple[str, str, bytes]] = []
        for reply in replies:
            for stream, messages in _xread_items(reply):
                for entry_id, entry in messages:
                    payload = entry.get(keys.REPORTS_FIELD.encode())
                    if payload is not None:
                        entries.append((_text(stream), _text(entry_id), payload))
        entries.sort(key=lambda e: (_id_order(e[1]), e[0]))
        return entries

    def _pods(self, node: str, members: list[str]) -> list[PodRow]:
        refs = [split_pod_member(m) for m in members]

        def read() -> list[dict[bytes, bytes]]:
            pipe = self._redis.pipeline(transaction=False)
            for namespace, name in refs:
                pipe.hgetall(keys.pod_key(node, namespace, name))
            return list(pipe.execute())

        # A pod's hash may expire between the two reads: skip it.
        return [
            parse_pod_row(raw, f"a pod of node {node!r}")
            for raw in self._call(f"the pods of node {node!r}", read)
            if raw
        ]


def split_pod_ref(ref: str) -> tuple[str, str]:
    """``NAMESPACE/POD`` into its parts; :class:`CliError` for anything else."""
    namespace, sep, name = ref.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise CliError(f"expected NAMESPACE/POD (e.g. default/web-0), got {ref!r}")
    return namespace, name


REPORTS_SUFFIX = keys.reports_key("").removeprefix(keys.node_key(""))
"""``:reports``: what a node's report stream key adds to its node key."""


def _needs_scan(all_nodes: bool) -> str:
    why = (
        "--all needs"
        if all_nodes
        else f"there is no ranking {keys.NODES_BY_INDEX} (is the scheduler running?), and "
        "listing the nodes without it needs"
    )
    return (
        f"{why} SCAN, which this Redis user may not run; grant it +scan, or name a node: "
        "`interference node NODE`"
    )


def _stream_batches(stream_keys: list[str], cluster: bool) -> list[list[str]]:
    """``stream_keys`` in groups of at most :data:`STREAM_BATCH`; on a Cluster every
    group's keys share a hash slot (one ``XREAD`` may not cross slots)."""
    groups: dict[int, list[str]] = {}
    for key in stream_keys:
        groups.setdefault(key_slot(key.encode()) if cluster else 0, []).append(key)
    return [
        keys_of_slot[i : i + STREAM_BATCH]
        for _, keys_of_slot in sorted(groups.items())
        for i in range(0, len(keys_of_slot), STREAM_BATCH)
    ]


def _xread_items(reply: Any) -> list[tuple[Any, list[Any]]]:
    """``XREAD``'s reply as ``[(stream, messages)]`` (RESP2 list or RESP3 map)."""
    if not reply:
        return []
    if isinstance(reply, dict):
        return [(stream, messages) for stream, messages in reply.items()]
    return [(stream, messages) for stream, messages in reply]


def _id_order(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return (int(ms), int(seq or 0))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
