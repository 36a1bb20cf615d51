"""Everything the credential issuer is configured with, in one dataclass passed explicitly."""

from __future__ import annotations

from dataclasses import dataclass, field

from credential_issuer.warden import WardenLimits
from interference import keys
from interference_infra.redis_client import DEFAULT_SENTINEL_MASTER, RedisTarget
from interference_infra.redis_tls import RedisTls

DEFAULT_PORT = 10272
"""The issuer's port: beside the agent's 10271, outside Kubernetes' own 10248–10259, the
Prometheus exporters' 9100–9999 and the NodePort and ephemeral ranges."""
DEFAULT_AUDIENCE = "interference-credentials"
"""The audience the agent's projected token is issued for, and the only one accepted."""
DEFAULT_AGENT_SERVICE_ACCOUNT = "interference-agent/interference-agent"
"""``namespace/name`` of the agents' ServiceAccount (deploy/'s DaemonSet)."""
CREDENTIALS_PATH = "/v1/credentials"
"""The one POST endpoint."""


def parse_service_account(value: str) -> tuple[str, str]:
    """``namespace/name`` as a pair; ``ValueError`` saying what is expected."""
    namespace, sep, name = value.strip().partition("/")
    if (
        not sep
        or not keys.valid_node_name(namespace)
        or "." in namespace
        or not keys.valid_node_name(name)
    ):
        raise ValueError(
            f"--agent-service-account {value!r} is not NAMESPACE/NAME, e.g. "
            f"{DEFAULT_AGENT_SERVICE_ACCOUNT}"
        )
    return namespace, name


@dataclass(frozen=True)
class IssuerSettings:
    """Configuration of ``interference-credentials`` (built by ``credential_issuer.cli``)."""

    redis: RedisTarget
    """Where the agents' users are created (every node of a Cluster); the issuer's own
    user needs ``ACL SETUSER`` and ``PING`` (and on a Cluster ``CLUSTER SLOTS`` and
    ``COMMAND``)."""
    address: str = "0.0.0.0"
    """Listen address."""
    port: int = DEFAULT_PORT
    """Listen port (0: any free port)."""
    tls_cert_file: str | None = None
    """PEM certificate (chain) to serve HTTPS with; None serves plain HTTP."""
    tls_key_file: str | None = None
    """Its private key."""
    audience: str = DEFAULT_AUDIENCE
    """The one audience a token must carry."""
    agent_service_account: tuple[str, str] = ("interference-agent", "interference-agent")
    """``(namespace, name)`` of the only ServiceAccount whose tokens are accepted."""
    kubeconfig: str | None = None
    """Kubeconfig for the TokenReviews; None: in-cluster, then ``~/.kube/config``."""
    review_timeout_s: float = 5.0
    """Timeout of one TokenReview call."""
    redis_socket_timeout_s: float = 2.0
    """Connect and read timeout of each Redis call."""
    min_reissue_s: float = 5.0
    """At most one issue per node per this many seconds (more is answered 429)."""
    max_body_bytes: int = 4096
    """Largest request body read (the token travels in the Authorization header; the body
    is expected empty)."""
    max_token_bytes: int = 16384
    """Longest bearer token sent for review."""
    max_connections: int = 64
    """Requests served at once; further whole requests wait for a thread (503 after 2 s).
    A slow client holds no thread: requests are read whole before one takes them."""
    request_timeout_s: float = 10.0
    """A client must send its whole request within this (and finish the TLS handshake
    within it, at most 5 s), however slowly its bytes come."""
    log_interval_s: float = 60.0
    """Each kind of refusal is logged at most once per this many seconds (with a count)."""
    warden: bool = True
    """Run the warden (:mod:`credential_issuer.warden`): cut off a node that keeps more in
    Redis than its agent may. Not on a Redis Cluster."""
    limits: WardenLimits = field(default_factory=WardenLimits)
    """What one node's agent may keep in Redis."""
    warden_react_s: float = 0.2
    """Keys named by a key event are checked within this."""
    warden_sweep_s: float = 10.0
    """Every node key is checked this often (and each second while Redis' memory is past
    ``warden_pressure`` of ``maxmemory``)."""
    warden_pressure: float = 0.8
    """Share of ``maxmemory`` past which the sweeps run every second."""
    warden_cooldown_s: float = 300.0
    """A node cut off gets no new password for this long."""

    @property
    def agent_username(self) -> str:
        """The Kubernetes user name of the agents' ServiceAccount tokens."""
        namespace, name = self.agent_service_account
        return f"system:serviceaccount:{namespace}:{name}"

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0–65535, got {self.port}")
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError(
                "TLS needs both --tls-cert-file and --tls-key-file (TLS_CERT_FILE, TLS_KEY_FILE)"
            )
        if not self.audience:
            raise ValueError("the audience must not be empty")
        for name in (
            "review_timeout_s",
            "redis_socket_timeout_s",
            "request_timeout_s",
            "log_interval_s",
            "warden_react_s",
            "warden_sweep_s",
            "warden_cooldown_s",
        ):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.warden_pressure <= 1:
            raise ValueError(f"warden_pressure must be > 0 and ≤ 1, got {self.warden_pressure}")
        if self.min_reissue_s < 0:
            raise ValueError(f"min_reissue_s must be ≥ 0, got {self.min_reissue_s}")
        for name in ("max_body_bytes", "max_token_bytes", "max_connections"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")


def redis_target(
    url: str,
    *,
    username: str | None = None,
    password: str | None = None,
    password_file: str | None = None,
    cluster: bool = False,
    sentinels: tuple[tuple[str, int], ...] = (),
    sentinel_master: str = DEFAULT_SENTINEL_MASTER,
    tls: RedisTls | None = None,
) -> RedisTarget:
    """The issuer's Redis target (``ValueError`` for one that cannot work)."""
    return RedisTarget(
        url,
        sentinels=sentinels,
        sentinel_master=sentinel_master,
        cluster=cluster,
        tls=tls if tls is not None else RedisTls(),
        username=username,
        password=password,
        password_file=password_file,
    )
