"""The version every program prints for ``--version``: the installed distribution's."""

from __future__ import annotations

import argparse
from importlib import metadata

DISTRIBUTION = "interference-scheduler"
"""The distribution (pyproject.toml ``[project] name``) all the programs ship in."""
NOT_INSTALLED = "unknown (not installed)"


def distribution_version() -> str:
    """The installed distribution's version, or :data:`NOT_INSTALLED` when the code runs
    from a checkout that was never installed (``pip install -e .`` installs it)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return NOT_INSTALLED


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """``--version``: print ``PROG VERSION`` on stdout and exit 0."""
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {distribution_version()}",
        help="print the program's version and exit",
    )
