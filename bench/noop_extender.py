"""A no-op kube-scheduler extender: the ceiling of ``bench/extender_real_api.py``.

An emulator, on purpose: it measures what no real component can — what kube-scheduler
pays for calling *any* HTTP extender when the extender does no work. ``/filter`` passes
every offered node, ``/prioritize`` scores every node 0; nothing is cached, watched or
recorded. It is served by the same HTTP stack as ``interference-scheduler extender``
(:class:`scheduler.endpoint.http.HealthServer`: stdlib ``ThreadingHTTPServer``, HTTP/1.1
keep-alive, ``TCP_NODELAY``) and speaks the same protocol (``nodeCacheCapable: true``:
node names in, node names out), so kube-scheduler + this vs kube-scheduler + ours
isolates the work our extender does from the cost of the protocol itself.

    .venv/bin/python bench/noop_extender.py --port 10251
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scheduler.endpoint.http import HealthServer, HttpSettings, Status  # noqa: E402

JSON = "application/json"


def node_names(body: bytes) -> list[str]:
    """The ``NodeNames`` of an ``ExtenderArgs`` body (Go decodes keys case-insensitively)."""
    args = json.loads(body)
    for key, value in args.items():
        if key.lower() == "nodenames" and isinstance(value, list):
            return value
    return []


def noop_filter(body: bytes) -> tuple[int, bytes, str]:
    """``ExtenderFilterResult`` passing every offered node."""
    answer = {"NodeNames": node_names(body), "FailedNodes": {}, "FailedAndUnresolvableNodes": {}}
    return 200, json.dumps(answer, separators=(",", ":")).encode(), JSON


def noop_prioritize(body: bytes) -> tuple[int, bytes, str]:
    """``HostPriorityList`` scoring every offered node 0."""
    answer = [{"Host": name, "Score": 0} for name in node_names(body)]
    return 200, json.dumps(answer, separators=(",", ":")).encode(), JSON


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    args = parser.parse_args()
    server = HealthServer(
        HttpSettings(port=args.port, host=args.host),
        CollectorRegistry(),
        Status(synced=lambda: True, config_error=lambda: "", leading=lambda: True),
        {"/filter": noop_filter, "/prioritize": noop_prioritize},
    )
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    server.start()
    stop.wait()
    server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
