"""A local lab: a redis-server, a :class:`LocalCluster` and one real agent per node.

Used by ``make demo`` and by the recording of the committed test trace. Everything it
starts is ended by PID and every cgroup it creates is removed by :meth:`LocalLab.close`,
which is safe to call at any point of :meth:`LocalLab.start` (it undoes what was done).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import redis

from interference import keys
from interference_cli.redis_process import (
    RedisServerError,
    free_port,
    redis_server_argv,
    wait_until_answering,
)
from interference_demo.local_cluster import LocalCluster, NodeSpec, host_settings
from scheduler.cycle.ports import ClusterError, K8sObject

AGENT_START_TIMEOUT_S = 120.0
"""How long the agents may take to compile and load their BPF programs (slow when
several start at once on a busy host)."""
STOP_GRACE_S = 5.0
"""How long a process gets between SIGTERM and SIGKILL."""


class LabError(ClusterError):
    """The lab cannot run on this host; the message says why and what to do."""


class Processes:
    """Processes the lab started; :meth:`stop_all` ends them by PID."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str], log_path: Path) -> subprocess.Popen[bytes]:
        """Start ``argv`` with stdout and stderr going to ``log_path``."""
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        self.started.append(proc)
        return proc

    def stop_all(self) -> None:
        """SIGTERM every live process, SIGKILL those still there after the grace period."""
        for proc in self.started:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE_S
        for proc in self.started:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.started.clear()


def check_host() -> None:
    """:class:`LabError` unless this host can run the lab (root, redis-server, stress-ng)."""
    if os.geteuid() != 0:
        raise LabError("the lab creates cgroups and loads BPF programs: run it as root")
    for binary in ("redis-server", "stress-ng"):
        if shutil.which(binary) is None:
            raise LabError(f"{binary} is not installed; run `make setup` first")
    if not Path(sys.executable).with_name("interference-agent").exists():
        raise LabError("interference-agent is not installed in this venv; run `make setup`")


class LocalLab:
    """Redis + cgroup-partition nodes + agents on this host."""

    def __init__(
        self,
        nodes: list[NodeSpec],
        manifests: list[K8sObject],
        partition: str,
        *,
        interval_s: float = 1.0,
        log: Callable[[str], None] = print,
        future_pods: Mapping[str, str] | None = None,
    ) -> None:
        """``future_pods``: ``{uid: "namespace/name"}`` of pods created later (a
        ReplicaSet's replacements), so the agents name them too."""
        self.future_pods = dict(future_pods or {})
        self.nodes = nodes
        self.partition = partition
        self.interval_s = interval_s
        self.cluster = LocalCluster(nodes, manifests, host_settings(partition, log=log))
        self.processes = Processes()
        self.url = ""
        self._agents: dict[str, subprocess.Popen[bytes]] = {}
        self._workdir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def workdir(self) -> Path:
        """Temporary directory with the Redis data, the pods file and the agents' logs."""
        assert self._workdir is not None, "start() first"
        return Path(self._workdir.name)

    def start(self) -> None:
        """Start Redis, create the partitions (starting pods bound in the manifests) and
        start one agent per node."""
        check_host()
        self._workdir = tempfile.TemporaryDirectory(prefix=f"{self.partition}-")
        self.url = self._start_redis()
        self.cluster.create_partitions()
        pods_file = self.workdir / "pods.json"
        names = {**self.future_pods, **self.cluster.pods_file_content()}
        pods_file.write_text(json.dumps(names, indent=1))
        for node in self.nodes:
            self._start_agent(node.name, pods_file)

    def await_reports(self, timeout_s: float = AGENT_START_TIMEOUT_S) -> float:
        """Wait until every node's agent has published; returns the seconds it took.

        :class:`LabError` with the agent's last log line when one exits or stays silent.
        """
        started = time.monotonic()
        client = redis.Redis.from_url(self.url, socket_timeout=2.0)
        try:
            while True:
                # Each agent writes its node's scheduling record with every report.
                record_keys = [keys.sched_key(n.name) for n in self.nodes]
                present = [bool(found) for found in client.mget(record_keys)]
                silent = [n.name for n, ok in zip(self.nodes, present, strict=True) if not ok]
                if not silent:
                    return time.monotonic() - started
                dead = [n for n in silent if self._agents[n].poll() is not None]
                if dead or time.monotonic() - started > timeout_s:
                    node = (dead or silent)[0]
                    state = "exited" if dead else f"sent nothing in {timeout_s:g} s"
                    raise LabError(
                        f"the agent of {node} {state}; its last log line: {self._last_log(node)}"
                    )
                time.sleep(0.2)
        finally:
            client.close()

    def agent_log(self, node: str) -> Path:
        """Where the agent of ``node`` writes its log."""
        return self.workdir / f"agent-{node}.log"

    def close(self) -> None:
        """Stop agents and Redis, then the pods, remove the cgroups and the temp dir."""
        self.processes.stop_all()
        self.cluster.close()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None

    def _start_redis(self) -> str:
        port = free_port()
        log_path = self.workdir / "redis.log"
        proc = self.processes.start(redis_server_argv(port, str(self.workdir)), log_path)
        try:
            wait_until_answering(port, proc)
        except RedisServerError as exc:
            raise LabError(f"{exc}: {log_path.read_text()[-300:]}") from None
        return f"redis://127.0.0.1:{port}/0"

    def _start_agent(self, node: str, pods_file: Path) -> None:
        argv = [
            str(Path(sys.executable).with_name("interference-agent")),
            "--node-name", node,
            "--redis-url", self.url,
            "--interval", f"{self.interval_s:g}",
            "--cgroup-root", self.cluster.node_cgroup_root(node),
            "--pods-file", str(pods_file),
            "--no-kubernetes",
            "--http-port", "0",  # several agents share this host; the demo needs no probes
        ]  # fmt: skip
        self._agents[node] = self.processes.start(argv, self.agent_log(node))

    def _last_log(self, node: str) -> str:
        lines = self.agent_log(node).read_text(errors="replace").strip().splitlines()
        return lines[-1] if lines else "(empty)"
