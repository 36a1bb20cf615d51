"""``interference``: look at the interference store (Redis) and compare policies on traces.

    interference top [--watch]          nodes ranked by interference index
    interference node NODE              one node: metrics, histograms, victim/antagonist pods
    interference explain NS/POD [--html FILE]   a pod's decision records (and a page)
    interference record --out FILE      save the nodes' NodeReports to a trace file
    interference simulate --trace FILE --pods FILE --policy A.yaml [--explain NS/POD [--html FILE]]
    interference recommend-tolerance NS/WORKLOAD [--prometheus URL | --trace FILE]

The Redis options may come before or after the command. Credentials: the URL's, or
REDIS_USERNAME / REDIS_PASSWORD (never printed). A bad command line exits 2, a problem
at run time (Redis unreachable, unknown node, unreadable file) exits 1; both print one
line on stderr saying what is wrong and what to do.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from interference import keys
from interference.decision import Decision
from interference.decision_page import render_decision_page
from interference_cli import json_output, views
from interference_cli.errors import CliError
from interference_cli.output_files import write_page
from interference_cli.plain import plain, text
from interference_cli.store import Store, split_pod_ref
from interference_infra.cliparse import RUNTIME_EXIT, USAGE_EXIT, OneLineParser
from interference_infra.redis_arguments import check_url
from interference_infra.redis_client import (
    DEFAULT_SENTINEL_MASTER,
    credentials_from_env,
    parse_sentinels,
    password_file_from_env,
)
from interference_infra.redis_tls import RedisTls
from interference_infra.strict import SettingsError, parse_bool
from interference_infra.version import add_version_argument

if TYPE_CHECKING:
    from interference_cli.trace import RecordResult

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
WIDE_OUTPUT_COLUMNS = 160
OUTPUT_FORMATS = ("table", "json")
"""``-o`` of ``top``, ``node`` and ``explain`` (:mod:`interference_cli.json_output`)."""
"""Width used when stdout is not a terminal, so piped tables keep every column."""


def _number_type(
    what: str, *, integer: bool = False, positive: bool = False
) -> Callable[[str], float]:
    """An argparse ``type`` accepting finite numbers ≥ 0 (> 0 with ``positive``)."""
    bound = "> 0" if positive else "≥ 0"

    def convert(text: str) -> float:
        try:
            value = int(text) if integer else float(text)
        except ValueError:
            kind = "a whole number" if integer else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind} ({what})") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number ({what})")
        if value < 0 or (positive and value == 0):
            raise argparse.ArgumentTypeError(f"{text} is out of range; allowed: {bound} ({what})")
        return value

    return convert


def _redis_options(parser: argparse.ArgumentParser, environ: Mapping[str, str], top: bool) -> None:
    """The Redis options; on subcommands their default is "not given", so a value before
    the command is not overwritten by the subcommand's default."""

    def default(value: str | None) -> str | None:
        return value if top else argparse.SUPPRESS

    group = parser.add_argument_group("Redis")
    group.add_argument(
        "--redis-url",
        default=default(environ.get("REDIS_URL") or DEFAULT_REDIS_URL),
        help="Redis holding the agents' reports, redis:// or rediss:// (TLS) (default: "
        f"$REDIS_URL or {DEFAULT_REDIS_URL}); user and password: REDIS_USERNAME, "
        "REDIS_PASSWORD or REDIS_PASSWORD_FILE (a file holding it); Sentinel: "
        "REDIS_SENTINELS=HOST:PORT,… and REDIS_SENTINEL_MASTER; "
        "Cluster: REDIS_CLUSTER=true",
    )
    group.add_argument(
        "--redis-ca-file",
        metavar="PEM",
        default=default(environ.get("REDIS_CA_FILE") or None),
        help="CA that signed the Redis server's certificate (env REDIS_CA_FILE)",
    )
    group.add_argument(
        "--redis-cert-file",
        metavar="PEM",
        default=default(environ.get("REDIS_CERT_FILE") or None),
        help="client certificate for TLS client authentication (env REDIS_CERT_FILE)",
    )
    group.add_argument(
        "--redis-key-file",
        metavar="PEM",
        default=default(environ.get("REDIS_KEY_FILE") or None),
        help="private key of the client certificate (env REDIS_KEY_FILE)",
    )


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The argument parser of every subcommand (defaults from ``environ``)."""
    env = os.environ if environ is None else environ
    parser = OneLineParser(
        prog="interference", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    add_version_argument(parser)
    _redis_options(parser, env, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, summary: str, description: str, example: str) -> OneLineParser:
        made: OneLineParser = sub.add_parser(
            name,
            help=summary,
            description=description,
            epilog=f"example:\n  {example}",
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        _redis_options(made, env, top=False)
        return made

    top = command(
        "top",
        "nodes ranked by interference index",
        "The nodes of the scheduler's ranking (intf:nodes, its own interference index), "
        "noisiest first, with their signals and the age of their latest report; stale "
        "nodes last. Without a ranking (no scheduler running), or with --all, every node "
        "with a scheduling record in Redis.",
        "interference top --watch --interval 2",
    )
    top.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    top.add_argument(
        "--all",
        action="store_true",
        help="also the nodes the scheduler does not rank (degraded ones): found with SCAN "
        "over every key, which costs Redis more on a big cluster",
    )
    top.add_argument(
        "--interval",
        type=_number_type("refresh period in seconds", positive=True),
        default=1.0,
        help="refresh period in seconds, > 0 (default 1)",
    )

    _output_option(top, "with --watch, one document per line per refresh")

    node = command(
        "node",
        "one node's metrics, histograms and pods",
        "One node's latest report: metrics, run-queue and reclaim histograms, and its pods "
        "ranked as victims (waiting most) and antagonists (using most CPU).",
        "interference node gpu-node-1",
    )
    node.add_argument("node", help="node name, as `interference top` lists it")
    _output_option(node)

    explain = command(
        "explain",
        "the scheduling decision record of a pod",
        "The interference-scheduler's latest decision for a pod: the chosen node, each "
        "rejected node with the reason and the measured value against the pod's tolerance, "
        "and each candidate's scores with their weights (total = Σ weight × score). Then, "
        "when there is one, its rebalancing record: the rebalancer's latest look at the "
        "running pod (result, the node it found, message, time, dry run or not, trace). "
        "Without a cluster: `interference simulate … --explain NS/POD`.",
        "interference explain shop/checkout-api-5b7d9c8f6-q4k2m",
    )
    explain.add_argument("pod", metavar="NS/POD", help="namespace/name of the pod")
    _output_option(explain)
    explain.add_argument(
        "--html",
        metavar="FILE",
        help="also write the decision as a self-contained HTML page (funnel, score parts, "
        "the chosen node's recent interference index); the rebalancing record's once the "
        "placement record is gone",
    )

    record = command(
        "record",
        "save the nodes' NodeReports to a trace file",
        "Append the agents' reports from every node's report stream in Redis "
        "(intf:node:NODE:reports, found again every few seconds) to a trace file "
        "(msgpack) for `interference simulate`, until --duration, --count or Ctrl-C. An "
        "existing trace is appended to (what it held is kept byte for byte); a file that "
        "is not one is refused. Exit 1, saying why, when no report was recorded.",
        "interference record --out trace.msgpack --duration 600",
    )
    record.add_argument("--out", required=True, help="trace file to write or append to (msgpack)")
    record.add_argument(
        "--duration",
        type=_number_type("seconds to record"),
        default=0.0,
        help="stop after S seconds, ≥ 0 (default 0: until --count or Ctrl-C)",
    )
    record.add_argument(
        "--count",
        type=_number_type("reports to record", integer=True),
        default=0,
        help="stop after N reports, ≥ 0 (default 0: until --duration or Ctrl-C)",
    )
    record.add_argument(
        "--from-start",
        action="store_true",
        help="include reports already in the streams (each node keeps its last "
        f"{keys.NODE_REPORTS_MAXLEN} reports: about {keys.NODE_REPORTS_MAXLEN} s at the agents'"
        " default 1 s interval)",
    )

    simulate = command(
        "simulate",
        "replay a trace through the cycle per policy",
        "Replay a recorded trace with a pod arrival list through the real scheduling cycle "
        "once per policy and compare the results side by side. The arrival format is "
        "documented in docs/operations.md (example: deploy/demo/arrivals.yaml). With "
        "--explain, also print the decision record one pod would have got under each "
        "policy: the offline way to read a decision without a cluster.",
        "interference simulate --trace tests/data/lab-trace.msgpack "
        "--pods deploy/demo/arrivals.yaml \\\n"
        "      --policy deploy/demo/policies/interference-aware.yaml "
        "--policy deploy/demo/policies/least-allocated.yaml --explain shop/web-3",
    )
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
    simulate.add_argument(
        "--explain",
        metavar="NS/POD",
        help="print the decision record of this pod (its last attempt) under each policy",
    )
    simulate.add_argument(
        "--html",
        metavar="FILE",
        help="with --explain, also write that decision as an HTML page (one file per policy "
        "when several: FILE's name gets the policy's)",
    )
    from interference_cli import recommend_command as recommend

    recommend.add_arguments(
        command(recommend.NAME, recommend.SUMMARY, recommend.DESCRIPTION, recommend.EXAMPLE),
        _output_option,
    )
    return parser


def store_from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Store:
    """The store the Redis options and REDIS_USERNAME / REDIS_PASSWORD point at; with
    REDIS_SENTINELS (and REDIS_SENTINEL_MASTER) or REDIS_CLUSTER as the agent takes them."""
    check_url(args.redis_url, environ)
    tls = RedisTls(args.redis_ca_file, args.redis_cert_file, args.redis_key_file)
    tls.check(args.redis_url)
    username, password = credentials_from_env(environ)
    cluster = environ.get("REDIS_CLUSTER", "").strip()
    return Store(
        args.redis_url,
        username=username,
        password=password,
        password_file=password_file_from_env(environ),
        tls=tls,
        sentinels=parse_sentinels(environ.get("REDIS_SENTINELS", ""), "REDIS_SENTINELS"),
        sentinel_master=environ.get("REDIS_SENTINEL_MASTER") or DEFAULT_SENTINEL_MASTER,
        cluster=parse_bool("REDIS_CLUSTER", cluster) if cluster else False,
    )


def _output_option(parser: argparse.ArgumentParser, more: str = "") -> None:
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default="table",
        help="table (for people, the default) or json: the same facts as one JSON document"
        " (numbers unrounded, times in Unix seconds, null where the table shows —)"
        + (f"; {more}" if more else ""),
    )


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of the ``interference`` console script; returns the exit status."""
    env = os.environ if environ is None else environ
    parser = build_parser(env)
    args = parser.parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else WIDE_OUTPUT_COLUMNS)
    try:
        return _run(args, console, env)
    except SettingsError as exc:
        print(f"interference: error: {plain(exc)}", file=sys.stderr)
        return USAGE_EXIT
    except CliError as exc:
        print(f"interference: {plain(exc)}", file=sys.stderr)
        return RUNTIME_EXIT
    except BrokenPipeError:
        return RUNTIME_EXIT  # `interference top | head`: the reader is gone
    except KeyboardInterrupt:
        return 130


