"""``interference recommend-tolerance NAMESPACE/WORKLOAD``: a workload's
``interference.io/max-runq-p99-us`` from what its pods and the nodes measured, with the
reasoning (:mod:`interference_cli.tolerance_recommendation`; samples from
:mod:`interference_cli.tolerance_sources`)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from interference.annotations import MAX_RUNQ_P99_US
from interference.signals import WINDOWS_S, window_name
from interference_cli.errors import CliError
from interference_cli.plain import text
from interference_cli.store import Store
from interference_cli.tolerance_recommendation import (
    DEFAULT_MARGIN,
    Recommendation,
    recommend,
)

if TYPE_CHECKING:
    from interference_cli import tolerance_sources as sources

NAME = "recommend-tolerance"
SUMMARY = "a workload's max-runq-p99-us from what it and the nodes measured"
DESCRIPTION = (
    "Recommend a workload's interference.io/max-runq-p99-us (µs) from its pods' run-queue "
    "p99 and the nodes' run-queue p99 as the Interference filter reads them (its "
    "signal_window), with the reasoning: the workload's own p50/p90/max, each node's "
    "p50/level/max over the period, the bounds, the margin and the share of nodes that pass "
    "at the recommended and at the declared tolerance "
    '(docs/operations.md, "Choosing a tolerance"). '
    "WORKLOAD is the pods' owner as kubectl names its pods: a Deployment's "
    "(NAME-HASH-xxxxx), a ReplicaSet's, DaemonSet's or Job's (NAME-xxxxx), a StatefulSet's "
    "(NAME-0, NAME-1, …) or one pod's own name; no label selector, as neither the reports "
    "nor the metrics carry labels. Samples from --prometheus (query_range over --period), "
    "else --trace (a recorded trace), else the agents' report streams in Redis (their last "
    "reports per node: seconds, not a day)."
)
WINDOWS = ("latest", *(window_name(span) for span in WINDOWS_S))
"""The Interference plugin's ``signal_window`` values (read here without loading it: the
parser of every command is built from this module)."""
DEFAULT_WINDOW = "10s"
"""The plugin's default ``signal_window``."""
EXAMPLE = (
    "interference recommend-tolerance lab/probe --trace tests/data/lab-trace.msgpack "
    "--window latest --declared 500"
)


def add_arguments(parser: argparse.ArgumentParser, output_option: Callable[..., None]) -> None:
    """The command's arguments (the Redis ones are added by the caller)."""
    parser.add_argument("workload", metavar="NAMESPACE/WORKLOAD", help="the pods' owner")
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--prometheus",
        metavar="URL",
        help="Prometheus scraping the agents (http://HOST:9090): their run-queue p99 "
        "series over --period",
    )
    where.add_argument("--trace", metavar="FILE", help="a trace from `interference record`")
    parser.add_argument(
        "--period",
        default="24h",
        help="with --prometheus, how far back: 24h, 30m, 7d, … (default 24h)",
    )
    parser.add_argument(
        "--window",
        choices=WINDOWS,
        default=DEFAULT_WINDOW,
        help="the nodes' window, as the Interference plugin's signal_window (default "
        f"{DEFAULT_WINDOW}); a report without it counts its latest interval",
    )
    parser.add_argument(
        "--margin",
        type=_finite_non_negative,
        default=DEFAULT_MARGIN,
        help=f"added to the lower bound, ≥ 0 (default {DEFAULT_MARGIN:g}: 15 %%)",
    )
    parser.add_argument(
        "--declared",
        metavar="US",
        type=_finite_non_negative,
        help="the tolerance the workload declares now, µs, to count the nodes it passes "
        "(with --prometheus: read from the pods' tolerance metric unless given)",
    )
    output_option(parser)


