"""The picture of a decision (issue 19, item 2): the page drawn from real decision records
(a real :class:`SchedulingCycle` over a small table, so the funnel is the cycle's),
opened in a real headless Chromium — a screenshot kept as a test artefact, the DOM dumped
and the funnel's numbers read back and compared with the record — and served by the
scheduler's HTTP port at ``/decisions/NS/POD``.

Screenshots go to ``$TEST_ARTEFACTS`` (default ``tests/artefacts/``, ignored by git).
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from html.parser import HTMLParser
from pathlib import Path

import pytest
import redis
from prometheus_client import CollectorRegistry

from interference import keys
from interference.decision import (
    Decision,
    IndexRead,
    RunqCheck,
    decision_hash,
    parse_decision_hash,
)
from interference.decision_page import failing_stage, first_cut_stage, render_decision_page
from interference.signals import NodeMetrics, NodeReport
from interference_cli.main import main
from interference_cli.simulate import load_policy, simulate
from interference_cli.workload import Arrival, Workload
from scheduler.adapters.decision_sink import RedisDecisionSink
from scheduler.adapters.queued_decision_sink import QueuedDecisionSink
from scheduler.adapters.redis_settings import RedisSettings, connect
from scheduler.adapters.signal_metrics import SignalMetrics
from scheduler.api.pods import parse_pod
from scheduler.cycle.cycle import SchedulingCycle
from scheduler.cycle.settings import CycleSettings
from scheduler.endpoint.http import HealthServer, HttpSettings, Status
from tests.builders import node_obj, pod_obj, table_of
from tests.cli.test_explain_tolerance import picky_decision
from tests.cli.test_query import publish
from tests.conftest import RedisServer

NOW = 1_700_000_000.0
AWARE_POLICY = Path("deploy") / "demo" / "policies" / "interference-aware.yaml"
CHROMIUM = next(
    (p for p in (shutil.which("chromium"), shutil.which("chromium-browser")) if p), None
)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no chromium binary (chromium or chromium-browser on PATH; Debian: apt-get "
    "install chromium): the page cannot be opened in a real browser",
)
ARTEFACTS = Path(os.environ.get("TEST_ARTEFACTS") or Path(__file__).parents[1] / "artefacts")


def decision_for(pod: dict[str, object], trace_id: str = "") -> Decision:
    """The record the scheduling loop would write for ``pod`` on a small cluster: 8 nodes,
    one tainted, one cordoned, three too small for 3 CPUs."""
    table = table_of(
        [
            node_obj("big-1", cpu="8"),
            node_obj("big-2", cpu="16"),
            node_obj("big-3", cpu="4"),
            node_obj("small-1", cpu="2"),
            node_obj("small-2", cpu="2"),
            node_obj("small-3", cpu="1"),
            node_obj("tainted", cpu="32", taints=[("dedicated", "gpu", "NoSchedule")]),
            node_obj("cordoned", cpu="32", unschedulable=True),
        ]
    )
    parsed = parse_pod(pod)
    result = SchedulingCycle(CycleSettings(), seed=0).schedule(parsed, table, NOW)
    decision = Decision(
        namespace=parsed.namespace,
        pod=parsed.name,
        result="scheduled" if result.node else "unschedulable",
        node=result.node or "",
        message=result.message,
        ts=NOW,
        candidates=list(result.candidates),
        rejected_by_reason=dict(result.reason_counts),
        funnel=list(result.funnel),
        omitted=dict(result.omitted),
        trace_id=trace_id,
    )
    return parse_decision_hash(decision_hash(decision))  # as read back from Redis


@pytest.fixture(scope="module")
def scheduled() -> Decision:
    return decision_for(
        pod_obj("checkout-0", "shop", requests={"cpu": "3"}),
        trace_id="0af7651916cd43dd8448eb211c80319c",
    )


@pytest.fixture(scope="module")
def unschedulable() -> Decision:
    return decision_for(pod_obj("huge-0", "shop", requests={"cpu": "20"}))


# --- reading the page back --------------------------------------------------------------


@dataclass
class OpenElement:
    """An element with an id whose end tag has not come: its tag, nested that deep."""

    id: str
    tag: str
    depth: int = 1


class PageReader(HTMLParser):
    """The elements of the page that carry numbers: funnel stages, the end of the funnel,
    finalists and their named parts, run-queue bars and the tolerance line, the advice,
    the bars of the index the decision read, published index points; and the text of each
    element with an id."""

    def __init__(self) -> None:
        super().__init__()
        self.stages: list[dict[str, str]] = []
        self.chosen: dict[str, str] | None = None
        self.finalists: list[dict[str, str]] = []
        self.parts: list[dict[str, str]] = []
        self.runq: list[dict[str, str]] = []
        self.index_read: list[dict[str, str]] = []
        self.points: list[dict[str, str]] = []
        self.by_id: dict[str, dict[str, str]] = {}
        self.text_of: dict[str, str] = {}
        self.ids: set[str] = set()
        self._open: list[OpenElement] = []
        """Each element with an id not yet closed."""

    @property
    def body(self) -> dict[str, str]:
        return self.by_id.get("__body__", {})

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.by_id["__body__"] = a
        for entry in self._open:  # the same tag nested inside an element with an id
            if entry.tag == tag:
                entry.depth += 1
        if "id" in a:
            self.ids.add(a["id"])
            self.by_id[a["id"]] = a
            self.text_of[a["id"]] = ""
            self._open.append(OpenElement(a["id"], tag))
        classes = a.get("class", "").split()
        if "data-stage" in a:
            self.stages.append(a)
        elif a.get("id") == "chosen":
            self.chosen = a
        elif "finalist" in classes:
            self.finalists.append(a)
        elif "part" in classes:
            self.parts.append(a)
        elif "runq" in classes:
            self.runq.append(a)
        elif "index-read" in classes:
            self.index_read.append(a)
        elif "point" in classes:
            self.points.append(a)

    def handle_data(self, data: str) -> None:
        for entry in self._open:
            self.text_of[entry.id] += data

    def handle_endtag(self, tag: str) -> None:
        for entry in self._open:
            if entry.tag == tag:
                entry.depth -= 1
        self._open = [entry for entry in self._open if entry.depth > 0]


def read_page(html: str) -> PageReader:
    reader = PageReader()
    reader.feed(html)
    return reader


def check_funnel(page: PageReader, decision: Decision) -> None:
    """The funnel read back equals the record's, stage by stage, with the marks."""
    assert [(s["data-stage"], int(s["data-in"]), int(s["data-out"])) for s in page.stages] == [
        (s.name, s.nodes_in, s.nodes_out) for s in decision.funnel
    ]
    cut, failing = first_cut_stage(decision.funnel), failing_stage(decision.funnel)
    marks = {s["data-stage"]: s["data-mark"] for s in page.stages if s["data-mark"]}
    expected = {}
    if cut is not None:
        expected[cut.name] = "first-cut"
    if failing is not None:
        expected[failing.name] = "failing"
    assert marks == expected
    assert page.chosen is not None and page.chosen["data-node"] == decision.node


