"""Everything the node agent is configured with, in one dataclass passed explicitly."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from interference import freshness, keys
from interference.index import IndexReferences
from interference_infra.redis_tls import RedisTls
from node_agent.cpus import CpuCount, subtree_cpus
from node_agent.credentials import DEFAULT_TOKEN_FILE, EnrolmentSettings
from node_agent.degrade import DegradeSettings
from node_agent.probes.base import ProbeContext
from node_agent.signal_metrics import DEFAULT_MAX_PODS

DEFAULT_HTTP_PORT = 10271
"""The agent's health and metrics port on the node (hostNetwork). Chosen outside the
Prometheus exporters' range 9100–9999 (fully allocated: node-exporter 9100, dcgm-exporter
9400, …), outside Kubernetes' own 10248–10259 (kubelet, kube-proxy, controllers) and
ingress-nginx's 10254, below the NodePort range 30000–32767 and Linux's ephemeral ports
32768–60999, where a hostNetwork listener would race outgoing connections."""

BPF_PROBES = ("runqlat", "reclaim")
"""Probes backed by BPF programs; ``taskstats`` stands in for them when they cannot load."""
FALLBACK_PROBE = "taskstats"
"""Delay accounting over netlink: run-queue and reclaim delay without BPF."""


def detect_cgroup_v2_mount(sys_fs_cgroup: str = "/sys/fs/cgroup") -> str:
    """Where the cgroup v2 hierarchy lives: ``/sys/fs/cgroup`` on pure-v2 hosts (it has
    ``cgroup.controllers``), else the hybrid layout's ``/sys/fs/cgroup/unified``."""
    if os.path.exists(os.path.join(sys_fs_cgroup, "cgroup.controllers")):
        return sys_fs_cgroup
    return os.path.join(sys_fs_cgroup, "unified")


