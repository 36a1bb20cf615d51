"""Strict parsing of settings that come from the environment or the command line.

A value that is not exactly one of the accepted spellings is an error naming the variable
and the accepted values, never a silent default: ``DRY_RUN=Y`` must not mean "bind".
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from urllib.parse import urlsplit

TRUE_WORDS = ("true", "1", "yes")
FALSE_WORDS = ("false", "0", "no")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_FORMATS = ("json", "text")


class SettingsError(ValueError):
    """One or more settings have values outside what they accept; ``problems`` holds one
    line per setting, each naming it and saying why, and the message joins them with
    ``; `` (a single problem reads as itself). Every program raises this for a bad flag,
    environment variable or configuration value, and exits 2 on it."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("; ".join(self.problems))


def parse_bool(name: str, value: str) -> bool:
    """``true``/``1``/``yes`` → True, ``false``/``0``/``no`` → False (case-insensitive,
    surrounding blanks ignored); anything else raises :class:`SettingsError` naming ``name``."""
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise SettingsError(
        f"{name}={value!r} is not a boolean; use one of "
        + "/".join(w for pair in zip(TRUE_WORDS, FALSE_WORDS, strict=True) for w in pair)
    )


def parse_number(
    name: str,
    value: str,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
    integer: bool = False,
) -> float:
    """``value`` as a finite number within the range, else :class:`SettingsError` saying
    the allowed range: ``minimum ≤ v ≤ maximum`` and ``v > above`` (each bound optional)."""
    try:
        number = int(value.strip()) if integer else float(value.strip())
    except ValueError:
        kind = "a whole number" if integer else "a number"
        raise SettingsError(
            f"{name}={value!r} is not {kind}; {allowed_range(minimum, maximum, above)}"
        ) from None
    check_range(name, number, minimum=minimum, maximum=maximum, above=above)
    return number


def check_range(
    name: str,
    number: float,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
    above: float | None = None,
) -> None:
    """:class:`SettingsError` unless ``number`` is finite and within the range."""
    inside = (
        math.isfinite(number)
        and (minimum is None or number >= minimum)
        and (maximum is None or number <= maximum)
        and (above is None or number > above)
    )
    if not inside:
        raise SettingsError(
            f"{name}={number:g} is out of range; {allowed_range(minimum, maximum, above)}"
        )


def allowed_range(
    minimum: float | None = None, maximum: float | None = None, above: float | None = None
) -> str:
    """The range as a person reads it: ``allowed: 0–100``, ``allowed: > 0``."""
    parts = []
    if above is not None:
        parts.append(f"> {above:g}")
    if minimum is not None and maximum is not None and above is None:
        return f"allowed: {minimum:g}–{maximum:g}"
    if minimum is not None:
        parts.append(f"≥ {minimum:g}")
    if maximum is not None:
        parts.append(f"≤ {maximum:g}")
    return "allowed: " + (" and ".join(parts) or "any finite number")


def parse_log_level(value: str) -> str:
    """A log level name in any case (``debug``, ``Info``) as ``DEBUG``…; SettingsError else."""
    level = value.strip().upper()
    if level == "WARN":
        level = "WARNING"
    if level not in LOG_LEVELS:
        raise SettingsError(f"log level {value!r} is not one of {', '.join(LOG_LEVELS)} (any case)")
    return level


def parse_log_format(value: str) -> str:
    """``json`` or ``text`` in any case; SettingsError else."""
    fmt = value.strip().lower()
    if fmt not in LOG_FORMATS:
        raise SettingsError(f"log format {value!r} is not one of {', '.join(LOG_FORMATS)}")
    return fmt


PASSWORD_IN_QUERY = re.compile(r"([?&](?:password|passwd|pass)=)[^&#\s'\"]*", re.IGNORECASE)
"""A password passed as a URL's query parameter (redis-py reads ``?password=``)."""


def mask_url(url: str) -> str:
    """``url`` with its password (after ``user:`` or in ``?password=``) replaced by ``***``
    (the user name stays), for anything a person or a log collector sees. A URL that
    cannot be parsed is masked after its ``@``.

    The credentials end at the last ``@``, not where ``urlsplit`` ends the netloc: a
    password with an unencoded ``/``, ``?`` or ``#`` (base64 passwords hold ``/``) would
    otherwise be shown in part or whole."""
    url = PASSWORD_IN_QUERY.sub(r"\1***", url)
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    try:
        urlsplit(f"{scheme}{sep}{host}").port  # noqa: B018 (raises for a malformed host)
    except ValueError:
        return f"{scheme}{sep}***@{host}"
    username, colon, _ = userinfo.partition(":")
    if not colon:
        return url  # user name only: nothing secret
    return f"{scheme}{sep}{username}:***@{host}"