def _run(args: argparse.Namespace, console: Console, env: Mapping[str, str]) -> int:
    if args.command == "simulate":
        from interference_cli.simulate import run_simulate_command

        return run_simulate_command(args, console)
    if args.command == "recommend-tolerance":
        from interference_cli.recommend_command import run

        return run(args, console, lambda: store_from_args(args, env))
    store = store_from_args(args, env)
    if args.command == "record":
        from interference_cli.trace import record_to_file

        recorded = record_to_file(
            store,
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
        if recorded.skipped:
            console.print(
                text(
                    f"skipped {len(recorded.skipped)} malformed stream entries, "
                    f"first: {recorded.skipped[0]}"
                )
            )
        if recorded.written == 0:
            print(
                f"interference: {plain(_nothing_recorded(args, store, recorded))}", file=sys.stderr
            )
            return RUNTIME_EXIT
        console.print(
            text(
                f"recorded {recorded.written} reports to {args.out}"
                + (" (appended to the trace already there)" if recorded.appended else "")
            )
        )
        return 0
    as_json = getattr(args, "output", "table") == "json"
    if args.command == "top":
        if args.watch and as_json:
            _watch_top_json(store, args.interval, scan=args.all)
        elif args.watch:
            _watch_top(store, console, args.interval, scan=args.all)
        elif as_json:
            now = time.time()
            document = json_output.top_document(
                store.node_rows(now, scan=args.all), now, store.shown_url
            )
            print(json_output.dumps(document))
        else:
            rows = store.node_rows(scan=args.all)
            console.print(views.top_table(rows, time.time(), store.shown_url))
    elif args.command == "node":
        now = time.time()
        detail = store.node_detail(args.node, now)
        if as_json:
            print(json_output.dumps(json_output.node_document(detail, now)))
        else:
            console.print(views.node_view(detail, now))
    elif args.command == "explain":
        namespace, pod = split_pod_ref(args.pod)
        records = store.pod_records(namespace, pod)
        if as_json:
            print(json_output.dumps(json_output.explain_document(records, time.time())))
        else:
            console.print(views.explain_view(records, time.time()))
        # the page draws the placement record; once it is gone, the rebalancer's search
        drawn = records.placement or records.rebalancing
        if args.html and drawn is not None:
            _write_decision_page(store, drawn, args.html, console)
    return 0


def _write_decision_page(store: Store, decision: Decision, path: str, console: Console) -> None:
    """``explain --html``: the page, with the chosen node's index from its report stream."""
    history = store.index_history(decision.node) if decision.node else []
    stream = keys.reports_key(decision.node)
    if history:
        covered = f"{len(history)} report(s) covering {history[-1][0] - history[0][0]:.0f} s"
        note = f"The node's last {covered}, from {stream}; read now, not at the decision."
    else:
        covered = ""
        note = f"Not available: the node's report stream ({stream}) is empty."
    write_page(path, render_decision_page(decision, history or None, history_note=note))
    console.print(
        text(
            f"decision page written to {path}" + (f" (index history: {covered})" if covered else "")
        )
    )


def _nothing_recorded(args: argparse.Namespace, store: Store, recorded: RecordResult) -> str:
    """Why a recording got no report, and what became of the file."""
    kept = (
        f"the trace in {args.out} is unchanged"
        if recorded.appended
        else f"{args.out} was not written"
    )
    if recorded.streams == 0 and not store.may_scan:
        why = (
            f"this Redis user may not SCAN and the scheduler ranks no node in Redis at "
            f"{store.where}, so no node's report stream could be found; record while the "
            "scheduler runs, or as a user allowed SCAN on intf:* (the viewer user's ACL)"
        )
    elif recorded.streams == 0:
        why = (
            f"no node report stream (intf:node:NODE:reports) in Redis at {store.where}: "
            "no agent publishes to this Redis; check --redis-url / REDIS_URL (host, port "
            "and database number) and that interference-agent runs on the nodes"
        )
    else:
        how = "from the start" if args.from_start else f"new in {recorded.duration_s:.0f} s"
        why = (
            f"{recorded.streams} nodes' report streams in Redis at {store.where}, but no "
            f"report {how}: are the agents still publishing? (without --from-start only "
            "reports added after the start are recorded; raise --duration or add "
            "--from-start to take what the streams hold)"
        )
    return f"recorded no reports: {why}; {kept}"


def _watch_top_json(store: Store, interval_s: float, *, scan: bool = False) -> None:
    """``top --watch -o json``: one compact document per line per refresh until Ctrl-C; a
    failing read is a line ``{"error": …}`` and the watch goes on."""
    try:
        while True:
            now = time.time()
            try:
                document = json_output.top_document(
                    store.node_rows(now, scan=scan), now, store.shown_url
                )
            except CliError as exc:
                document = {"time": now, "error": plain(exc)}
            print(json_output.dumps(document, compact=True), flush=True)
            time.sleep(interval_s)
    except KeyboardInterrupt:
        pass


def _watch_top(store: Store, console: Console, interval_s: float, *, scan: bool = False) -> None:
    """Refresh the ranking until Ctrl-C; a failing read shows its error and keeps trying.

    On a terminal the table is redrawn in place; piped, each refresh is printed in turn.
    """

    def view() -> Table | Text:
        now = time.time()
        try:
            return views.top_table(store.node_rows(now, scan=scan), now, store.shown_url)
        except CliError as exc:
            return text(f"{time.strftime('%H:%M:%S')} {exc}", style="red")

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