@dataclass(frozen=True)
class AgentSettings:
    """Configuration of one node agent (built by ``node_agent.cli`` from flags and env)."""

    node_name: str = field(default_factory=socket.gethostname)
    """Name under which the node's keys are published; the Kubernetes node name."""
    redis_url: str = "redis://127.0.0.1:6379/0"
    """``redis://`` or ``rediss://`` URL of the store (credentials are better passed below)."""
    redis_username: str | None = None
    """ACL user the agent writes as (``REDIS_USERNAME``); None uses the URL's or the default."""
    redis_password: str | None = None
    """Password of that user (``REDIS_PASSWORD``, from a Secret)."""
    redis_tls: RedisTls = field(default_factory=RedisTls)
    """CA and client certificate for a ``rediss://`` URL."""
    redis_sentinels: tuple[tuple[str, int], ...] = ()
    """Sentinel ``(host, port)`` pairs; when set the master is found through them and
    ``redis_url`` only gives the database (and ``rediss://`` for TLS)."""
    redis_sentinel_master: str = "mymaster"
    """Master name the sentinels monitor."""
    redis_cluster: bool = False
    """``redis_url`` names a node of a Redis Cluster."""
    credentials_url: str | None = None
    """The credential issuer (``CREDENTIALS_URL``); when set the agent writes as its node's
    own Redis user from there (:mod:`node_agent.credentials`) and ignores
    ``redis_username``/``redis_password``."""
    token_file: str = DEFAULT_TOKEN_FILE
    """The projected ServiceAccount token shown to the issuer (``TOKEN_FILE``)."""
    credentials_ca_file: str | None = None
    """CA of the issuer's certificate (``CREDENTIALS_CA_FILE``); None: the system's CAs."""
    credentials_server_name: str | None = None
    """The name the issuer's certificate must carry when ``credentials_url`` is an address
    (``CREDENTIALS_SERVER_NAME``); None: the URL's host."""
    redis_socket_timeout_s: float = 0.5
    """Connect and read timeout; short so an unreachable Redis never stalls the interval."""
    interval_s: float = 1.0
    """Seconds between reports."""
    ttl_s: int | None = None
    """TTL of every hash; None means :func:`interference.freshness.ttl_seconds` of the interval."""
    stream_maxlen: int = keys.NODE_REPORTS_MAXLEN
    """Cap of the node's report stream (exact ``XADD MAXLEN``)."""
    unready_after_publish_failures: int = 3
    """``/readyz`` fails after this many reports in a row could not be published (3 at
    the default 1 s interval: before the node's 5 s freshness window runs out)."""
    probes: tuple[str, ...] = ()
    """Probes to run; empty means every registered probe, with ``taskstats`` only as the
    fallback for BPF probes that cannot load."""
    cgroup_root: str = "/"
    """Only cgroups at or below this path (in each hierarchy) are measured."""
    cgroup_v2_mount: str = field(default_factory=detect_cgroup_v2_mount)
    """Mount point of the cgroup v2 hierarchy."""
    cgroup_v1_mount: str = "/sys/fs/cgroup"
    """Parent of the v1 controller mounts on hybrid hosts."""
    proc_root: str = "/proc"
    """The host's procfs: ``/proc`` with the host PID namespace, else the host's ``/proc``
    mounted elsewhere (the DaemonSet's ``/host/proc``): BPF sees host thread ids."""
    tracefs: str = "/sys/kernel/tracing"
    bpf_source_dir: str = ""
    """Directory with ``*.bpf.c``; empty lets the probes find them (``INTERFERENCE_BPF_DIR``,
    then the ``bpf/`` folder shipped with the agent)."""
    index_refs: IndexReferences = field(default_factory=IndexReferences)
    """Reference curves and weights of the interference index (:mod:`interference.index`)."""
    pods_file: str | None = None
    """Static ``{uid: "namespace/name"}`` file naming pods (demo, tests); wins over the API."""
    kubernetes: bool = True
    """Name pods through the API (watching this node's pods) when credentials exist:
    in-cluster service account, else ``kubeconfig``; without them pods are named by UID."""
    kubeconfig: str | None = None
    """Kubeconfig file; None tries the in-cluster config, then ``~/.kube/config``."""
    kubelet_url: str | None = None
    """This node's kubelet (``https://NODE_IP:10250``): pod names from its ``/pods``
    (authorised as ``get nodes/pods``) instead of a pod watch in the API server."""
    kubelet_ca_file: str | None = None
    """CA of the kubelet's serving certificate; None: not verified (self-signed by default)."""
    ncpu: int | None = None
    """CPUs the measured pods can run on, the denominator of the run-queue wait ratio;
    None reads the cpuset of ``cgroup_root`` (:func:`node_agent.cpus.subtree_cpus`)."""
    http_address: str = "127.0.0.1"
    """Address of the ``/healthz``, ``/readyz`` and ``/metrics`` endpoint."""
    http_port: int = DEFAULT_HTTP_PORT
    """Port of that endpoint; 0 serves nothing."""
    metrics_max_pods: int = DEFAULT_MAX_PODS
    """Most pods with per-pod series on ``/metrics`` (victims, antagonists, pods with a
    tolerance; :mod:`node_agent.signal_metrics`); 0: none."""
    degrade: DegradeSettings = field(default_factory=DegradeSettings)
    """Degrading antagonists on this node (off by default; :mod:`node_agent.degrade`)."""

    def __post_init__(self) -> None:
        if not self.node_name:
            raise ValueError("node name is empty: pass --node-name or set NODE_NAME")
        if not self.interval_s > 0:
            raise ValueError(f"interval must be > 0 seconds, got {self.interval_s}")
        if self.ttl_s is not None and self.ttl_s < 1:
            raise ValueError(f"ttl must be at least 1 second, got {self.ttl_s}")
        if self.unready_after_publish_failures < 1:
            raise ValueError(
                "unready after publish failures must be at least 1, got "
                f"{self.unready_after_publish_failures}"
            )
        if self.stream_maxlen < 1:
            raise ValueError(f"stream maxlen must be at least 1, got {self.stream_maxlen}")
        if self.redis_sentinels and self.redis_cluster:
            raise ValueError("use either Redis Sentinel or Redis Cluster, not both")
        if not self.cgroup_root.startswith("/"):
            raise ValueError(f"cgroup root must be an absolute path, got {self.cgroup_root!r}")
        if self.ncpu is not None and self.ncpu < 1:
            raise ValueError(f"ncpu must be at least 1, got {self.ncpu}")
        if self.metrics_max_pods < 0:
            raise ValueError(f"metrics max pods must be ≥ 0, got {self.metrics_max_pods}")
        if not 0 <= self.http_port <= 65535:
            raise ValueError(f"http port must be 0 (off) to 65535, got {self.http_port}")
        self.enrolment()  # ValueError for a credentials URL that cannot work

    def enrolment(self) -> EnrolmentSettings | None:
        """Where credentials come from; None: ``redis_username``/``redis_password``
        (``ValueError`` for an unusable URL)."""
        if not self.credentials_url:
            return None
        return EnrolmentSettings(
            url=self.credentials_url,
            token_file=self.token_file,
            ca_file=self.credentials_ca_file,
            server_name=self.credentials_server_name,
        )

    @property
    def effective_ttl_s(self) -> int:
        """The TTL written on every hash."""
        return self.ttl_s if self.ttl_s is not None else freshness.ttl_seconds(self.interval_s)

    def cpus(self) -> CpuCount:
        """The run-queue wait ratio's CPU count: ``ncpu`` when given, else the cpuset of
        ``cgroup_root`` (reads cgroupfs)."""
        if self.ncpu is not None:
            return CpuCount(count=self.ncpu, source="--ncpu")
        return subtree_cpus(self.cgroup_root, self.cgroup_v2_mount, self.cgroup_v1_mount)

    def probe_context(self) -> ProbeContext:
        """What the probes need to know about this host."""
        return ProbeContext(
            cgroup_root=self.cgroup_root,
            cgroup_v2_mount=self.cgroup_v2_mount,
            cgroup_v1_mount=self.cgroup_v1_mount,
            proc_root=self.proc_root,
            tracefs=self.tracefs,
            bpf_source_dir=self.bpf_source_dir,
        )
