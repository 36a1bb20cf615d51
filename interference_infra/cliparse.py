"""An ``argparse`` parser whose errors are one line: what is wrong and where help is."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

USAGE_EXIT = 2
"""Exit status of a usage error (bad flag, bad value): the command line must change."""
RUNTIME_EXIT = 1
"""Exit status of a failure at run time (unreachable server, unreadable file)."""


class OneLineParser(argparse.ArgumentParser):
    """Prints ``PROG: error: MESSAGE (see PROG --help)`` on stderr and exits 2."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        sys.stderr.write(f"{self.prog}: error: {text} (see {self.prog} --help)\n")
        sys.exit(USAGE_EXIT)