def _finite_non_negative(value: str) -> float:
    """An argparse ``type``: a finite number ≥ 0."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0 <= number < float("inf"):
        raise argparse.ArgumentTypeError(f"{value} is out of range; allowed: a finite number ≥ 0")
    return number


def run(args: argparse.Namespace, console: Console, store: Callable[[], Store]) -> int:
    """Read the samples, recommend, print (a table or ``-o json``)."""
    from interference_cli import tolerance_sources as sources

    namespace, slash, workload = args.workload.partition("/")
    if not slash:
        raise CliError(f"{args.workload!r}: give NAMESPACE/WORKLOAD, e.g. shop/checkout-api")
    sources.check_workload(namespace, workload)
    if args.prometheus:
        try:
            period_s = sources.parse_period(args.period)
        except ValueError as exc:
            raise CliError(f"--period: {exc}") from exc
        samples = sources.from_prometheus(
            args.prometheus, namespace, workload, args.window, period_s
        )
    elif args.trace:
        from interference_cli.trace import load_trace

        samples = sources.from_reports(
            load_trace(args.trace), namespace, workload, args.window, f"trace {args.trace}"
        )
    else:
        samples = sources.from_redis(store(), namespace, workload, args.window)
    if not samples.workload_p99s:
        raise CliError(
            f"no run-queue p99 of a pod of {namespace}/{workload} in {samples.source}: no pod "
            f"named {workload}, {workload}-0, {workload}-HASH-xxxxx, … waited for a CPU there"
        )
    if not samples.node_p99s:
        raise CliError(
            f"no node's run-queue p99 (window {args.window}) in {samples.source}"
            + ("; agents that publish no windows: try --window latest" if args.prometheus else "")
        )
    declared = args.declared if args.declared is not None else samples.declared_us
    result = recommend(
        samples.workload_p99s, samples.node_p99s, margin=args.margin, declared_us=declared
    )
    if args.output == "json":
        from interference_cli import json_output

        print(json_output.dumps(recommendation_document(args.workload, samples, result)))
    else:
        console.print(recommendation_view(args.workload, samples, result))
    return 0


def recommendation_document(
    workload: str, samples: sources.Samples, result: Recommendation
) -> dict[str, Any]:
    """``-o json``: the same facts as the table, numbers unrounded."""
    declared = result.declared_us
    return {
        "workload": workload,
        "annotation": MAX_RUNQ_P99_US,
        "target_us": result.target_us,
        "lower_bound_us": result.lower_bound_us,
        "upper_bound_us": result.upper_bound_us,
        "bound_by": result.bound_by,
        "margin": result.margin,
        "node_quantile": result.node_quantile,
        "source": samples.source,
        "window": samples.window,
        "covered_s": samples.covered_s,
        "skipped_entries": samples.skipped,
        "node_samples_without_window": samples.without_window,
        "workload_p99": {
            "pods": sorted(samples.pods),
            "samples": result.workload_samples,
            "p50_us": result.workload_p50_us,
            "p90_us": result.workload_p90_us,
            "max_us": result.workload_max_us,
        },
        "nodes": [
            {
                "node": n.node,
                "samples": n.samples,
                "p50_us": n.p50_us,
                "level_us": n.level_us,
                "max_us": n.max_us,
                "passes_target": n.level_us <= result.target_us,
                "passes_declared": None if declared is None else n.level_us <= declared,
            }
            for n in result.nodes
        ],
        "passing_at_target": result.passing(result.target_us),
        "declared_us": declared,
        "passing_at_declared": None if declared is None else result.passing(declared),
    }


def _us(value: float) -> str:
    return f"{value:,.0f} µs"


def recommendation_view(workload: str, samples: sources.Samples, result: Recommendation) -> Group:
    """The recommendation, then the workload's and the nodes' figures and the reasoning."""
    quantile = f"p{100 * result.node_quantile:g}"
    total = len(result.nodes)
    head = text(
        f'{MAX_RUNQ_P99_US}: "{result.target_us}"   recommended for {workload}', style="bold"
    )
    lines = [
        head,
        text(
            f"from {samples.source}, {samples.covered_s:,.0f} s; nodes' window: "
            f"{samples.window}"
            + (
                f" ({samples.without_window} of {sum(map(len, samples.node_p99s.values()))} "
                "from their latest interval: those reports have no such window)"
                if samples.without_window and samples.window != "latest"
                else ""
            )
            + (f"; {samples.skipped} stream entries did not decode" if samples.skipped else "")
        ),
        Text(""),
        text(
            f"the workload's own run-queue p99 ({result.workload_samples} intervals of "
            f"{len(samples.pods)} pod{'' if len(samples.pods) == 1 else 's'}: "
            f"{', '.join(sorted(samples.pods)[:6])}"
            f"{' …' if len(samples.pods) > 6 else ''}): p50 {_us(result.workload_p50_us)}, "
            f"p90 {_us(result.workload_p90_us)}, max {_us(result.workload_max_us)}"
        ),
    ]
    table = Table(title="the nodes' run-queue p99 over the period, quietest first")
    for column in ("node", "samples", "p50", f"level ({quantile})", "max"):
        table.add_column(column, justify="left" if column == "node" else "right")
    table.add_column(f"passes at {result.target_us}")
    if result.declared_us is not None:
        table.add_column(f"at declared {result.declared_us:g}")
    for n in result.nodes:
        row = [n.node, str(n.samples), _us(n.p50_us), _us(n.level_us), _us(n.max_us)]
        row.append("yes" if n.level_us <= result.target_us else "no")
        if result.declared_us is not None:
            row.append("yes" if n.level_us <= result.declared_us else "no")
        table.add_row(*(text(cell) for cell in row))
    why_lower = (
        f"the level of the quietest node, {result.quietest_node}: below it no node stays "
        f"under the tolerance for {100 * result.node_quantile:g} % of the period"
        if result.bound_by == "quietest node"
        else "the workload's own p50: its pods measure more in half of their intervals, "
        "and a node running them shows their waits too"
    )
    reasons = [
        text(f"lower bound {_us(result.lower_bound_us)}: {why_lower}"),
        text(
            f"target {_us(result.target_us)} = lower bound × (1 + margin {result.margin:g}), "
            "rounded up to two significant digits; the margin because the next period is "
            "not this one (a window's p99 moves from one window to the next)"
        ),
        text(
            f"upper bound {_us(result.upper_bound_us)}: the noisiest node's level; at or "
            "above it every node passes and the tolerance filters nothing"
        ),
        text(
            f"nodes passing at {result.target_us} µs: {result.passing(result.target_us)} of "
            f"{total} ({_share(result.passing(result.target_us), total)})"
            + (
                f"; at the declared {result.declared_us:g} µs: "
                f"{result.passing(result.declared_us)} of {total} "
                f"({_share(result.passing(result.declared_us), total)})"
                if result.declared_us is not None
                else ""
            )
        ),
    ]
    return Group(*lines, Text(""), table, *reasons)


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.0f} %" if total else "—"
