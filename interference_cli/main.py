"""``interference``: look at the interference store (Redis) and compare policies on traces.

    interference top [--watch]          nodes ranked by interference score
    interference node NODE              one node: metrics, histograms, victim/antagonist pods
    interference explain NS/POD         the scheduler's decision record for a pod
    interference record --out FILE      save NodeReports from the stream to a trace file
    interference simulate --trace FILE --pods FILE --policy A.yaml --policy B.yaml

Every problem the user can fix prints one line on stderr and exits 1.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from interference_cli import views
from interference_cli.store import CliError, Store, split_pod_ref

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
WIDE_OUTPUT_COLUMNS = 160
"""Width used when stdout is not a terminal, so piped tables keep every column."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(
        prog="interference", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--redis-url",
        default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
        help="Redis holding the agents' reports (default: $REDIS_URL or %(default)s)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    top = sub.add_parser("top", help="nodes ranked by interference score")
    top.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    top.add_argument("--interval", type=float, default=1.0, help="refresh period, s")

    node = sub.add_parser("node", help="one node's metrics, histograms and pods")
    node.add_argument("node")

    explain = sub.add_parser("explain", help="the scheduling decision record of a pod")
    explain.add_argument("pod", metavar="NS/POD")

    record = sub.add_parser("record", help="save NodeReports from the stream to a trace file")
    record.add_argument("--out", required=True, help="trace file to write (msgpack)")
    record.add_argument("--duration", type=float, default=0.0, help="stop after S seconds")
    record.add_argument("--count", type=int, default=0, help="stop after N reports")
    record.add_argument(
        "--from-start", action="store_true", help="include reports already in the stream"
    )

    simulate = sub.add_parser("simulate", help="replay a trace through the engine per policy")
    simulate.add_argument("--trace", required=True, help="trace file from `interference record`")
    simulate.add_argument("--pods", required=True, help="pod arrival list (YAML)")
    simulate.add_argument(
        "--policy",
        action="append",
        required=True,
        help="scheduler config file; repeat to compare policies side by side",
    )
    simulate.add_argument("--json", action="store_true", help="print results as JSON")
    simulate.add_argument("--plot", metavar="PNG", help="write a comparison chart")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``interference`` console script; returns the exit status."""
    args = build_parser().parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else WIDE_OUTPUT_COLUMNS)
    try:
        return _run(args, console)
    except CliError as exc:
        print(f"interference: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace, console: Console) -> int:
    if args.command == "record":
        from interference_cli.trace import record_to_file

        recorded = record_to_file(
            Store(args.redis_url),
            args.out,
            duration_s=args.duration,
            max_reports=args.count,
            from_start=args.from_start,
            progress=(
                (lambda n: console.print(f"recorded {n} reports", end="\r"))
                if console.is_terminal
                else (lambda _: None)
            ),
        )
        console.print(f"recorded {recorded.written} reports to {args.out}")
        if recorded.skipped:
            console.print(
                f"skipped {len(recorded.skipped)} malformed stream entries, "
                f"first: {recorded.skipped[0]}"
            )
        return 0
    if args.command == "simulate":
        from interference_cli.simulate import run_simulate_command

        return run_simulate_command(args, console)

    store = Store(args.redis_url)
    if args.command == "top":
        if args.watch:
            _watch_top(store, console, args.interval)
        else:
            console.print(views.top_table(store.node_rows(), time.time(), store.url))
    elif args.command == "node":
        now = time.time()
        console.print(views.node_view(store.node_detail(args.node, now), now))
    elif args.command == "explain":
        namespace, pod = split_pod_ref(args.pod)
        console.print(views.decision_view(store.decision(namespace, pod), time.time()))
    return 0


def _watch_top(store: Store, console: Console, interval_s: float) -> None:
    """Refresh the ranking until Ctrl-C; a failing read shows its error and keeps trying.

    On a terminal the table is redrawn in place; piped, each refresh is printed in turn.
    """

    def view() -> Table | Text:
        now = time.time()
        try:
            return views.top_table(store.node_rows(now), now, store.url)
        except CliError as exc:
            return Text(f"{time.strftime('%H:%M:%S')} {exc}", style="red")

    try:
        if not console.is_terminal:
            while True:
                console.print(view())
                time.sleep(interval_s)
        with Live(console=console, auto_refresh=False) as live:
            while True:
                live.update(view(), refresh=True)
                time.sleep(interval_s)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends


if __name__ == "__main__":
    sys.exit(main())
