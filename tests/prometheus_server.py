"""A real Prometheus for tests: Debian's ``/usr/bin/prometheus`` (scripts/setup.sh installs
it) on loopback with a free port, a generated configuration and its storage in a folder of
the test's, scraping the given targets every second; stopped by PID."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from interference_cli.redis_process import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
MISSING = "no prometheus binary (Debian's prometheus package; scripts/setup.sh installs it)"


def prometheus_missing() -> bool:
    return not Path(PROMETHEUS).exists()


@dataclass
class PrometheusServer:
    """One Prometheus process; ``targets``: job name → ``host:port`` of each ``/metrics``."""

    workdir: Path
    targets: Mapping[str, Sequence[str]]
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, ready_within_s: float = 30.0) -> None:
        jobs = [
            {"job_name": job, "static_configs": [{"targets": list(targets)}]}
            for job, targets in self.targets.items()
        ]
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": jobs,
        }
        config_path = self.workdir / "prometheus.yml"
        config_path.write_text(json.dumps(config))  # JSON is YAML
        with (self.workdir / "prometheus.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={config_path}",
                    f"--storage.tsdb.path={self.workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + ready_within_s
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not get ready:\n{self.log()[-2000:]}")
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return (self.workdir / "prometheus.log").read_text(errors="replace")

    def _get(self, path: str, params: Sequence[tuple[str, str]]) -> Any:
        """The ``data`` of an API answer; an error answer (a query that does not parse)
        raises with Prometheus' own message."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as answer:
                body = json.loads(answer.read())
        except urllib.error.HTTPError as exc:
            body = json.loads(exc.read() or b"{}")
        if body.get("status") != "success":
            raise ValueError(f"{body.get('errorType')}: {body.get('error')} ({params})")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series an instant query returns now."""
        data = self._get("/api/v1/query", [("query", expr)])
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        """What Grafana's ``label_values(match, label)`` offers."""
        values: list[str] = self._get(f"/api/v1/label/{label}/values", [("match[]", match)])
        return values

    def targets_health(self) -> dict[str, str]:
        """``job`` → health (``up``, ``down``, ``unknown``) of each active target."""
        data = self._get("/api/v1/targets", [("state", "active")])
        return {t["labels"]["job"]: t["health"] for t in data["activeTargets"]}
