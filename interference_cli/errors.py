"""The one error the ``interference`` CLI tells its user about.

Every failure the user can fix (Redis unreachable, nothing published yet, unknown node
or pod, a malformed record or file, a bad argument) is raised as a :class:`CliError`
whose message is the one line the CLI prints.
"""

from __future__ import annotations


class CliError(Exception):
    """A problem the user can act on; the message is printed as one line on stderr."""