# --- in a real browser ------------------------------------------------------------------


def chromium(*args: str, width: int = 1200) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        f"--window-size={width},1600",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def open_in_chromium(page: Path, screenshot: Path, width: int = 1200) -> str:
    """Screenshot the page into ``screenshot`` and return the DOM Chromium built, both in
    a window ``width`` pixels wide."""
    shot = chromium(f"--screenshot={screenshot}", page.as_uri(), width=width)
    assert screenshot.exists(), f"chromium wrote no screenshot: {shot.stderr[-2000:]}"
    dom = chromium("--dump-dom", page.as_uri(), width=width)
    assert dom.returncode == 0 and "<svg" in dom.stdout, dom.stderr[-2000:]
    return dom.stdout


MEASURE = (
    "<script>document.body.dataset.scrollWidth = document.documentElement.scrollWidth;"
    "document.body.dataset.innerWidth = window.innerWidth;</script>"
)
"""Appended to a copy of a page (the page itself has no script): Chromium's laid-out
width of the document and of the window, read back from the dumped DOM."""


def laid_out_width(page: Path, width: int) -> tuple[int, int]:
    """(the document's scroll width, the window's width) of ``page`` in Chromium."""
    measured = page.with_name(page.stem + "-measured.html")
    measured.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"))
    dom = chromium("--dump-dom", measured.as_uri(), width=width)
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = read_page(dom.stdout).body
    return int(body["data-scroll-width"]), int(body["data-inner-width"])


