"""Files the ``interference`` CLI writes for a person to open (decision pages)."""

from __future__ import annotations

from interference_cli.errors import CliError


def write_page(path: str, page: str) -> None:
    """Write an HTML page; :class:`CliError` naming the file when it cannot be written."""
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(page)
    except OSError as exc:
        raise CliError(f"cannot write {path}: {exc.strerror or exc}") from exc
