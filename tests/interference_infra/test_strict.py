"""Strict settings parsing, URL masking and log set-up (interference_infra.strict, .logsetup)."""

from __future__ import annotations

import io
import json
import logging
import warnings
from collections.abc import Iterator

import pytest
from urllib3.exceptions import InsecureRequestWarning

from interference_infra.logsetup import configure_logging, mask_credentials
from interference_infra.strict import (
    SettingsError,
    allowed_range,
    mask_url,
    parse_bool,
    parse_log_level,
    parse_number,
)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("true", True),
        ("TRUE", True),
        (" yes ", True),
        ("1", True),
        ("false", False),
        ("No", False),
        ("0", False),
    ],
)
def test_booleans_accept_six_words(value: str, expected: bool) -> None:
    assert parse_bool("DRY_RUN", value) is expected


@pytest.mark.parametrize("value", ["Y", "n", "enabled", "maybe", "on", "off", "2", "", "tru"])
def test_anything_else_is_an_error_naming_the_variable(value: str) -> None:
    with pytest.raises(SettingsError, match=r"^DRY_RUN=.* is not a boolean; use one of"):
        parse_bool("DRY_RUN", value)


@pytest.mark.parametrize(
    ("bounds", "text"),
    [
        ({"minimum": 0, "maximum": 100}, "allowed: 0–100"),
        ({"above": 0}, "allowed: > 0"),
        ({"minimum": 1}, "allowed: ≥ 1"),
        ({"above": 0, "maximum": 5}, "allowed: > 0 and ≤ 5"),
        ({}, "allowed: any finite number"),
    ],
)
def test_allowed_range_reads_like_the_docs(bounds: dict[str, float], text: str) -> None:
    assert allowed_range(**bounds) == text


@pytest.mark.parametrize(
    ("value", "bounds", "message"),
    [
        ("500", {"minimum": 0, "maximum": 100}, "W=500 is out of range; allowed: 0–100"),
        ("-1", {"above": 0}, "W=-1 is out of range; allowed: > 0"),
        ("nan", {"above": 0}, "W=nan is out of range"),
        ("inf", {"minimum": 0}, "W=inf is out of range"),
        ("ten", {"above": 0}, "W='ten' is not a number; allowed: > 0"),
        ("1.5", {"minimum": 1, "integer": True}, "W='1.5' is not a whole number"),
    ],
)
def test_numbers_out_of_range_say_the_range(
    value: str, bounds: dict[str, float], message: str
) -> None:
    with pytest.raises(SettingsError) as raised:
        parse_number("W", value, **bounds)  # type: ignore[arg-type]
    assert str(raised.value).startswith(message)


def test_numbers_in_range_pass() -> None:
    assert parse_number("W", " 100 ", minimum=0, maximum=100) == 100
    assert parse_number("N", "3", minimum=1, integer=True) == 3


@pytest.mark.parametrize("value", ["debug", "Info", "WARNING", "warn", "error"])
def test_log_levels_in_any_case(value: str) -> None:
    assert parse_log_level(value) in ("DEBUG", "INFO", "WARNING", "ERROR")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://user:wrongpw@127.0.0.1:6391/0", "redis://user:***@127.0.0.1:6391/0"),
        ("rediss://:s3cret@redis:6380", "rediss://:***@redis:6380"),
        ("redis://viewer@redis:6379", "redis://viewer@redis:6379"),
        ("redis://u:p@[::1", "redis://***@[::1"),
    ],
)
def test_urls_are_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown
    masked = mask_credentials(f"Redis at {url} refused")
    assert not any(secret in masked for secret in ("wrongpw", "s3cret", ":p@"))


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pa/ss@host:6379/0", "redis://:***@host:6379/0"),
        ("redis://u:pa#ss@h:6379", "redis://u:***@h:6379"),
        ("redis://u:pa?ss@h/0", "redis://u:***@h/0"),
        ("redis://u:a@b/c@h/0", "redis://u:***@h/0"),
    ],
)
def test_passwords_with_url_delimiters_left_unencoded_are_masked_whole(
    url: str, shown: str
) -> None:
    """A generated password often holds / (base64), # or ?; urlsplit then ends the
    netloc early, yet no part of the password may be shown."""
    assert mask_url(url) == shown
    assert mask_credentials(f"Redis at {url} refused") == f"Redis at {shown} refused"


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://redis:6379/0?password=s3cret", "redis://redis:6379/0?password=***"),
        (
            "rediss://u@redis:6379/0?ssl_cert_reqs=required&password=s3cret&db=1",
            "rediss://u@redis:6379/0?ssl_cert_reqs=required&password=***&db=1",
        ),
        ("redis://redis/0?PassWord=s3cret#x", "redis://redis/0?PassWord=***#x"),
        ("redis://:pw@redis/0?password=s3cret", "redis://:***@redis/0?password=***"),
    ],
)
def test_a_password_in_the_query_is_masked(url: str, shown: str) -> None:
    """redis-py takes ``?password=``: /config and every log line must hide it too."""
    assert mask_url(url) == shown
    assert mask_credentials(f"url: {url}\n") == f"url: {shown}\n"


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    stream = io.StringIO()
    yield stream
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.captureWarnings(False)


def test_json_lines_mask_credentials(log_stream: io.StringIO) -> None:
    configure_logging("info", "json", own=["scheduler"], stream=log_stream)
    logging.getLogger("scheduler").error("cannot reach redis://sched:pw123@redis:6379/0")
    entry = json.loads(log_stream.getvalue())
    assert entry["level"] == "ERROR" and entry["logger"] == "scheduler"
    assert entry["message"] == "cannot reach redis://sched:***@redis:6379/0"


def test_text_format_masks_too(log_stream: io.StringIO) -> None:
    configure_logging("INFO", "text", stream=log_stream)
    logging.getLogger("x").warning("url redis://a:b@c:1")
    assert log_stream.getvalue().rstrip().endswith("WARNING x: url redis://a:***@c:1")


@pytest.mark.parametrize(("level", "shown"), [("INFO", False), ("DEBUG", True)])
def test_lease_renewals_are_debug(log_stream: io.StringIO, level: str, shown: bool) -> None:
    configure_logging(level, "json", stream=log_stream)
    election = logging.getLogger("leaderelection")
    for _ in range(3):
        election.info("replica-1 successfully acquired lease")
    election.error("Leader election failed")
    entries = [json.loads(line) for line in log_stream.getvalue().splitlines()]
    renewals = [e for e in entries if "acquired lease" in e["message"]]
    assert len(renewals) == (3 if shown else 0)
    assert all(e["level"] == "DEBUG" for e in renewals)
    assert [e["level"] for e in entries if "failed" in e["message"]] == ["ERROR"]


def test_client_warnings_are_logged_once(log_stream: io.StringIO) -> None:
    configure_logging("INFO", "text", stream=log_stream)
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # as if the registry were reset between requests
        logging.captureWarnings(True)
        for _ in range(5):
            warnings.warn(
                "Unverified HTTPS request is being made to host '10.0.0.1'",
                InsecureRequestWarning,
                stacklevel=1,
            )
    assert log_stream.getvalue().count("Unverified HTTPS request") == 1
