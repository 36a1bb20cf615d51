"""The documents and the programs' help say what the code does (issue 31): the report
stream's length, the commands' help and examples, the paths and sections they point at,
the scheduler's Redis commands and what an install needs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from interference import keys
from interference_cli.main import build_parser
from interference_cli.workload import load_workload
from scheduler.adapters.redis_settings import ACL_COMMANDS
from scheduler.endpoint.http import EXTENDER_PORT
from scheduler.entry.extender_cli import build_parser as extender_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
N = keys.NODE_REPORTS_MAXLEN


def read(path: str) -> str:
    return (REPO / path).read_text(encoding="utf-8")


def flat(text: str) -> str:
    """Words only: line breaks, comment marks and Markdown emphasis gone."""
    return " ".join(w for w in text.replace("**", "").split() if w != "#")


def subcommand_help(name: str) -> str:
    parser = build_parser({})
    actions = [a for a in parser._actions if a.dest == "command"]
    return flat(actions[0].choices[name].format_help())  # type: ignore[attr-defined]


def test_the_report_stream_length_is_the_constant_everywhere() -> None:
    assert N == 10
    operations = flat(read("docs/operations.md"))
    assert f"STREAM_MAXLEN` (cap of the node's report stream, default {N}" in operations
    assert f"capped at {N} entries" in flat(read("docs/design.md"))
    assert f"MAXLEN {N}" in flat(read("deploy/base/redis/redis.conf"))
    for path in [*DOCS, REPO / "deploy/base/redis/redis.conf"]:
        assert not re.search(r"~ ?120\b|120 entries", path.read_text()), path


def test_record_help_says_how_much_a_stream_keeps() -> None:
    text = subcommand_help("record")
    assert f"last {N} reports" in text and "minutes" not in text


def test_the_decision_page_is_said_to_draw_the_last_reports_not_minutes() -> None:
    for path in (REPO / "docs/operations.md", REPO / "interference/decision_page.py"):
        text = flat(path.read_text())
        assert "over the last minutes" not in text and "last minutes" not in text, path
    page = flat(read("docs/operations.md"))
    page = page[page.index("A picture of a decision") : page.index("Troubleshooting")]
    assert f"its last {N} reports" in page


def test_the_scheduler_user_may_xrevrange_as_the_docs_say() -> None:
    """The deployed scheduler user has XREVRANGE (the rebalancer reads the streams): the
    decision page draws the index history from a replica."""
    assert "xrevrange" in ACL_COMMANDS
    acl = read("deploy/base/redis/users.acl.template")
    assert "+xrevrange" in next(
        line for line in acl.splitlines() if "interference-scheduler" in line
    )
    assert "has no `XREVRANGE`" not in read("docs/operations.md")


def test_extender_help_names_its_own_port() -> None:
    text = flat(extender_parser().format_help())
    assert f"/prioritize on the extender port ({EXTENDER_PORT}" in text
    assert "/prioritize on the http port" not in text


def test_simulate_help_explains_a_pod_the_example_arrivals_hold() -> None:
    text = subcommand_help("simulate").rsplit("example:", 1)[1]
    pods = re.findall(r"--pods (\S+)", text)
    explained = re.findall(r"--explain (\S+/\S+)", text)
    assert pods and explained
    names = {
        f"{a.obj['metadata']['namespace']}/{a.obj['metadata']['name']}"
        for a in load_workload(REPO / pods[0]).arrivals
    }
    assert explained[0] in names, sorted(names)[:5]


def commands_in_docs() -> list[tuple[str, str]]:
    """(file, command line) of each line ``interference top|node|explain|record|simulate|
    recommend-tolerance …`` of the documents (continuation lines joined), placeholders
    with ``…`` left out."""
    found = []
    command = re.compile(
        r"^\s*(?:\S+=\S+\s+)*interference\s+"
        r"((?:top|node|explain|record|simulate|recommend-tolerance)\s.*)$",
        re.M,
    )
    for path in DOCS:
        text = re.sub(r"\\\n\s*", " ", path.read_text())
        for line in command.findall(text):
            line = line.split("  #")[0].strip()
            if "…" not in line and "`" not in line:
                found.append((path.name, line))
    return found


def test_every_cli_command_in_the_docs_parses() -> None:
    lines = commands_in_docs()
    assert len(lines) > 5
    for name, line in lines:
        try:
            build_parser({}).parse_args(shlex.split(line, comments=True))
        except SystemExit:
            pytest.fail(f"{name}: `interference {line}` does not parse")


def sections(doc: str) -> set[str]:
    """Headings, bold run-in labels (``**External Redis.**``) and anchors of ``doc``."""
    text = read(f"docs/{doc}.md")
    names = {
        re.sub(r'<a id="[^"]*"></a>', "", h).strip() for h in re.findall(r"^#+\s+(.*)$", text, re.M)
    }
    names |= set(re.findall(r"\*\*([^*]{3,60})\.\*\*", text))
    names |= {a.replace("-", " ") for a in re.findall(r'<a id="([^"]+)"', text)}
    return {n.lower() for n in names}


SECTION_REFERENCE = re.compile(
    r"(operations|design)\.md[,:]?\s*\(?[\"“]([^\"”=(){}\[\]\\]{3,80})[\"”]"
)


def test_every_section_a_file_points_at_exists() -> None:
    """``docs/operations.md, "Name"`` in code, manifests, scripts and docs names a heading
    (or a bold label, or an anchor) of that document."""
    known = {doc: sections(doc) for doc in ("operations", "design")}
    files = [
        path
        for folder in ("deploy", "scripts", "docs", "interference", "interference_cli",
                       "interference_demo", "interference_infra", "node_agent", "scheduler",
                       "credential_issuer")
        for path in (REPO / folder).rglob("*")
        if path.is_file() and path.suffix in (".py", ".md", ".yaml", ".sh", ".conf", "")
    ]  # fmt: skip
    missing = []
    for path in files:
        for doc, name in SECTION_REFERENCE.findall(path.read_text(errors="replace")):
            name = flat(name).lower()
            if not any(name in section for section in known[doc]):
                missing.append(f"{path.relative_to(REPO)}: {doc}.md {name!r}")
    assert not missing


def test_every_component_and_overlay_path_named_exists() -> None:
    pattern = re.compile(r"deploy/(?:components|overlays)/[\w.-]+(?:/[\w.-]+)*")
    files = DOCS + [p for p in (REPO / "deploy").rglob("*") if p.is_file()]
    files += [p for p in (REPO / "scripts").iterdir() if p.is_file()]
    missing = [
        f"{path.relative_to(REPO)}: {found}"
        for path in files
        for found in pattern.findall(path.read_text(errors="replace"))
        if not (REPO / found.rstrip(".")).exists() and not re.search(r"[A-Z]{3}", found)
    ]
    assert not missing


def test_install_asks_for_the_nodes_range_only_with_host_namespaces() -> None:
    """The base's agents reach Redis and the issuer as pods of their namespace; only
    ``host-namespaces`` puts them on the nodes' addresses, where its placeholder range
    must be replaced."""
    text = flat(read("docs/operations.md"))
    step = text[
        text.index("3. Look at what will be applied") : text.index("4. Check that every node")
    ]
    before_the_commands = step[: step.index("kubectl kustomize")]
    assert "address range" in before_the_commands
    assert "host-namespaces" in before_the_commands
    component = read("deploy/components/host-namespaces/kustomization.yaml")
    assert "REPLACE with the nodes' address range" in component
    assert "nodes' address range" not in read("deploy/base/redis/networkpolicy.yaml")
