"""The probe registry starts what it can and names why the rest is disabled."""

from __future__ import annotations

import pytest

from node_agent.probes import base
from node_agent.probes.base import ProbeContext, ProbeUnavailable, Sample


class _Probe:
    def __init__(self, name: str, failure: Exception | None) -> None:
        self.name = name
        self.failure = failure
        self.closed = False

    def start(self) -> None:
        if self.failure is not None:
            raise self.failure

    def collect(self) -> Sample:
        return Sample()

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def three_probes(monkeypatch: pytest.MonkeyPatch) -> dict[str, _Probe]:
    probes = {
        "healthy": _Probe("healthy", None),
        "unavailable": _Probe("unavailable", ProbeUnavailable("mount tracefs")),
        "buggy": _Probe("buggy", KeyError("oops")),
    }
    registry = {name: (lambda ctx, p=probe: p) for name, probe in probes.items()}
    monkeypatch.setattr(base, "_REGISTRY", registry)
    return probes


def test_start_probes_keeps_healthy_ones_and_names_why_others_are_disabled(
    three_probes: dict[str, _Probe],
) -> None:
    running, disabled = base.start_probes(
        ["healthy", "unavailable", "buggy", "missing"], ProbeContext()
    )
    assert [p.name for p in running] == ["healthy"]
    assert disabled["unavailable"] == "mount tracefs"
    assert disabled["buggy"].startswith("failed to start (KeyError")
    assert "known: buggy, healthy, unavailable" in disabled["missing"]
    assert three_probes["unavailable"].closed and three_probes["buggy"].closed
    assert not three_probes["healthy"].closed


def test_registering_a_name_twice_is_an_error(three_probes: dict[str, _Probe]) -> None:
    with pytest.raises(ValueError, match="registered twice"):
        base.register("healthy")(lambda ctx: three_probes["healthy"])