def png_pixels(path: Path) -> tuple[int, int, list[bytes]]:
    """Width, height and the (filtered) rows of a non-interlaced 8-bit PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, colour = struct.unpack(">IIBB", header[:10])
    assert depth == 8, depth
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[colour]
    raw = zlib.decompress(idat)
    stride = 1 + width * channels
    rows = [raw[i * stride : (i + 1) * stride] for i in range(height)]
    return width, height, rows


def check_screenshot(path: Path, size: tuple[int, int] = (1200, 1600)) -> None:
    """A non-blank picture: some KB, many different rows, many byte values."""
    assert path.stat().st_size > 10_000, path.stat().st_size
    width, height, rows = png_pixels(path)
    assert (width, height) == size
    assert len(set(rows)) > 50, "the screenshot is (nearly) one colour"
    assert len(set(b"".join(rows))) > 50


@pytest.fixture(scope="module")
def artefacts() -> Path:
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    return ARTEFACTS


@pytest.mark.slow
@needs_chromium
def test_a_scheduled_decision_in_chromium(scheduled: Decision, artefacts: Path) -> None:
    assert scheduled.node and len(scheduled.funnel) >= 3
    history = [(NOW - 60 + 10 * i, float(v)) for i, v in enumerate((5, 12, 30, 64, 41, 22, 9))]
    page = artefacts / "decision-scheduled.html"
    page.write_text(render_decision_page(scheduled, history), encoding="utf-8")
    dom = read_page(open_in_chromium(page, artefacts / "decision-scheduled.png"))
    check_funnel(dom, scheduled)
    assert dom.chosen is not None and "big-" in dom.chosen["data-node"]
    finalists = {f["data-node"]: float(f["data-total"]) for f in dom.finalists}
    assert finalists == {c.node: round(c.total, 2) for c in scheduled.candidates if c.passed}
    assert [float(p["data-index"]) for p in dom.points] == [v for _, v in history]
    assert "trace" in dom.ids and "rejected" in dom.ids
    check_screenshot(artefacts / "decision-scheduled.png")


@pytest.mark.slow
@needs_chromium
def test_an_unschedulable_decision_highlights_the_failing_filter(
    unschedulable: Decision, artefacts: Path
) -> None:
    failing = failing_stage(unschedulable.funnel)
    cut = first_cut_stage(unschedulable.funnel)
    # cordon and taint remove a node each first; then nothing has 20 CPUs
    assert failing is not None and failing.name == "NodeResourcesFit"
    assert cut is not None and cut.name != failing.name
    page = artefacts / "decision-unschedulable.html"
    page.write_text(render_decision_page(unschedulable), encoding="utf-8")
    dom = read_page(open_in_chromium(page, artefacts / "decision-unschedulable.png"))
    check_funnel(dom, unschedulable)
    failing_marked = [s["data-stage"] for s in dom.stages if s["data-mark"] == "failing"]
    assert failing_marked == ["NodeResourcesFit"]
    assert "index-none" in dom.ids  # no history offline
    check_screenshot(artefacts / "decision-unschedulable.png")


@pytest.fixture(scope="module")
def picky() -> Decision:
    """A pod no node passes for its run-queue tolerance, 10 s into its 60 s wait."""
    return picky_decision(NOW, waited_s=10)


@pytest.mark.slow
@needs_chromium
def test_a_tolerance_decision_shows_what_decided_and_what_to_do(
    picky: Decision, artefacts: Path
) -> None:
    """Issue 31, items 5 and 6: each recorded node's run-queue p99 against the tolerance
    line, from the record (no history given: nothing read at render time), and the
    nearest node, when the pod is relaxed and how far to raise the tolerance."""
    assert picky.runq is not None
    page = artefacts / "decision-tolerance.html"
    page.write_text(render_decision_page(picky), encoding="utf-8")
    shot = artefacts / "decision-tolerance.png"
    dom = read_page(open_in_chromium(page, shot, width=700))
    bars = {b["data-node"]: (float(b["data-runq-us"]), b["data-over"]) for b in dom.runq}
    assert bars == {
        "small": (100.0, "0"),
        "quiet": (900.0, "1"),
        "busy": (2600.0, "1"),
        "loud": (4000.0, "1"),
    }
    assert dom.by_id["runq-tolerance"]["data-tolerance-us"] == "500"
    assert "10s window" in dom.text_of["runq-note"]
    advice = dom.by_id["advice"]
    assert (advice["data-nearest"], advice["data-raise-to-us"]) == ("quiet", "900")
    assert float(advice["data-relax-at"]) == NOW + 50
    said = " ".join(dom.text_of["advice"].split())
    assert said.startswith(
        "What to do: Nearest node: quiet, run-queue p99 900 µs against the tolerance 500 µs "
        "(10s window). Relaxed to interference-blind in 50 s"
    )
    assert said.endswith("Hint: raise interference.io/max-runq-p99-us to at least 900 µs.")
    assert "Nearest node" not in dom.text_of["message"]  # said once, in the advice
    check_screenshot(shot, (700, 1600))


@pytest.mark.slow
@needs_chromium
@pytest.mark.parametrize("which", ["scheduled", "unschedulable", "picky"])
def test_each_page_fits_a_700_px_window(
    which: str, request: pytest.FixtureRequest, artefacts: Path
) -> None:
    decision: Decision = request.getfixturevalue(which)
    history = [(NOW - 9 + 3 * i, float(v)) for i, v in enumerate((5, 30, 12, 44))]
    page = artefacts / f"decision-{which}-700.html"
    page.write_text(render_decision_page(decision, history), encoding="utf-8")
    scroll_width, window_width = laid_out_width(page, 700)
    assert window_width == 700
    assert scroll_width <= 700, f"{which}: {scroll_width} px wide, scrolls sideways"
    shot = artefacts / f"decision-{which}-700.png"
    open_in_chromium(page, shot, width=700)
    check_screenshot(shot, (700, 1600))


def test_each_score_part_is_named(scheduled: Decision) -> None:
    page = read_page(render_decision_page(scheduled))
    finalists = [c for c in scheduled.candidates if c.passed]
    named = sorted(p["data-plugin"] for p in page.parts)
    assert named == sorted(plugin for c in finalists for plugin in c.scores)
    parts = page.text_of["score-parts"]
    for cand in finalists:
        for plugin, score in cand.scores.items():
            weight = cand.weights[plugin]
            assert f"{plugin} {weight:g} × {score:.1f} = {weight * score:.1f}" in parts


def test_the_index_chart_says_it_is_now_not_at_the_decision(scheduled: Decision) -> None:
    page = render_decision_page(scheduled, [(NOW, 10.0), (NOW + 1, 20.0)])
    heading = f"Interference index of {scheduled.node} as its agent publishes it now, not at"
    assert heading in page


def test_the_page_shows_the_index_the_decision_read_not_the_agents() -> None:
    """The agent publishes index 0 while its run-queue p99 is 6 ms, which the scheduler's
    references (quiet 4 ms, saturated 16 ms) make index 29: the decision read 29 from the
    scheduling record, and its page charts 29 as what decided, the agent's 0 apart."""
    reports = [
        NodeReport(
            "n",
            float(ts),
            1.0,
            NodeMetrics(runq_p99_us=6000, interference_index=0.0),
            measured=("runq",),
        )
        for ts in range(4)
    ]
    pod = pod_obj("p", requests={"cpu": "100m"})
    workload = Workload({"default": {"cpu": "4", "memory": "8Gi"}}, [Arrival(1.5, pod, None)])
    policy = load_policy(Path(__file__).resolve().parents[2] / AWARE_POLICY)
    decision = simulate(reports, workload, policy, explain="default/p").explained
    assert decision is not None and decision.node == "n"
    assert decision.interference_index is not None
    read = decision.interference_index.by_node["n"]
    assert read == pytest.approx(29, abs=1)
    window = decision.interference_index.window
    kept = parse_decision_hash(decision_hash(decision))  # as Redis keeps it
    assert kept.interference_index == IndexRead(window, {"n": round(read, 2)})
    published = [(r.ts, r.metrics.interference_index) for r in reports]
    page = read_page(render_decision_page(kept, published, history_before_decision=True))
    bars = {b["data-node"]: float(b["data-index"]) for b in page.index_read}
    assert bars == {"n": round(read, 1)}
    assert page.by_id["index-read"]["data-window"] == window
    assert [float(p["data-index"]) for p in page.points] == [0.0] * 4


