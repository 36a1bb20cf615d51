"""The shared package ships wherever a program does: in the wheel, in each image's build
context, and in each image."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from setuptools import find_packages

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {"agent": "agent.Dockerfile", "scheduler": "scheduler.Dockerfile"}


def build_context_admits(path: str) -> bool:
    """Whether ``.dockerignore`` (``**`` then ``!entry`` lines, the last match winning, as
    Docker reads it) sends ``path`` to the build."""
    admitted = True
    for line in (REPO / ".dockerignore").read_text().splitlines():
        pattern = line.strip()
        if not pattern or pattern.startswith("#"):
            continue
        negated = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        regex = re.escape(pattern).replace(r"\*\*", ".*").replace(r"\*", "[^/]*")
        if re.fullmatch(f"{regex}(/.*)?", path):
            admitted = negated
    return admitted


def test_the_wheel_includes_the_shared_package() -> None:
    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(str(REPO), include=find["packages"]["find"]["include"])
    assert {"interference_infra", "interference", "node_agent", "scheduler"} <= set(packages)


@pytest.mark.parametrize("component", sorted(DOCKERFILES))
def test_each_image_copies_the_shared_package_from_its_build_context(component: str) -> None:
    text = (REPO / "deploy" / "docker" / DOCKERFILES[component]).read_text()
    sources = [
        source.rstrip("/")
        for line in re.findall(r"^COPY (?!--from)(.+) \S+$", text, re.MULTILINE)
        for source in line.split()
    ]
    assert "interference_infra" in sources
    assert [s for s in sources if not build_context_admits(s)] == []


@pytest.mark.parametrize(
    ("path", "admitted"),
    [("interference_infra", True), ("scheduler/endpoint/http.py", True), (".venv", False)],
)
def test_build_context_reading_of_dockerignore(path: str, admitted: bool) -> None:
    assert build_context_admits(path) is admitted
