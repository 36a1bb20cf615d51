"""Every name from the store or the API that the ``interference`` CLI prints is printed as
text (interference_cli.plain): fuzzed names carrying rich markup (``[link=…]``,
``[bold]``), emoji codes, ESC/CSI/OSC sequences, ``\\r``, C1 controls, bidi overrides and
zero-width characters never reach the output raw, in every view that prints names, and
the name itself is shown (escaped), not interpreted."""

from __future__ import annotations

import io
import unicodedata
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console, RenderableType

from interference.decision import CandidateVerdict, Decision, FunnelStage, RunqCheck
from interference.signals import NodeMetrics, PodMetrics, WindowMetrics
from interference_cli import main as cli_main
from interference_cli import views
from interference_cli.errors import CliError
from interference_cli.plain import plain
from interference_cli.simulate import PolicyResult, result_table
from interference_cli.store_model import NodeDetail, NodeRow, PodRecords, PodRow

NASTY = (
    "[link=https://evil.example]",
    "[/link]",
    "[bold red]",
    "[/]",
    ":smile:",
    "\x1b[2J",
    "\x1b]8;;https://evil.example\x1b\\",
    "\x1b[31m",
    "\x9b2J",
    "\r",
    "\n",
    "\t",
    "\x07",
    "\x08",
    "\x00",
    "\x7f",
    "\u202e",
    "\u2066",
    "\u200b",
    "\ufeff",
    "\u2028",
)
RAW = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})

names = st.lists(
    st.one_of(st.sampled_from(NASTY), st.text(max_size=6)), min_size=1, max_size=5
).map("".join)


def render(renderable: RenderableType) -> str:
    """What a terminal would receive (no colour, so any control character is a leak)."""
    out = io.StringIO()
    console = Console(file=out, width=1000, color_system=None, force_terminal=False)
    console.print(renderable)
    return out.getvalue()


def assert_printed_as_text(output: str, *values: str) -> None:
    leaked = sorted({ch for ch in output if ch != "\n" and unicodedata.category(ch) in RAW})
    assert leaked == [], f"raw control or format characters reached the output: {leaked!r}"
    squeezed = "".join(output.split())  # a long title wraps: compare without blanks
    for value in values:
        assert "".join(plain(value).split()) in squeezed, f"{value!r} not shown as text"


def node_row(node: str, state: str = "ok", measured: tuple[str, ...] = ("runq",)) -> NodeRow:
    metrics = NodeMetrics(runq_p99_us=1200, interference_index=42.0)
    return NodeRow(node, metrics, 1000.0, 1.0, 2, state, measured=measured, scheduler_index=40.0)


def pod_row(namespace: str, name: str, culprit: str = "", qos: str = "burstable") -> PodRow:
    culprits = ((culprit, 3.5),) if culprit else ()
    metrics = PodMetrics(
        namespace,
        name,
        uid="u",
        qos=qos,
        cpu_ms_per_s=50.0,
        runq_wait_ms_per_s=4.0,
        neighbour_wait_ms_per_s=3.5,
        culprits=culprits,
    )
    return PodRow(metrics, 1000.0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node=names, namespace=names, pod=names, culprit=names, state=names, source=names)
def test_top_table(
    node: str, namespace: str, pod: str, culprit: str, state: str, source: str
) -> None:
    rows = [node_row(node, state), NodeRow(namespace, None, 900.0, 1.0, 0, "stale")]
    assert_printed_as_text(render(views.top_table(rows, 1001.0, source)), node, state, source)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node=names, namespace=names, pod=names, culprit=names, window=names, hist=names, probe=names)
def test_node_view(
    node: str, namespace: str, pod: str, culprit: str, window: str, hist: str, probe: str
) -> None:
    row = pod_row(namespace, pod, culprit, qos=probe)
    detail = NodeDetail(
        node_row(node, measured=(probe,)),
        histograms={hist: [0, 3, 5, 1]},
        pods=[row],
        disabled_probes=probe,
        windows={window: WindowMetrics(span_s=10.0, covered_s=10.0, intervals=10)},
    )
    output = render(views.node_view(detail, 1001.0))
    assert_printed_as_text(output, node, row.metrics.key, culprit, window, hist, probe)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    namespace=names, pod=names, node=names, other=names, reason=names, message=names,
    plugin=names, detail=names, trace=names,
)  # fmt: skip
def test_decision_view(
    namespace: str, pod: str, node: str, other: str, reason: str, message: str,
    plugin: str, detail: str, trace: str,
) -> None:  # fmt: skip
    decision = Decision(
        namespace,
        pod,
        "scheduled",
        node,
        message,
        1000.0,
        candidates=[
            CandidateVerdict(
                node,
                True,
                scores={plugin: 80.0},
                total=80.0,
                details={detail: reason},
                weights={plugin: 2.0},
            ),
            CandidateVerdict(other, False, reasons=[reason]),
        ],
        rejected_by_reason={reason: 1},
        funnel=[FunnelStage(plugin, 2, 1)],
        omitted={reason: 3},
        trace_id=trace,
    )
    output = render(views.decision_view(decision, 1001.0))
    assert_printed_as_text(
        output, f"{namespace}/{pod}", node, other, reason, message, plugin, detail, trace
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node=names, nearest=names, window=names)
def test_decision_view_of_a_pod_its_tolerance_keeps_pending(
    node: str, nearest: str, window: str
) -> None:
    runq = RunqCheck(500.0, window, {node: 2900.0, nearest: 900.0}, nearest, 1030.0)
    decision = Decision("shop", "picky-0", "unschedulable", "", "0/2 nodes", 1000.0, runq=runq)
    output = render(views.decision_view(decision, 1001.0))
    assert_printed_as_text(output, node, nearest, window)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    namespace=names, pod=names, node=names, result=names, message=names, trace=names,
    placement_kept=st.booleans(),
)  # fmt: skip
def test_explain_view_with_a_rebalancing_record(
    namespace: str, pod: str, node: str, result: str, message: str, trace: str,
    placement_kept: bool,
) -> None:  # fmt: skip
    """The rebalancing record's section, after the placement record or alone."""
    placement = Decision(namespace, pod, "scheduled", "node-a", "placed", 900.0)
    rebalancing = Decision(namespace, pod, result, node, message, 1000.0, trace_id=trace)
    records = PodRecords(placement if placement_kept else None, rebalancing)
    output = render(views.explain_view(records, 1001.0))
    assert_printed_as_text(output, f"{namespace}/{pod}", node, result, message, trace)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=names)
def test_simulate_result_table(policy: str) -> None:
    output = render(result_table([PolicyResult(policy, placed=3)], 10, 3))
    assert_printed_as_text(output, policy)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=names)
def test_errors_naming_a_store_value(name: str) -> None:
    """An error message that carries a name (``node X has no report``) goes to stderr as
    text too."""
    failing: Callable[..., int] = lambda *_: (_ for _ in ()).throw(  # noqa: E731
        CliError(f"node {name} has no report")
    )
    stderr = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli_main, "_run", failing)
        patch.setattr("sys.stderr", stderr)
        assert cli_main.main(["top"], environ={}) == 1
    assert_printed_as_text(stderr.getvalue(), name)


@pytest.mark.parametrize("name", NASTY)
def test_each_fragment_alone(name: str) -> None:
    """Each known-bad fragment on its own, as a node name in the ranking."""
    output = render(views.top_table([node_row(f"n{name}x")], 1001.0, "redis://r"))
    assert_printed_as_text(output, f"n{name}x")
