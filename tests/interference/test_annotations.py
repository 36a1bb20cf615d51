"""The pod annotations the project reads (interference.annotations): every one a program
defines is listed, and an unknown key under interference.io/ is told apart from a
known one with the closest known key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from interference.annotations import (
    KNOWN_POD_ANNOTATIONS,
    MAX_INDEX,
    MAX_RUNQ_P99_US,
    unknown_annotation_message,
    unknown_annotations,
)
from tests.packages import PACKAGES

REPO = Path(__file__).resolve().parents[2]
CONSTANT = re.compile(r'^(\w*ANNOTATION\w*)\s*=\s*"(interference\.io/[^"]+)"', re.M)


def test_every_annotation_a_program_defines_is_known() -> None:
    """A constant ``…ANNOTATION… = "interference.io/…"`` anywhere in the programs is a
    key some program reads: the scheduler must not call it unknown. ``LEASE_…`` constants
    annotate the leader election Lease, never a pod."""
    defined = {
        (path.relative_to(REPO).as_posix(), name, value)
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        for name, value in CONSTANT.findall(path.read_text(encoding="utf-8"))
        if not name.startswith("LEASE_")
    }
    assert any(value == "interference.io/degradable" for _, _, value in defined)  # the agent's
    assert [d for d in defined if d[2] not in KNOWN_POD_ANNOTATIONS] == []


@pytest.mark.parametrize(
    ("keys", "unknown"),
    [
        ([MAX_INDEX, MAX_RUNQ_P99_US], []),
        (["interference.io/max-runq-p99"], ["interference.io/max-runq-p99"]),
        (["INTERFERENCE.IO/max-index"], ["INTERFERENCE.IO/max-index"]),
        (["interference.io/"], ["interference.io/"]),
        (["example.com/x", "sub.interference.io/x", "inference.io/x", "interference/x"], []),
        (["interference.iox/y"], ["interference.iox/y"]),  # a near-miss domain (below)
        (["interference.io/max-score"], ["interference.io/max-score"]),  # vocabulary: former name
    ],
)
def test_unknown_annotations(keys: list[str], unknown: list[str]) -> None:
    assert unknown_annotations(keys) == unknown


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("interference.io/max-runq-p99", "did you mean interference.io/max-runq-p99-us?"),
        ("interference.io/max-runq-p99-ms", "did you mean interference.io/max-runq-p99-us?"),
        ("interference.io/max-reclaim", "did you mean interference.io/max-reclaim-stall-ms-per-s?"),
        ("interference.io/maxindex", "did you mean interference.io/max-index?"),
        ("interference.io/Max-Index", "did you mean interference.io/max-index?"),
        ("interference.io/degradeable", "did you mean interference.io/degradable?"),
        ("interference.io/rebalancing", "did you mean interference.io/rebalance?"),
        ("interference.io/zzz", "known: interference.io/max-runq-p99-us, "),
    ],
)
def test_the_message_names_the_closest_known_key(key: str, hint: str) -> None:
    message = unknown_annotation_message(key)
    assert message.startswith(f"annotation {key} is not one interference-scheduler reads")
    assert message.endswith(hint) or hint in message


@pytest.mark.parametrize(
    ("key", "hint"),
    [
        ("interferance.io/max-runq-p99-us", "did you mean interference.io/max-runq-p99-us?"),
        ("interfernce.io/max-index", "did you mean interference.io/max-index?"),
        ("interference.com/rebalance", "did you mean interference.io/rebalance?"),
        ("interference.org/max-index", "did you mean interference.io/max-index?"),
        ("Interferance.IO/max-index", "did you mean interference.io/max-index?"),
        ("inteference.io/max-runq-p99", "did you mean interference.io/max-runq-p99-us?"),
        ("interferencee.io/degradable", "did you mean interference.io/degradable?"),
        ("interference-io/max-index", "did you mean interference.io/max-index?"),
    ],
)
def test_a_key_under_a_misspelt_domain_is_unknown_and_names_the_right_key(
    key: str, hint: str
) -> None:
    """The domain is a typo as much as the name: ``interferance.io/max-runq-p99-us`` would
    leave the pod as unprotected as ``interference.io/max-runq-p99`` does."""
    assert unknown_annotations([key]) == [key]
    message = unknown_annotation_message(key)
    assert message.startswith(f"annotation {key} is not one interference-scheduler reads")
    assert message.endswith(hint), message
    assert "interference.io/" in message.split("reads", 1)[1]


@pytest.mark.parametrize(
    "key",
    [
        "sub.interference.io/max-index",  # someone's own subdomain
        "scheduler.interference.io/x",
        "inference.io/max-index",
        "kubernetes.io/hostname",
        "example.com/max-index",
        "max-index",
        "interference.io.example.com/x",
    ],
)
def test_a_domain_far_from_interference_io_is_not_ours(key: str) -> None:
    assert unknown_annotations([key]) == []
