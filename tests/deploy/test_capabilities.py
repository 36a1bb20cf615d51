"""The agent's capability set is what it really needs: the real ``interference-agent``
runs as uid 0 with exactly the capabilities the rendered DaemonSet adds (everything else
dropped, as the container runtime does) and all its probes work; without a capability
the probe that needs it stops working."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.manifests import container, find, kustomizations, render

pytestmark = [pytest.mark.bpf, pytest.mark.slow]

AGENT = Path(sys.executable).parent / "interference-agent"


def daemonset_capabilities() -> set[str]:
    agent = container(
        find(render(kustomizations()["base"]), "DaemonSet", "interference-agent"), "agent"
    )
    assert agent["securityContext"]["capabilities"]["drop"] == ["ALL"]
    return set(agent["securityContext"]["capabilities"]["add"])


def run_agent(capabilities: set[str], probes: str) -> dict[str, Any]:
    """One ``--once`` report of the real agent as uid 0 with only ``capabilities``."""
    if shutil.which("setpriv") is None:
        pytest.fail("setpriv (util-linux) is needed to drop capabilities")
    bounding = ",".join(["-all", *(f"+{c.lower()}" for c in sorted(capabilities))])
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=0",
            "--inh-caps=-all",
            f"--bounding-set={bounding}",
            str(AGENT),
            "--once",
            "--no-kubernetes",
            "--interval",
            "1",
            "--probes",
            probes,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def test_bpf_probes_load_with_exactly_the_daemonset_capabilities() -> None:
    report = run_agent(daemonset_capabilities(), "runqlat,reclaim")
    assert report["disabled_probes"] == {}
    assert report["metrics"]["runq_p99_us"] > 0
    assert report["histograms"]["runq_us"]


def test_without_perfmon_the_bpf_probes_stop_with_a_reason() -> None:
    report = run_agent(daemonset_capabilities() - {"PERFMON"}, "runqlat,reclaim")
    assert set(report["disabled_probes"]) == {"runqlat", "reclaim"}
    assert "CAP_PERFMON" in report["disabled_probes"]["runqlat"]


def test_the_taskstats_fallback_needs_net_admin() -> None:
    with_it = run_agent(daemonset_capabilities(), "taskstats")
    without = run_agent(daemonset_capabilities() - {"NET_ADMIN"}, "taskstats")
    assert with_it["pods"] and with_it["metrics"]["runq_wait_ratio"] > 0
    assert without["pods"] == [] and without["metrics"]["runq_wait_ratio"] == 0
    assert "CAP_NET_ADMIN" in without["disabled_probes"]["taskstats"]
