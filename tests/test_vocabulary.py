"""One word per idea (docs/design.md, Glossary): the words the glossary retired stay out of
the code, the tests, the benchmarks, the documents and the manifests.

Each rule names a retired word and why; a table of the former wording checks that every
rule would catch what it retires, and a table of the glossary's words that none of them
catches those. Exempt: the Glossary itself (its *Not* column names the retired words), a
line of code that ends with :data:`FORMER_NAME_MARK` (a refusal or a translation that must
spell the former name), and this file (its samples are the former wording).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.packages import PACKAGES

REPO = Path(__file__).resolve().parent.parent

PYTHON_PACKAGES = (*PACKAGES, "bench", "tests")
DOCUMENTS = ("README.md", "docs", "deploy")
DOCUMENT_SUFFIXES = (".md", ".yaml", ".yml")
FORMER_NAME_MARK = "# vocabulary: former name"
"""Ends a line of code that has to spell a retired name (the refusal of the ``cycle``
section's former name, a benchmark's translation for revisions that still use it)."""
GLOSSARY = re.compile(r"^## Glossary$.*?(?=^## )", re.MULTILINE | re.DOTALL)


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    why: str
    unless: re.Pattern[str] | None = None
    """A unit that also matches this is fine (the qualifier said in the same sentence)."""
    suffixes: tuple[str, ...] = ()
    """Only files of these kinds (empty: every file scanned)."""

    def catches(self, unit: str, suffix: str) -> bool:
        return (
            (not self.suffixes or suffix in self.suffixes)
            and self.pattern.search(unit) is not None
            and (self.unless is None or self.unless.search(unit) is None)
        )


NEVER = {
    "the index called a score": Rule(
        re.compile(r"\binterference score\b", re.IGNORECASE),
        "the interference index is 0 quiet – 100 saturated; a score is a plugin's preference",
    ),
    "the former references name": Rule(
        re.compile(r"\bscore_refs?\b|\bSCORE_REF", re.IGNORECASE),
        "the index's references are IndexReferences, set with --index-ref",
    ),
    "the former ranking constant": Rule(
        re.compile(r"\bNODES_BY_SCORE\b"), "the ranking is by index: NODES_BY_INDEX"
    ),
    "the former index module": Rule(
        re.compile(r"\binterference[./]score\b"), "the index's model is interference/index.py"
    ),
    "the agent's former flag": Rule(re.compile(r"--score-ref\b"), "the flag is --index-ref"),
    "the former annotation": Rule(
        re.compile(r"\binterference\.io/max-score\b"),
        "a pod caps the index with interference.io/max-index",
    ),
    "engine": Rule(
        re.compile(r"engine(?!er)", re.IGNORECASE),
        "the scheduling cycle is kube-scheduler's word for it: the section is `cycle:` "
        "(CycleSettings), the class SchedulingCycle, the tests test_cycle_*",
    ),
    "a row called an index": Rule(
        re.compile(r"\bindex_of\b|(?i:\brow[ _-]index(es)?\b|\bindex of (the|a|its) row\b)"),
        "a node's position in the table is its row: NodeTable.row_of, rows",
    ),
    "a lookup called an index": Rule(
        re.compile(
            r"\bterm[ _-]?index(es)?\b|\bregister_indexes\b|\b(PlacedPod|HostPort|Departure)Index\b"
            r"|\bplaced-pod index(es)?\b|\bindex(es)? of placed pods\b|\btable\.index\("
            r"|\bNodeTable\.index\b",
            re.IGNORECASE,
        ),
        "what finds placed pods by a key is a lookup: NodeTable.lookup, TermLookup",
    ),
    "the report source named for pods": Rule(
        re.compile(r"PodReports|\bpod_reports\b"),
        "it returns NodeReports: NodeReportSource, scheduler/adapters/node_reports.py",
    ),
    "plugin args called settings": Rule(
        re.compile(r"\bsettings\s*[:=]\s*\w+Args\b|(?i:\bplugin(?:'s|s'|s)? (?:own )?settings\b)"),
        "a plugin's options are its args (kube-scheduler's word); settings are the "
        "configuration's sections",
    ),
    "another thing called a record": Rule(
        re.compile(
            r"\bIntervalRecord\b|\binterval records?\b|\btrace records?\b"
            r"|\bjournal records?\b|(?<![A-Za-z])journal\.record\(",
            re.IGNORECASE,
        ),
        "a record is a scheduling record or a decision record: an interval's values are "
        "IntervalMetrics, a trace has stage notes and spans, the move journal entries",
    ),
    "a bare record in a document": Rule(
        re.compile(
            r"(?:\b(?:the|a|an|its|each|every|one|no|usable|this|that|whose|their|any|per"
            r"|new|last|latest|accepted|own)|'s)\s+records?\b",
            re.IGNORECASE,
        ),
        "in a document a record is a scheduling record or a decision record (its placement "
        "or rebalancing record), said in the same sentence",
        unless=re.compile(r"\b(?:scheduling|decision|placement|rebalancing|log) records?\b", re.I),
        suffixes=(".md",),
    ),
}
"""Retired words → the rule that keeps them out of everything scanned."""

FORMER_WORDING = [
    ("the index called a score", "Nodes ranked by interference score.", ".md"),
    ("the former references name", "refs = settings.score_refs", ".py"),
    ("the former ranking constant", "keys.NODES_BY_SCORE", ".py"),
    ("the former index module", "from interference.score import IndexReferences", ".py"),
    ("the former annotation", 'annotations: {interference.io/max-score: "40"}', ".yaml"),
    ("the agent's former flag", "`--score-ref`, its former name,\nis deprecated.", ".md"),
    ("the agent's former flag", 'p.add_argument("--score-ref")', ".py"),
    ("the former annotation", 'DEPRECATED_MAX_SCORE = "interference.io/max-score"', ".py"),
    ("engine", "engine:\n  relax_after_s: 60\n", ".yaml"),
    ("engine", "from scheduler.cycle.settings import EngineSettings", ".py"),
    ("engine", "self._engine_settings = engine_settings", ".py"),
    ("engine", "The engine over a hand-built node table.", ".md"),
    ("engine", "Replay a trace through the real scheduling engine.", ".md"),
    ("engine", "`engine.profile.scores`", ".md"),
    ("engine", "tests/scheduler/test_engine_unit.py", ".md"),
    ("engine", 'parser.add_argument("--skip-engine", action="store_true")', ".py"),
    ("engine", "print('\\nEngine.schedule profile')", ".py"),
    ("a row called an index", "row = table.index_of(node)", ".py"),
    ("a row called an index", "the node's row index in the table", ".md"),
    ("a lookup called an index", "from scheduler.api.term_index import TermIndex", ".py"),
    ("a lookup called an index", "cycle.register_indexes(table)", ".py"),
    ("a lookup called an index", "in_use = table.index(NAME, HostPortIndex)", ".py"),
    ("a lookup called an index", "class DepartureIndex:", ".py"),
    ("a lookup called an index", "a plugin keeps placed pods in its placed-pod index", ".md"),
    ("a lookup called an index", "registered with the table (`NodeTable.index`)", ".md"),
    ("a lookup called an index", "Indexes of placed pods by the affinity terms.", ".md"),
    ("the report source named for pods", "reports: PodReports", ".py"),
    ("the report source named for pods", "from scheduler.adapters.pod_reports import x", ".py"),
    ("plugin args called settings", "def risk_index(table, settings: InterferenceArgs):", ".py"),
    ("plugin args called settings", "settings = InterferenceArgs(risk_k=1.0)", ".py"),
    ("plugin args called settings", "A plugin's own settings are its args.", ".md"),
    ("another thing called a record", "class IntervalRecord:", ".py"),
    ("another thing called a record", "self._journal.record(moved, None, 600)", ".py"),
    ("another thing called a record", "The exporter turns trace records into spans.", ".md"),
    ("a bare record in a document", "The follower reads the records of the Nodes.", ".md"),
    ("a bare record in a document", "A pod without a record answers 404.", ".md"),
]
"""(rule, a sample of the former wording it must catch, the kind of file it is in)."""

GLOSSARY_WORDING = [
    ("cycle:\n  relax_after_s: 60\n", ".yaml"),
    ("from scheduler.cycle.settings import CycleSettings", ".py"),
    ("The scheduling cycle over a hand-built node table; the engineers' notes.", ".md"),
    ("row = table.row_of(node)", ".py"),
    ("cycle.register_lookups(table); in_use = table.lookup(NAME, HostPortLookup)", ".py"),
    ("reports: NodeReportSource", ".py"),
    ("def risk_index(table: NodeTable, args: InterferenceArgs) -> None:", ".py"),
    ("settings: CycleSettings; LoopSettings are the loop's settings.", ".md"),
    ("The scheduling record and the decision record; `interference record` writes.", ".md"),
    ("It reads the scheduling records of the Nodes; one without a usable one leaves.", ".md"),
    ("A pod without a decision record answers 404.", ".md"),
    ("row = frame.row(name)  # the record of a node", ".py"),
    ("class IntervalMetrics:", ".py"),
    ("self._journal.add(moved, None, 600)", ".py"),
    ("interference.io/max-index and the interference index", ".md"),
]
"""What the glossary says instead: no rule may catch it."""

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(])")


def python_sources() -> list[Path]:
    this = Path(__file__).resolve()
    return sorted(
        p
        for package in PYTHON_PACKAGES
        for p in (REPO / package).rglob("*.py")
        if p.resolve() != this and ".venv" not in p.parts
    )


def documents() -> list[Path]:
    out: list[Path] = []
    for name in DOCUMENTS:
        path = REPO / name
        if path.is_file():
            out.append(path)
        else:
            out += sorted(p for p in path.rglob("*") if p.suffix in DOCUMENT_SUFFIXES)
    return out


def units(path: Path, text: str | None = None) -> list[str]:
    """What a rule reads at a time: a line of code (less those marked as spelling a former
    name), or a sentence of a document (paragraphs joined, split at sentence ends; the
    Glossary left out)."""
    text = path.read_text(encoding="utf-8") if text is None else text
    if path.suffix == ".py":
        return [line for line in text.splitlines() if not line.endswith(FORMER_NAME_MARK)]
    text = GLOSSARY.sub("", text)
    sentences: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        sentences += SENTENCE_END.split(" ".join(paragraph.split()))
    return sentences


def misuses(path: Path, text: str | None = None) -> list[str]:
    found: list[str] = []
    for unit in units(path, text):
        for what, rule in NEVER.items():
            if rule.catches(unit, path.suffix):
                found.append(f"{what} ({rule.why}): {unit.strip()[:160]!r}")
    return found


def test_the_scan_reads_the_sources_tests_and_documents_it_names() -> None:
    """Not vacuous: the packages, tests and documents exist and hold what the rules are
    about."""
    sources, docs = python_sources(), documents()
    assert len(sources) >= 300, len(sources)
    assert len(docs) >= 20, len(docs)
    names = {p.relative_to(REPO).as_posix() for p in sources + docs}
    assert {
        "interference/index.py",
        "node_agent/cli.py",
        "interference_cli/main.py",
        "scheduler/plugins/base.py",
        "tests/scheduler/test_config.py",
        "bench/scheduler_throughput.py",
        "README.md",
        "docs/design.md",
        "docs/operations.md",
        "docs/configuration.md",
        "deploy/base/scheduler/scheduler.yaml",
    } <= names
    corpus = "\n".join(p.read_text(encoding="utf-8") for p in sources + docs)
    assert corpus.count("interference index") >= 10
    assert corpus.count("scheduling cycle") >= 10 and corpus.count("CycleSettings") >= 10
    assert "interference.io/max-index" in corpus and "--index-ref" in corpus
    assert "row_of(" in corpus and "TermLookup" in corpus and "NodeReportSource" in corpus


@pytest.mark.parametrize(("rule", "text", "suffix"), FORMER_WORDING)
def test_each_rule_catches_the_former_wording(
    rule: str, text: str, suffix: str, tmp_path: Path
) -> None:
    path = tmp_path / f"sample{suffix}"
    path.write_text(text, encoding="utf-8")
    found = misuses(path)
    assert found and all(f.startswith(f"{rule} (") for f in found), found


def test_every_rule_has_a_reason_and_a_sample_of_what_it_retires() -> None:
    assert all(rule.why for rule in NEVER.values())
    assert {rule for rule, _, _ in FORMER_WORDING} == set(NEVER)


@pytest.mark.parametrize(("text", "suffix"), GLOSSARY_WORDING)
def test_no_rule_catches_the_glossarys_words(text: str, suffix: str, tmp_path: Path) -> None:
    path = tmp_path / f"sample{suffix}"
    path.write_text(text, encoding="utf-8")
    assert misuses(path) == []


def test_a_line_marked_as_a_former_name_and_the_glossary_are_exempt(tmp_path: Path) -> None:
    code = tmp_path / "sample.py"
    marked = f'FORMER = "engine"  {FORMER_NAME_MARK}'
    assert misuses(code, marked) == []
    assert misuses(code, marked.replace(FORMER_NAME_MARK, "# engine")) != []
    doc = tmp_path / "sample.md"
    glossary = "## Glossary\n\n| cycle | … | `engine` |\n\n## 1. What it is\n\nThe engine.\n"
    assert len(misuses(doc, glossary)) == 1  # the section after the glossary is read


def test_the_glossary_names_every_term_it_decides() -> None:
    text = (REPO / "docs/design.md").read_text(encoding="utf-8")
    glossary = GLOSSARY.search(text)
    assert glossary is not None
    for term in (
        "interference index",
        "score",
        "scheduling cycle",
        "row",
        "lookup",
        "scheduling record",
        "decision record",
        "report",
        "args",
        "settings",
    ):
        assert f"| **{term}** |" in glossary.group(0), term


def test_no_retired_word_is_used() -> None:
    found = [
        f"{path.relative_to(REPO)}: {m}"
        for path in python_sources() + documents()
        for m in misuses(path)
    ]
    assert not found, "\n".join(found)
