"""One start-up tells every configuration problem of every stage at once: the flags and
environment that do not parse, the file's problems, and the environment's values that do
not validate (issue 31) — in both modes."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.entry.cli import main
from tests.cli.test_bad_input import one_line, run

BAD_FILE = "loop:\n  bind_workers: 0\n  max_writes_in_flight: 0\nreload_interval_s: 0\n"


@pytest.mark.parametrize("mode", [[], ["extender"]])
def test_a_bad_variable_and_a_bad_file_are_told_together(
    mode: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(BAD_FILE)
    monkeypatch.setenv("REDIS_CLUSTER", "maybe")
    assert run(lambda: main([*mode, "--config", str(path)])) == 2
    err = one_line(capsys.readouterr().err)
    assert "REDIS_CLUSTER='maybe' is not a boolean" in err
    assert "reload_interval_s: 0.0 is out of range" in err
    assert "loop.bind_workers" in err and "loop.max_writes_in_flight" in err


@pytest.mark.parametrize("mode", [[], ["extender"]])
def test_a_bad_file_and_a_bad_environment_value_are_told_together(
    mode: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = tmp_path / "scheduler.yaml"
    path.write_text(BAD_FILE)
    monkeypatch.setenv("REDIS_URL", "http://redis:6379/0")
    assert run(lambda: main([*mode, "--config", str(path)])) == 2
    err = one_line(capsys.readouterr().err)
    assert "reload_interval_s: 0.0 is out of range" in err
    assert "REDIS_URL (redis.url)" in err, err