def test_a_simulated_page_says_its_index_is_from_before_the_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``simulate --explain --html`` draws the trace's reports up to the decision (not
    now), and the run-queue chart from the simulated record."""
    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "web-29.html"
    code = main(
        [
            "simulate",
            "--trace",
            str(root / "tests" / "data" / "lab-trace.msgpack"),
            "--pods",
            str(root / "tests" / "data" / "lab-arrivals.yaml"),
            "--policy",
            str(root / "deploy" / "demo" / "policies" / "interference-aware.yaml"),
            "--explain",
            "shop/web-29",
            "--html",
            str(out),
        ]
    )
    capsys.readouterr()
    html = out.read_text(encoding="utf-8")
    assert code == 0 and " before the decision</h2>" in html and "now, not at" not in html
    page = read_page(html)
    assert page.by_id["runq-tolerance"]["data-tolerance-us"] == "10000"
    over = {b["data-node"]: b["data-over"] for b in page.runq}
    assert len(over) == 4 and sorted(over.values()) == ["0", "0", "1", "1"]


def test_every_string_from_the_record_is_escaped(scheduled: Decision) -> None:
    nasty = "<script>alert('x')</script> & \"q\""
    decision = replace(
        scheduled,
        message=nasty,
        trace_id=nasty,
        rejected_by_reason={nasty: 1},
        candidates=[replace(c, reasons=[nasty]) for c in scheduled.candidates],
    )
    page = render_decision_page(decision, history_note=nasty)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")
    # the run-queue chart and the advice: node names and the window from the record
    runq = RunqCheck(500.0, nasty, {nasty: 900.0, "quiet": 100.0}, nasty, NOW + 5)
    page = render_decision_page(replace(decision, result="unschedulable", runq=runq))
    assert "<script>" not in page and 'data-nearest="&lt;script&gt;' in page


def test_a_record_without_funnel_or_node_still_draws() -> None:
    decision = Decision("ns", "p", "unschedulable", "", "0/0 nodes are available", NOW)
    page = read_page(render_decision_page(decision))
    assert page.stages == [] and page.chosen is not None and page.chosen["data-node"] == ""


# --- from Redis: explain --html, and the scheduler's sink ---------------------------------


@pytest.mark.redis
def test_explain_html_reads_the_record_and_the_nodes_report_stream(
    scheduled: Decision,
    redis_server: RedisServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = redis_server.client()
    record: dict[str | bytes, bytes | float | int | str] = {}
    record.update(decision_hash(scheduled))
    client.hset(keys.decision_key("shop", "checkout-0"), mapping=record)
    for i, index in enumerate((10.0, 35.0, 20.0)):
        publish(
            client,
            NodeReport(
                scheduled.node,
                NOW + i,
                1.0,
                NodeMetrics(interference_index=index),
                measured=("runq",),
            ),
        )
    out = tmp_path / "page.html"
    code = main(["--redis-url", redis_server.url, "explain", "shop/checkout-0", "--html", str(out)])
    printed = capsys.readouterr().out
    assert code == 0 and f"decision page written to {out}" in printed
    assert "3 report(s) covering 2 s" in printed
    page = read_page(out.read_text(encoding="utf-8"))
    check_funnel(page, scheduled)
    assert [float(p["data-index"]) for p in page.points] == [10.0, 35.0, 20.0]

    sink = RedisDecisionSink(
        connect(RedisSettings(url=redis_server.url), env={}),
        RedisSettings(url=redis_server.url),
        SignalMetrics(CollectorRegistry()),
    )
    assert sink.read("shop", "checkout-0") == scheduled
    assert sink.read("shop", "nope") is None
    history = sink.index_history(scheduled.node)
    assert history is not None and [i for _, i in history] == [10.0, 35.0, 20.0]


# --- on the scheduler's HTTP port ---------------------------------------------------------


class MemoryDecisions:
    """An in-memory decision source."""

    def __init__(self, decisions: Sequence[Decision], history: list[tuple[float, float]]):
        self.decisions = {(d.namespace, d.pod): d for d in decisions}
        self.history = history

    def read(self, namespace: str, pod: str) -> Decision | None:
        if namespace == "broken":
            raise ConnectionError("Redis is down")
        return self.decisions.get((namespace, pod))

    def index_history(self, node: str) -> list[tuple[float, float]] | None:
        return self.history


@pytest.fixture
def server(scheduled: Decision, unschedulable: Decision) -> Iterator[HealthServer]:
    status = Status(synced=lambda: True, config_error=lambda: "", leading=lambda: True)
    source = MemoryDecisions([scheduled, unschedulable], [(NOW - 5, 12.0), (NOW, 40.0)])
    http = HealthServer(
        HttpSettings(host="127.0.0.1", port=0, debug_pages=True),
        CollectorRegistry(),
        status,
        decisions=source,
    )
    http.start()
    yield http
    http.stop()


def get(server: HealthServer, path: str) -> tuple[int, str, str]:
    url = f"http://127.0.0.1:{server.port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def test_the_http_port_serves_the_page(
    server: HealthServer, scheduled: Decision, unschedulable: Decision
) -> None:
    code, content_type, body = get(server, "/decisions/shop/checkout-0")
    assert code == 200 and content_type == "text/html; charset=utf-8"
    page = read_page(body)
    check_funnel(page, scheduled)
    assert [float(p["data-index"]) for p in page.points] == [12.0, 40.0]
    code, _, body = get(server, "/decisions/shop/huge-0")
    assert code == 200
    check_funnel(read_page(body), unschedulable)


def test_the_http_port_answers_404_for_an_unknown_pod(server: HealthServer) -> None:
    code, content_type, body = get(server, "/decisions/shop/no-such-pod")
    assert code == 404 and content_type.startswith("text/plain")
    assert body == (
        "no decision record for pod shop/no-such-pod: not scheduled by this scheduler, or "
        "its record has expired\n"
    )
    assert get(server, "/decisions/shop")[::2] == (
        404,
        "not found: ask for /decisions/NAMESPACE/POD\n",
    )
    code, _, body = get(server, "/decisions/broken/pod")
    assert code == 503 and "Redis is down" in body
    code, _, body = get(server, "/nothing")
    assert code == 404 and "/decisions/*" in body


def test_the_pages_are_off_by_default(scheduled: Decision) -> None:
    """The port admits metrics scrapers; without ``http.debug_pages`` they read no decision
    record and no configuration."""
    status = Status(synced=lambda: True, config_error=lambda: "", leading=lambda: True)
    config_route = {"/config": lambda path: (200, b"secret config\n", "text/plain")}
    http = HealthServer(
        HttpSettings(host="127.0.0.1", port=0),
        CollectorRegistry(),
        status,
        decisions=MemoryDecisions([scheduled], []),
        get_routes=config_route,
    )
    http.start()
    try:
        for path in ("/decisions/shop/checkout-0", "/config"):
            code, _, body = get(http, path)
            assert code == 404 and "secret" not in body and "checkout" not in body
        assert get(http, "/readyz")[0] == 200
    finally:
        http.stop()


def test_the_queued_sink_remembers_what_it_wrote(scheduled: Decision) -> None:
    """The deployed scheduler user may write decision records, not read them: the page
    shows what this replica decided from memory first."""
    settings = RedisSettings(url="redis://127.0.0.1:1/0", socket_timeout_s=0.2)
    sink = QueuedDecisionSink(
        RedisDecisionSink(connect(settings, env={}), settings, SignalMetrics(CollectorRegistry())),
        settings,
        remember=1,
    )
    try:
        sink.write(scheduled)
        assert sink.read("shop", "checkout-0") == scheduled
        sink.write(replace(scheduled, pod="other"))
        assert sink.read("shop", "other") is not None
        with pytest.raises(redis.ConnectionError):  # forgotten, and Redis is not there
            sink.read("shop", "checkout-0")
    finally:
        sink.close(timeout_s=5)
