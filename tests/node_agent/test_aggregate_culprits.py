"""Culprits in aggregation: a pod's waits behind itself, behind others, and its top
culprits by pod (table-driven), and their codec round trip (and pod rows without them)."""

from __future__ import annotations

from dataclasses import replace

import msgpack
import pytest

from interference.codec import (
    PayloadError,
    decode_report,
    encode_report,
    parse_culprits_field,
    parse_pod_hash,
    pod_hash,
)
from interference.signals import TOP_CULPRITS, NodeMetrics, NodeReport, PodMetrics
from node_agent.aggregate import Owners, aggregate
from node_agent.attribution import SYSTEM, PodIdentity
from node_agent.probes import base
from node_agent.probes.base import Sample

MS = 1_000_000
WEB = PodIdentity(uid="u-web", namespace="shop", name="web-0", qos="burstable")
WEB_SIDECAR = replace(WEB, container_id="c2")
HOG = PodIdentity(uid="u-hog", namespace="batch", name="hog", qos="besteffort")


def runqlat(pairs: dict[tuple[int, int], float], cgroups: dict[int, float]) -> Sample:
    """A runqlat sample: per cgroup its wait, per (waiting, culprit) pair its share."""
    return Sample(
        by_cgroup_id={
            cgid: {base.RUNQ_NS: wait * MS, base.RUNQ_COUNT: 1.0, base.ONCPU_NS: 100 * MS}
            for cgid, wait in cgroups.items()
        },
        waits_by_culprit={
            pair: {base.CULPRIT_WAIT_NS: wait * MS, base.CULPRIT_WAIT_COUNT: 1.0}
            for pair, wait in pairs.items()
        },
    )


# cgroup ids: 1 web, 2 web's sidecar container, 3 hog, 4 a system cgroup, 5 outside the root
OWNERS = Owners(by_cgroup_id={1: WEB, 2: WEB_SIDECAR, 3: HOG, 4: SYSTEM, 5: None})

CASES = {
    "behind a neighbour, behind itself (any container), behind system": (
        runqlat({(1, 3): 300, (1, 2): 40, (2, 1): 10, (1, 4): 50}, {1: 390, 2: 10}),
        {"shop/web-0": (50.0, 350.0, (("batch/hog", 300.0), ("system", 50.0)))},
    ),
    "a culprit outside the measured subtree is system": (
        runqlat({(1, 5): 80, (1, 4): 20}, {1: 100}),
        {"shop/web-0": (0.0, 100.0, (("system", 100.0),))},
    ),
    "no culprit pairs: nothing attributed": (
        runqlat({}, {1: 100}),
        {"shop/web-0": (0.0, 0.0, ())},
    ),
}


@pytest.mark.parametrize(("sample", "expected"), CASES.values(), ids=list(CASES))
def test_pod_culprits(
    sample: Sample, expected: dict[str, tuple[float, float, tuple[tuple[str, float], ...]]]
) -> None:
    result = aggregate({"runqlat": sample}, OWNERS, interval_s=1.0, ncpu=2)
    rows = {p.key: p for p in result.pods}
    for key, (own, neighbour, culprits) in expected.items():
        assert rows[key].own_wait_ms_per_s == pytest.approx(own)
        assert rows[key].neighbour_wait_ms_per_s == pytest.approx(neighbour)
        assert rows[key].culprits == culprits


def test_only_the_top_culprits_are_kept_and_the_rest_still_counts() -> None:
    owners = {10 + i: PodIdentity(f"u{i}", "ns", f"p{i}", "burstable") for i in range(8)}
    sample = runqlat({(1, 10 + i): float(10 + i) for i in range(8)}, {1: 1000})
    result = aggregate(
        {"runqlat": sample}, Owners(by_cgroup_id={1: WEB, **owners}), interval_s=2.0, ncpu=2
    )
    web = next(p for p in result.pods if p.key == "shop/web-0")
    assert [key for key, _ in web.culprits] == ["ns/p7", "ns/p6", "ns/p5", "ns/p4", "ns/p3"]
    assert len(web.culprits) == TOP_CULPRITS
    assert web.culprits[0][1] == pytest.approx(17 / 2)  # per second of a 2 s interval
    assert web.neighbour_wait_ms_per_s == pytest.approx(sum(10 + i for i in range(8)) / 2)


VICTIM = PodMetrics(
    "shop",
    "web-0",
    uid="u-web",
    runq_wait_ms_per_s=400.0,
    own_wait_ms_per_s=20.5,
    neighbour_wait_ms_per_s=379.5,
    culprits=(("batch/hog", 300.25), ("system", 79.25)),
)


def test_codec_round_trip() -> None:
    report = NodeReport("n1", 1.0, 1.0, NodeMetrics(), pods=[VICTIM], measured=("runq",))
    assert decode_report(encode_report(report)).pods == [VICTIM]
    fields = pod_hash(VICTIM, "n1", 1.0)
    assert fields["culprits"] == "batch/hog=300.25,system=79.25"
    assert parse_pod_hash(fields)[0] == VICTIM


def test_pod_rows_without_culprits_decode_with_none() -> None:
    body = msgpack.unpackb(encode_report(NodeReport("n1", 1.0, 1.0, NodeMetrics())))
    body["pods"] = [{"namespace": "shop", "name": "web-0", "runq_wait_ms_per_s": 5.0}]
    (pod,) = decode_report(msgpack.packb(body)).pods
    assert (pod.culprits, pod.neighbour_wait_ms_per_s) == ((), 0.0)


@pytest.mark.parametrize(
    "bad",
    [
        [["batch/hog"]],
        [["", 1.0]],
        [["batch/hog", -1.0]],
        [["batch/hog", float("nan")]],
        [[f"p{i}", 1.0] for i in range(TOP_CULPRITS + 1)],
        "batch/hog=1",
    ],
)
def test_bad_culprits_are_refused(bad: object) -> None:
    body = msgpack.unpackb(encode_report(NodeReport("n1", 1.0, 1.0, NodeMetrics())))
    body["pods"] = [{"namespace": "shop", "name": "web-0", "culprits": bad}]
    with pytest.raises(PayloadError):
        decode_report(msgpack.packb(body))


@pytest.mark.parametrize("field", ["batch/hog", "=1", "a=x", "a=-1", "a=1,b=2,c=3,d=4,e=5,f=6"])
def test_bad_culprits_hash_field_is_refused(field: str) -> None:
    with pytest.raises(PayloadError):
        parse_culprits_field(field)
