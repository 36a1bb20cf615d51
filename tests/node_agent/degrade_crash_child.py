"""An agent's degrader in a process of its own that SIGKILLs itself at one step, for
test_degrade_crash.py: ``python -m tests.node_agent.degrade_crash_child CONFIG_JSON``.

It starts as the agent does (``restore_saved``), sees ``contended`` intervals with the hog
as the antagonist, then ``quiet`` intervals past the least hold time, then stops cleanly
(``restore_all``). ``kill`` names the step it dies at, by wrapping what that step calls:

- ``recording``: the state file's temporary copy is written, the rename not done;
- ``recorded``: the state file is renamed into place, the cgroup file not yet written;
- ``written``: the cgroup file is written (nothing after it ran);
- ``restoring``: putting it back: the cgroup file is written back, the state file not
  updated;
- ``restore-recording``: the same, with the state file's temporary copy written.

Each Event is printed as a JSON line ``[pod, reason, message]``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

from prometheus_client import CollectorRegistry

from interference.signals import PodMetrics
from node_agent import degrade
from node_agent.cgroup_knobs import PodCgroups
from node_agent.degrade import DegradeMetrics, Degrader, DegradeSettings
from node_agent.probes.base import ProbeContext
from tests.node_agent.degrade_cgroups import Tree, contended, quiet

DEGRADING = ("recording", "recorded", "written")
RESTORING = ("restoring", "restore-recording")


class PrintedEvents:
    def emit(self, pod: PodMetrics, reason: str, message: str, warning: bool) -> None:
        print(json.dumps([pod.key, reason, message]), flush=True)


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(kill: str) -> None:
    real_write = degrade.write_knob  # type: ignore[attr-defined]

    def replace_then_never(src: Any, dst: Any) -> None:
        die()

    def write_then_die(knob: Any, value: str) -> None:
        real_write(knob, value)
        die()

    def die_before_write(knob: Any, value: str) -> None:
        die()

    if kill in ("recording", "restore-recording"):
        os.replace = replace_then_never  # type: ignore[assignment]
    elif kill == "recorded":
        degrade.write_knob = die_before_write  # type: ignore[attr-defined]
    elif kill in ("written", "restoring"):
        degrade.write_knob = write_then_die  # type: ignore[attr-defined]


def main(config: dict[str, Any]) -> None:
    tree = Tree(config["root"], config["uids"], config["qos"])
    settings = DegradeSettings(
        enabled=True,
        dry_run=False,
        min_degraded_s=30.0,
        state_file=config["state_file"],
        **config.get("settings", {}),
    )
    d = Degrader(
        settings,
        PodCgroups(ProbeContext(cgroup_root=tree.root)),
        PrintedEvents(),
        DegradeMetrics(CollectorRegistry()),
    )
    d.restore_saved()
    kill = config.get("kill", "")
    if kill in DEGRADING:
        arm(kill)
    now = time.monotonic()
    for _ in range(config.get("contended", 5)):
        d.observe(contended(tree), now)
        now += 1.0
    if kill in RESTORING:
        arm(kill)
    now += settings.min_degraded_s
    for _ in range(config.get("quiet", 0)):
        d.observe(quiet(tree), now)
        now += 1.0
    d.restore_all()


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
