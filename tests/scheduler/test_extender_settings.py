"""The ``extender`` section: TLS by default and fail-closed (no certificate files: no
start, with the fix named), limits checked like every setting, plaintext only on request."""

from __future__ import annotations

from pathlib import Path

import pytest

from interference_infra.http import ServerLimits
from scheduler.endpoint.http import EXTENDER_PORT, ExtenderEndpoint, ExtenderSettings
from scheduler.entry.config import ConfigError, parse_config


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ({"tls_cert_file": ""}, "extender.tls_cert_file: must name a PEM file"),
        ({"client_ca_file": ""}, "extender.client_ca_file: must name a PEM file"),
        ({"max_connections": 0}, "extender.max_connections: 0 must be a whole number"),
        ({"max_body_bytes": -1}, "extender.max_body_bytes: -1 must be a whole number"),
        ({"request_timeout_s": 0}, "extender.request_timeout_s: 0.0 must be a number of seconds"),
        ({"port": 70000}, "extender.port: 70000 must be an integer in 0–65535"),
        ({"plaintext": "yes please"}, "extender.plaintext"),
    ],
    ids=["no-cert", "no-client-ca", "no-threads", "negative-body", "no-timeout", "port", "bool"],
)
def test_bad_extender_settings_name_the_key(section: dict[str, object], problem: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"extender": section})
    assert problem in str(raised.value)


def test_defaults_are_https_with_client_authentication_on_their_own_port() -> None:
    settings = parse_config({}).extender
    assert (settings.port, settings.plaintext) == (EXTENDER_PORT, False)
    assert settings.client_ca_file
    assert settings.limits() == ServerLimits(
        max_connections=8, max_body_bytes=6 * 1024 * 1024, request_timeout_s=30.0
    )
    assert (
        parse_config({"extender": {"tls_cert_file": "", "plaintext": True}}).extender.tls() is None
    )


def test_missing_certificate_files_stop_the_start_naming_the_script(tmp_path: Path) -> None:
    settings = ExtenderSettings(
        tls_cert_file=str(tmp_path / "tls.crt"),
        tls_key_file=str(tmp_path / "tls.key"),
        client_ca_file=str(tmp_path / "ca.crt"),
    )
    with pytest.raises(ValueError, match=r"scripts/create-extender-certs\.sh"):
        settings.tls()


def test_the_endpoint_refuses_to_serve_without_tls_unless_plaintext_was_asked_for() -> None:
    with pytest.raises(ValueError, match="TLS is required"):
        ExtenderEndpoint(ExtenderSettings(port=0, host="127.0.0.1"), {}, None)
    plain = ExtenderEndpoint(ExtenderSettings(port=0, host="127.0.0.1", plaintext=True), {}, None)
    try:
        assert plain.scheme == "http"
    finally:
        plain.stop()
