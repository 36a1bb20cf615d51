"""One word per idea (docs/design.md, Vocabulary): the *interference index* (0 quiet – 100
saturated, higher is worse) is never called a score again; "score" is left to the
scheduler plugins' 0–100 preference and the extender's 0–10.

Scans the Python sources of the packages that speak of the index (the shared contract,
the agent, the CLI, the benchmarks) and the documentation. The names the index had before
the first release (the agent's ``--score-ref``, the annotation ``interference.io/max-score``)
never shipped and appear nowhere.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PYTHON_PACKAGES = ("interference", "node_agent", "interference_cli", "interference_demo", "bench")
DOCUMENTS = ("README.md", "docs", "deploy/examples")

NEVER = {
    "the index called a score": re.compile(r"\binterference score\b", re.IGNORECASE),
    "the former references name": re.compile(r"\bscore_refs?\b|\bSCORE_REF", re.IGNORECASE),
    "the former ranking constant": re.compile(r"\bNODES_BY_SCORE\b"),
    "the former index module": re.compile(r"\binterference[./]score\b"),
    "the agent's former flag": re.compile(r"--score-ref\b"),
    "the former annotation": re.compile(r"\binterference\.io/max-score\b"),
}
"""Former names of the index that must not come back anywhere scanned."""

SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z`*(])")


def python_sources() -> list[Path]:
    return sorted(p for package in PYTHON_PACKAGES for p in (REPO / package).rglob("*.py"))


def documents() -> list[Path]:
    out: list[Path] = []
    for name in DOCUMENTS:
        path = REPO / name
        if path.is_file():
            out.append(path)
        else:
            out += sorted(p for p in path.rglob("*") if p.suffix in (".md", ".yaml", ".yml"))
    return out


def units(path: Path) -> list[str]:
    """What a rule reads at a time: a line of code, or a sentence of a document (paragraphs
    joined, split at sentence ends)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".py":
        return text.splitlines()
    sentences: list[str] = []
    for paragraph in re.split(r"\n\s*\n", text):
        sentences += SENTENCE_END.split(" ".join(paragraph.split()))
    return sentences


def misuses(path: Path) -> list[str]:
    found: list[str] = []
    for unit in units(path):
        for what, pattern in NEVER.items():
            if pattern.search(unit):
                found.append(f"{what}: {unit.strip()[:160]!r}")
    return found


def test_the_scan_reads_the_sources_and_documents_it_names() -> None:
    """Not vacuous: the packages and documents exist and hold what the rules are about."""
    sources, docs = python_sources(), documents()
    assert len(sources) >= 50, sources
    assert len(docs) >= 5, docs
    names = {p.relative_to(REPO).as_posix() for p in sources + docs}
    assert {
        "interference/index.py",
        "node_agent/cli.py",
        "interference_cli/main.py",
        "README.md",
        "docs/design.md",
        "docs/operations.md",
    } <= names
    corpus = "\n".join(p.read_text(encoding="utf-8") for p in sources + docs)
    assert corpus.count("interference index") >= 10
    assert "interference.io/max-index" in corpus and "--index-ref" in corpus


@pytest.mark.parametrize(
    ("text", "suffix", "expected"),
    [
        ("Nodes ranked by interference score.", ".md", 1),
        ("The Interference plugin scores quietness; Interference scores it.", ".md", 0),
        ("refs = settings.score_refs", ".py", 1),
        ("keys.NODES_BY_SCORE", ".py", 1),
        ("from interference.score import IndexReferences", ".py", 1),
        ('annotations: {interference.io/max-score: "40"}', ".yaml", 1),
        ("Use `--score-ref`.", ".md", 1),
        ("`--score-ref`, its former name,\nis deprecated: use `--index-ref`.", ".md", 1),
        ('p.add_argument("--score-ref")', ".py", 1),
        ("`interference.io/max-score`, its former name,\nis deprecated.", ".md", 1),
        ('DEPRECATED_MAX_SCORE = "interference.io/max-score"', ".py", 1),
        ("interference.io/max-index and the interference index", ".md", 0),
    ],
)
def test_the_rules_catch_the_former_words(
    text: str, suffix: str, expected: int, tmp_path: Path
) -> None:
    path = tmp_path / f"sample{suffix}"
    path.write_text(text, encoding="utf-8")
    assert len(misuses(path)) == expected, misuses(path)


def test_the_index_is_never_called_a_score() -> None:
    found = [
        f"{path.relative_to(REPO)}: {m}"
        for path in python_sources() + documents()
        for m in misuses(path)
    ]
    assert not found, "\n".join(found)
