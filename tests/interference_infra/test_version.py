"""Every program answers ``--version`` with the installed distribution's version, exit 0
(issue 19: a first hour without friction)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata

import pytest

from interference_infra import version
from interference_infra.version import DISTRIBUTION, NOT_INSTALLED, distribution_version

PROGRAMS = [
    # (what the user types, the console script's entry point in pyproject.toml, argv)
    ("interference", "interference_cli.main", ["--version"]),
    ("interference-agent", "node_agent.cli", ["--version"]),
    ("interference-scheduler", "scheduler.entry.cli", ["--version"]),
    ("interference-scheduler extender", "scheduler.entry.cli", ["extender", "--version"]),
    ("interference-credentials", "credential_issuer.cli", ["--version"]),
]


@pytest.mark.slow  # one interpreter start per program, the scheduler's imports numpy
@pytest.mark.parametrize(("prog", "module", "argv"), PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_every_program_prints_its_version_and_exits_0(
    prog: str, module: str, argv: list[str]
) -> None:
    """Run as the console script runs it: ``main()`` of the entry point, in its own
    process, with the arguments on ``sys.argv``."""
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; from {module} import main; sys.exit(main())", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{prog} {distribution_version()}\n"
    assert done.stderr == ""


def test_the_version_is_the_installed_distributions() -> None:
    assert distribution_version() == metadata.version(DISTRIBUTION)


def test_a_checkout_that_was_never_installed_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise metadata.PackageNotFoundError(name)

    monkeypatch.setattr(version.metadata, "version", missing)
    assert distribution_version() == NOT_INSTALLED == "unknown (not installed)"
