"""Parsing of API JSON into NodeInfo/PodInfo, and quantities."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.api.nodes import parse_node
from scheduler.api.objects import (
    ANNOTATION_MAX_INDEX,
    ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S,
    ANNOTATION_MAX_RUNQ_P99_US,
    AntiAffinityTerm,
    HostPort,
    InterferenceTolerance,
    Taint,
    Toleration,
)
from scheduler.api.pods import parse_pod
from scheduler.api.quantity import QuantityError, parse_quantity, resource_amount
from scheduler.api.reader import ObjectError
from scheduler.api.requests import DEFAULT_MEMORY_REQUEST
from scheduler.api.selectors import LabelSelector, Requirement
from tests.builders import affinity_terms, container, node_obj, pod_obj

GiB = 2**30
MiB = 2**20

# ---- quantities ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", Fraction(0)),
        ("1", Fraction(1)),
        ("500m", Fraction(1, 2)),
        ("1.5", Fraction(3, 2)),
        (".5", Fraction(1, 2)),
        ("100n", Fraction(1, 10**7)),
        ("3u", Fraction(3, 10**6)),
        ("2k", Fraction(2000)),
        ("1M", Fraction(10**6)),
        ("1G", Fraction(10**9)),
        ("1T", Fraction(10**12)),
        ("1P", Fraction(10**15)),
        ("1E", Fraction(10**18)),
        ("1Ki", Fraction(1024)),
        ("1.5Gi", Fraction(3 * 2**29)),
        ("2Mi", Fraction(2 * MiB)),
        ("1Ti", Fraction(2**40)),
        ("1Pi", Fraction(2**50)),
        ("1Ei", Fraction(2**60)),
        ("1e3", Fraction(1000)),
        ("12E-1", Fraction(6, 5)),
        ("+5", Fraction(5)),
        (7, Fraction(7)),
        (0.25, Fraction(1, 4)),
    ],
    ids=lambda v: repr(v),
)
def test_parse_quantity(text: object, value: Fraction) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize(
    "text",
    ["", "abc", "1Qi", "1 Gi", "1.2.3", "Gi", "1e", "1e999", "--1", True, None, [1], float("inf")],
    ids=repr,
)
def test_parse_quantity_rejects(text: object) -> None:
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity(text)


@pytest.mark.parametrize(
    ("resource", "text", "amount"),
    [
        ("cpu", "250m", 250),
        ("cpu", "1", 1000),
        ("cpu", "0.1", 100),
        ("cpu", "1n", 1),  # rounded up, like MilliValue()
        ("memory", "1Gi", GiB),
        ("memory", "1.5", 2),  # rounded up, like Value()
        ("nvidia.com/gpu", "2", 2),
    ],
    ids=[
        "cpu-milli",
        "cpu-whole",
        "cpu-decimal",
        "cpu-rounds-up",
        "memory",
        "memory-rounds-up",
        "gpu",
    ],
)
def test_resource_amount(resource: str, text: str, amount: int) -> None:
    assert resource_amount(resource, text) == amount


def test_resource_amount_rejects_negative() -> None:
    with pytest.raises(QuantityError, match="negative"):
        resource_amount("memory", "-1Gi")


SUFFIXES = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}


@given(st.integers(min_value=0, max_value=10**9), st.sampled_from(sorted(SUFFIXES)))
def test_integer_quantities_scale_exactly(number: int, suffix: str) -> None:
    assert parse_quantity(f"{number}{suffix}") == number * SUFFIXES[suffix]


@given(st.integers(min_value=0, max_value=10**12))
def test_cpu_millicores_round_trip(millicores: int) -> None:
    assert resource_amount("cpu", f"{millicores}m") == millicores
    assert resource_amount("cpu", str(Fraction(millicores, 1000).__float__())) >= millicores


@given(st.decimals(min_value=0, max_value=10**6, places=3, allow_nan=False))
def test_decimal_quantities_are_exact(number: object) -> None:
    assert parse_quantity(str(number)) == Fraction(str(number))


# ---- nodes ---------------------------------------------------------------------------------


def test_parse_node_reads_scheduling_fields() -> None:
    node = parse_node(
        node_obj(
            "gpu-1",
            cpu="15900m",
            memory="62Gi",
            extra={"nvidia.com/gpu": "8"},
            labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"},
            taints=[("nvidia.com/gpu", "present", "NoSchedule")],
            unschedulable=True,
        )
    )
    assert node.name == "gpu-1"
    assert node.allocatable == {
        "cpu": 15900,
        "memory": 62 * GiB,
        "pods": 110,
        "ephemeral-storage": 100 * GiB,
        "nvidia.com/gpu": 8,
    }
    assert node.labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert node.taints == (Taint("nvidia.com/gpu", "present", "NoSchedule"),)
    assert node.ready and node.unschedulable


def test_parse_node_not_ready_and_capacity_fallback() -> None:
    obj = node_obj(ready=False)
    obj["status"]["capacity"] = obj["status"].pop("allocatable")
    node = parse_node(obj)
    assert not node.ready
    assert node.allocatable["cpu"] == 4000


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda o: o["metadata"].pop("name"), "metadata.name"),
        (lambda o: o["status"]["allocatable"].update(cpu="lots"), "status.allocatable.cpu"),
        (lambda o: o["spec"].update(taints={"key": "x"}), "spec.taints"),
        (lambda o: o["metadata"].update(labels={"a": 1}), "metadata.labels"),
        (lambda o: o["spec"]["taints"].append({"key": 3}), "spec.taints[0].key"),
    ],
    ids=["missing-name", "bad-quantity", "taints-not-list", "label-not-string", "taint-key-type"],
)
def test_parse_node_errors_name_the_field(mutate: Any, field: str) -> None:
    obj = node_obj()
    mutate(obj)
    with pytest.raises(ObjectError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_node(obj)


# ---- pod requests (kube-scheduler's PodRequests) ----------------------------------------------


def _init(requests: Mapping[str, str], sidecar: bool = False) -> dict[str, Any]:
    return container(requests, **({"restartPolicy": "Always"} if sidecar else {}))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"containers": [container({"cpu": "100m"}), container({"cpu": "200m"})]}, {"cpu": 300}),
        (
            {
                "containers": [container({"cpu": "100m", "memory": "1Gi"})],
                "initContainers": [_init({"cpu": "2"}), _init({"memory": "512Mi"})],
            },
            {"cpu": 2000, "memory": GiB},
        ),
        (
            {
                "containers": [container({"cpu": "1"})],
                "initContainers": [_init({"cpu": "500m"}, sidecar=True), _init({"cpu": "1200m"})],
            },
            {"cpu": 1700},  # init runs beside the sidecar: 1200 + 500 > 1000 + 500
        ),
        (
            {
                "containers": [container({"cpu": "1"})],
                "initContainers": [_init({"cpu": "1200m"}), _init({"cpu": "500m"}, sidecar=True)],
            },
            {"cpu": 1500},  # sidecar starts after the init container: max(1200, 1000 + 500)
        ),
        (
            {
                "containers": [container({"cpu": "1"})],
                "overhead": {"cpu": "250m", "memory": "64Mi"},
            },
            {"cpu": 1250, "memory": 64 * MiB},
        ),
        (
            {
                "containers": [container({"cpu": "1"})],
                "initContainers": [_init({"cpu": "3"})],
                "overhead": {"cpu": "100m"},
            },
            {"cpu": 3100},  # overhead on top of the init peak
        ),
        (
            {
                "containers": [
                    container({"nvidia.com/gpu": "1"}),
                    container({"nvidia.com/gpu": "2"}),
                ],
                "initContainers": [_init({"nvidia.com/gpu": "1"})],
            },
            {"nvidia.com/gpu": 3},
        ),
        (
            {"containers": [container({"cpu": "1"})], "resources": {"requests": {"cpu": "3"}}},
            {"cpu": 3000},  # pod-level requests replace the container sum
        ),
        ({"containers": [container(None)]}, {}),
        ({"containers": [container({"cpu": "0"})]}, {}),
    ],
    ids=[
        "containers-sum",
        "init-max-per-resource",
        "sidecar-beside-later-init",
        "sidecar-after-init",
        "overhead-added",
        "overhead-on-init-peak",
        "extended-resource-gpu",
        "pod-level-requests",
        "no-requests",
        "zero-request-dropped",
    ],
)
def test_pod_requests_follow_kube_scheduler(spec: dict[str, Any], expected: dict[str, int]) -> None:
    obj = pod_obj()
    obj["spec"].update(spec)
    assert dict(parse_pod(obj).requests) == expected


def _named(name: str, requests: Mapping[str, str]) -> dict[str, Any]:
    return container(requests, name=name)


def _status(
    *containers: tuple[str, Mapping[str, str] | None, Mapping[str, str] | None],
    resize: str | None = None,
) -> dict[str, Any]:
    """Pod status with (name, allocatedResources, resources.requests) per container and an
    optional ``PodResizePending`` condition reason."""
    statuses = []
    for name, allocated, actual in containers:
        entry: dict[str, Any] = {"name": name}
        if allocated is not None:
            entry["allocatedResources"] = dict(allocated)
        if actual is not None:
            entry["resources"] = {"requests": dict(actual)}
        statuses.append(entry)
    status: dict[str, Any] = {"phase": "Running", "containerStatuses": statuses}
    if resize is not None:
        status["conditions"] = [{"type": "PodResizePending", "status": "True", "reason": resize}]
    return status


# kube-scheduler v1.36 counts a pod on its node with resource.PodRequests(pod,
# UseStatusResources): max(spec, actuated, allocated), or max(actuated, allocated) when
# the pod's resize is Infeasible.
@pytest.mark.parametrize(
    ("containers", "status", "expected"),
    [
        ([_named("a", {"cpu": "1"})], _status(("a", None, None)), {"cpu": 1000}),
        (
            [_named("a", {"cpu": "2"})],  # resize up requested, not yet allocated
            _status(("a", {"cpu": "1"}, {"cpu": "1"})),
            {"cpu": 2000},
        ),
        (
            [_named("a", {"cpu": "1"})],  # resize down requested, still running at 2
            _status(("a", {"cpu": "2"}, {"cpu": "2"})),
            {"cpu": 2000},
        ),
        (
            [_named("a", {"cpu": "1"})],  # allocated 2, kubelet not yet actuated
            _status(("a", {"cpu": "2"}, {"cpu": "1"})),
            {"cpu": 2000},
        ),
        (
            [_named("a", {"cpu": "4"})],  # resize up marked Infeasible: spec is ignored
            _status(("a", {"cpu": "1"}, {"cpu": "1"}), resize="Infeasible"),
            {"cpu": 1000},
        ),
        (
            [_named("a", {"cpu": "4"})],  # Deferred: it may still happen, spec counts
            _status(("a", {"cpu": "1"}, {"cpu": "1"}), resize="Deferred"),
            {"cpu": 4000},
        ),
        (
            [_named("a", {"cpu": "4"}), _named("b", {"cpu": "1"})],  # b has no status yet
            _status(("a", {"cpu": "1"}, None), resize="Infeasible"),
            {"cpu": 1000},
        ),
        (
            [_named("a", {"cpu": "1", "memory": "1Gi"})],
            _status(("a", {"cpu": "1", "memory": "2Gi"}, None)),
            {"cpu": 1000, "memory": 2 * GiB},
        ),
    ],
    ids=[
        "status-without-resources-counts-spec",
        "resize-up-in-progress-counts-spec",
        "resize-down-in-progress-counts-actuated",
        "allocated-above-actuated",
        "resize-infeasible-ignores-spec",
        "resize-deferred-counts-spec",
        "infeasible-container-without-status-counts-nothing",
        "allocated-only",
    ],
)
def test_pod_requests_use_status_resources_like_kube_scheduler_v1_36(
    containers: list[dict[str, Any]], status: dict[str, Any], expected: dict[str, int]
) -> None:
    obj = pod_obj(containers=containers, nodeName="n1")
    obj["status"] = status
    assert dict(parse_pod(obj).requests) == expected


# resource.PodRequests applies pod-level requests only for cpu, memory and hugepages-*
# (IsSupportedPodLevelResource), after the container aggregate and before overhead.
@pytest.mark.parametrize(
    ("pod_level", "expected"),
    [
        ({"cpu": "3"}, {"cpu": 3000, "memory": GiB, "ephemeral-storage": GiB}),
        (
            {"cpu": "3", "memory": "4Gi", "ephemeral-storage": "9Gi"},
            {"cpu": 3000, "memory": 4 * GiB, "ephemeral-storage": GiB},
        ),
        (
            {"nvidia.com/gpu": "5"},
            {"cpu": 1000, "memory": GiB, "ephemeral-storage": GiB, "nvidia.com/gpu": 1},
        ),
        (
            {"hugepages-2Mi": "4Mi"},
            {"cpu": 1000, "memory": GiB, "ephemeral-storage": GiB, "hugepages-2Mi": 4 * MiB},
        ),
        ({"cpu": "500m"}, {"cpu": 500, "memory": GiB, "ephemeral-storage": GiB}),
    ],
    ids=[
        "cpu",
        "ephemeral-storage-ignored",
        "extended-resource-ignored",
        "hugepages",
        "replaces-init-peak",
    ],
)
def test_pod_level_resources_only_cpu_memory_hugepages_like_podrequests(
    pod_level: dict[str, str], expected: dict[str, int]
) -> None:
    requests = {"cpu": "500m", "memory": "1Gi", "ephemeral-storage": "1Gi"}
    if "nvidia.com/gpu" in pod_level:
        requests["nvidia.com/gpu"] = "1"
    obj = pod_obj(
        containers=[container(requests)],
        initContainers=[_init({"cpu": "1"})],
        resources={"requests": pod_level},
    )
    assert dict(parse_pod(obj).requests) == expected


def test_scoring_requests_default_per_container() -> None:
    pod = parse_pod(pod_obj(containers=[container({"cpu": "1"}), container(None)]))
    assert pod.nonzero_cpu_m == 1100
    assert pod.nonzero_memory == 2 * DEFAULT_MEMORY_REQUEST
    assert pod.requests == {"cpu": 1000}


# ---- pod fields -------------------------------------------------------------------------------


def test_parse_pod_reads_metadata_and_constraints() -> None:
    obj = pod_obj(
        "web",
        "shop",
        labels={"app": "web"},
        priority=100,
        nodeSelector={"zone": "a", "disk": "ssd"},
        tolerations=[{"key": "k", "operator": "Exists", "effect": "NoSchedule"}, {"key": "x"}],
        affinity=affinity_terms([("zone", "In", ["a", "b"])]),
        schedulingGates=[{"name": "wait"}],
        containers=[
            container({"cpu": "1"}, ports=[{"containerPort": 80, "hostPort": 8080}]),
            container(
                {},
                ports=[
                    {"containerPort": 53, "hostPort": 53, "protocol": "UDP", "hostIP": "10.0.0.1"}
                ],
            ),
        ],
    )
    obj["metadata"]["deletionTimestamp"] = "2024-05-01T12:01:00Z"
    obj["status"] = {"phase": "Succeeded"}
    pod = parse_pod(obj)
    assert (pod.key, pod.uid, pod.priority) == ("shop/web", "uid-shop-web", 100)
    assert pod.created_at == 1714564800.0
    assert pod.scheduler_name == "interference-scheduler"
    assert pod.terminating and pod.finished
    assert pod.node_selector == (("disk", "ssd"), ("zone", "a"))
    assert pod.tolerations == (
        Toleration("k", "Exists", "", "NoSchedule"),
        Toleration("x", "Equal", "", ""),
    )
    assert pod.required_node_affinity is not None
    assert pod.required_node_affinity[0].match_expressions == (
        Requirement("zone", "In", ("a", "b")),
    )
    assert pod.host_ports == (HostPort("TCP", 8080, "0.0.0.0"), HostPort("UDP", 53, "10.0.0.1"))
    assert pod.scheduling_gates == ("wait",)
    assert pod.unsupported == ()
    assert pod.tolerance is None


def test_signature_equal_for_equal_constraints_only() -> None:
    a = parse_pod(pod_obj("a", nodeSelector={"zone": "a"}, requests={"cpu": "1"}))
    b = parse_pod(pod_obj("b", nodeSelector={"zone": "a"}, requests={"cpu": "2"}))
    c = parse_pod(pod_obj("c", nodeSelector={"zone": "b"}))
    assert a.signature == b.signature and hash(a.signature) == hash(b.signature)
    assert a.signature != c.signature


def test_anti_affinity_terms_on_hostname() -> None:
    term = {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {
            "matchLabels": {"app": "db"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["test"]}],
        },
    }
    all_ns = {**term, "namespaceSelector": {}}
    listed = {**term, "namespaces": ["a", "b"]}
    pod = parse_pod(
        pod_obj(
            "db-0",
            "data",
            affinity={
                "podAntiAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [term, all_ns, listed]
                }
            },
        )
    )
    selector = LabelSelector(
        (Requirement("app", "In", ("db",)), Requirement("tier", "NotIn", ("test",)))
    )
    assert pod.anti_affinity == (
        AntiAffinityTerm(selector, frozenset({"data"})),
        AntiAffinityTerm(selector, None),
        AntiAffinityTerm(selector, frozenset({"a", "b"})),
    )
    assert pod.anti_affinity[0].matches("data", {"app": "db"})
    assert not pod.anti_affinity[0].matches("other", {"app": "db"})
    assert not pod.anti_affinity[0].matches("data", {"app": "db", "tier": "test"})
    assert pod.anti_affinity[1].matches("other", {"app": "db"})


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"volumes": [{"name": "e", "emptyDir": {}}, {"name": "d", "rbd": {"image": "d"}}]},
            "spec.volumes[1].rbd (inline in-tree volume: disk conflicts)",
        ),
        (
            {"volumes": [{"name": "d", "awsElasticBlockStore": {"volumeID": "vol-1"}}]},
            "spec.volumes[0].awsElasticBlockStore (inline in-tree volume: disk conflicts)",
        ),
        (
            {"volumes": [{"name": "d", "gcePersistentDisk": {"pdName": "d"}}]},
            "spec.volumes[0].gcePersistentDisk (inline in-tree volume: disk conflicts)",
        ),
        (
            {"volumes": [{"name": "d", "iscsi": {"iqn": "iqn.2001-04.com.example:d"}}]},
            "spec.volumes[0].iscsi (inline in-tree volume: disk conflicts)",
        ),
        (
            {"volumes": [{"name": "d", "azureDisk": {"diskName": "d", "diskURI": "/d"}}]},
            "spec.volumes[0].azureDisk (inline in-tree volume: attach limits)",
        ),
        ({"resourceClaims": [{"name": "gpu"}]}, "spec.resourceClaims"),
    ],
    ids=[
        "inline-rbd-volume",
        "inline-aws-ebs-volume",
        "inline-gce-pd-volume",
        "inline-iscsi-volume",
        "inline-azure-disk-volume",
        "resource-claims",
    ],
)
def test_unsupported_fields_are_named(spec: dict[str, Any], field: str) -> None:
    obj = pod_obj()
    obj["spec"].update(spec)
    pod = parse_pod(obj)
    assert pod.unsupported == (field,)


@pytest.mark.parametrize(
    ("annotations", "tolerance"),
    [
        ({}, None),
        ({ANNOTATION_MAX_RUNQ_P99_US: "500"}, InterferenceTolerance(max_runq_p99_us=500.0)),
        (
            {ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S: "2.5", ANNOTATION_MAX_INDEX: "40"},
            InterferenceTolerance(max_reclaim_stall_ms_per_s=2.5, max_index=40.0),
        ),
        ({ANNOTATION_MAX_INDEX: "0"}, InterferenceTolerance(max_index=0.0)),
    ],
    ids=["none", "runq", "reclaim-and-index", "zero-index"],
)
def test_tolerance_annotations(
    annotations: dict[str, str], tolerance: InterferenceTolerance | None
) -> None:
    assert parse_pod(pod_obj(annotations=annotations)).tolerance == tolerance


def test_the_max_index_annotation_sets_no_warning() -> None:
    pod = parse_pod(pod_obj(annotations={ANNOTATION_MAX_INDEX: "40"}))
    assert pod.tolerance == InterferenceTolerance(max_index=40.0)
    assert pod.warnings == ()


FORMER_MAX_INDEX = "interference.io/max-score"  # vocabulary: former name
"""The index annotation's name before the first release; never shipped."""


def test_max_score_is_an_unknown_annotation_like_any_other() -> None:
    """:data:`FORMER_MAX_INDEX` was never a released name: it sets no tolerance, is never
    validated, and gets the warning any unknown key gets."""
    pod = parse_pod(pod_obj(annotations={FORMER_MAX_INDEX: "101"}))
    assert pod.tolerance is None
    assert [w.reason for w in pod.warnings] == ["UnknownAnnotation"]
    assert FORMER_MAX_INDEX in pod.warnings[0].message
    both = {ANNOTATION_MAX_INDEX: "40", FORMER_MAX_INDEX: "40"}
    assert parse_pod(pod_obj(annotations=both)).tolerance == InterferenceTolerance(max_index=40.0)


@pytest.mark.parametrize(
    ("annotations", "reasons", "closest"),
    [
        ({"interference.io/max-runq-p99": "500"}, ["UnknownAnnotation"],
         "did you mean interference.io/max-runq-p99-us?"),
        ({"interference.io/max_index": "40", ANNOTATION_MAX_INDEX: "40"}, ["UnknownAnnotation"],
         "did you mean interference.io/max-index?"),
        ({"Interference.IO/rebalance": "false"}, ["UnknownAnnotation"],
         "did you mean interference.io/rebalance?"),
        ({"interference.io/whatever": "1"}, ["UnknownAnnotation"],
         "known: interference.io/max-runq-p99-us, "),
        ({FORMER_MAX_INDEX: "40", "interference.io/max-reclaim": "2"},
         ["UnknownAnnotation", "UnknownAnnotation"],
         "did you mean interference.io/max-reclaim-stall-ms-per-s?"),
        ({"interferance.io/max-runq-p99-us": "500"}, ["UnknownAnnotation"],
         "did you mean interference.io/max-runq-p99-us?"),
        ({"interference.com/max-index": "40"}, ["UnknownAnnotation"],
         "did you mean interference.io/max-index?"),
        ({"example.com/max-index": "1", "scheduler.interference.io/x": "1"}, [], ""),
        ({"interference.io/degradable": "true", "interference.io/rebalance": "false"}, [], ""),
    ],
    ids=["no-us", "underscore", "case", "far-from-any", "two-unknown", "misspelt-domain",
         "other-tld", "other-prefix", "other-programs-keys"],
)  # fmt: skip
def test_an_unknown_interference_annotation_is_a_warning_naming_the_closest_key(
    annotations: dict[str, str], reasons: list[str], closest: str
) -> None:
    pod = parse_pod(pod_obj(annotations=annotations))
    assert [w.reason for w in pod.warnings] == reasons
    if closest:
        assert closest in pod.warnings[-1].message
        assert "has no effect" in pod.warnings[-1].message


def test_a_placed_pod_with_a_bad_tolerance_still_counts_on_its_node() -> None:
    annotations = {ANNOTATION_MAX_INDEX: "101"}
    pod = parse_pod(pod_obj("placed", annotations=annotations, nodeName="n1"))
    assert pod.node_name == "n1"
    assert pod.tolerance is None  # only its own scheduling reads it, and that is over


@pytest.mark.parametrize(
    ("annotation", "value", "expected"),
    [
        (ANNOTATION_MAX_RUNQ_P99_US, "fast", "non-negative number of microseconds"),
        (ANNOTATION_MAX_RUNQ_P99_US, "-1", "non-negative number of microseconds"),
        (ANNOTATION_MAX_RECLAIM_STALL_MS_PER_S, "nan", "milliseconds per second"),
        (ANNOTATION_MAX_INDEX, "101", "from 0 to 100"),
        (ANNOTATION_MAX_INDEX, "inf", "from 0 to 100"),
    ],
    ids=["runq-word", "runq-negative", "reclaim-nan", "index-above-100", "index-inf"],
)
def test_malformed_tolerance_names_annotation_and_format(
    annotation: str, value: str, expected: str
) -> None:
    with pytest.raises(ObjectError) as info:
        parse_pod(pod_obj("lat", annotations={annotation: value}))
    message = str(info.value)
    assert "pod default/lat" in message and annotation in message and expected in message
    assert repr(value) in message


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (
            {"containers": [container({"cpu": "one"})]},
            r"spec.containers\[0\].resources.requests.cpu",
        ),
        (
            {"initContainers": [container({"memory": "1Qi"})]},
            r"spec.initContainers\[0\].resources.requests.memory",
        ),
        ({"overhead": {"cpu": "x"}}, "spec.overhead.cpu"),
        ({"tolerations": [{"key": "k", "operator": "Maybe"}]}, r"spec.tolerations\[0\].operator"),
        ({"priority": "high"}, "spec.priority"),
        (
            {"affinity": affinity_terms([("zone", "Near", ["a"])])},
            r"matchExpressions\[0\].operator",
        ),
        (
            {"containers": [container({}, ports=[{"hostPort": 70000}])]},
            r"spec.containers\[0\].ports\[0\].hostPort",
        ),
        (
            {
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchFields": [
                                        {"key": "spec.podCIDR", "operator": "In", "values": ["x"]}
                                    ]
                                }
                            ]
                        }
                    }
                }
            },
            r"matchFields\[0\].key",
        ),
    ],
    ids=[
        "container-quantity",
        "init-quantity",
        "overhead-quantity",
        "toleration-operator",
        "priority-type",
        "affinity-operator",
        "host-port-range",
        "match-fields-key",
    ],
)
def test_parse_pod_errors_name_the_field(spec: dict[str, Any], field: str) -> None:
    obj = pod_obj()
    obj["spec"].update(spec)
    with pytest.raises(ObjectError, match=field):
        parse_pod(obj)


def test_parse_pod_rejects_non_object() -> None:
    with pytest.raises(ObjectError, match="expected a JSON object"):
        parse_pod(["not", "a", "pod"])  # type: ignore[arg-type]


# A placed pod is never scheduled again: a field only its own scheduling reads, which we
# cannot read, must not drop it from the table (its requests would stop counting on its node
# and the node would look emptier than kube-scheduler sees it). A pending pod with the same
# field is refused as unparseable.
OWN_SCHEDULING_FIELDS_WE_CANNOT_READ: list[tuple[str, dict[str, Any]]] = [
    ("interference tolerance annotation", {"annotations": {ANNOTATION_MAX_INDEX: "high"}}),
    (
        "toleration operator of an alpha gate",
        {"tolerations": [{"key": "gpu-mem", "operator": "Gt", "value": "40"}]},
    ),
    (
        "topology spread whenUnsatisfiable",
        {
            "topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}
            ]
        },
    ),
    ("preemption policy", {"preemptionPolicy": "Always"}),
    ("node selector", {"nodeSelector": {"zone": 3}}),
]


@pytest.mark.parametrize(
    ("field", "extra"),
    OWN_SCHEDULING_FIELDS_WE_CANNOT_READ,
    ids=[f for f, _ in OWN_SCHEDULING_FIELDS_WE_CANNOT_READ],
)
def test_placed_pod_with_unreadable_own_scheduling_field_still_counts_on_its_node(
    field: str, extra: dict[str, Any]
) -> None:
    annotations = extra.pop("annotations", None)
    pending = pod_obj("web", requests={"cpu": "500m"}, annotations=annotations, **extra)
    with pytest.raises(ObjectError):
        parse_pod(pending)
    placed = pod_obj(
        "web", requests={"cpu": "500m"}, annotations=annotations, nodeName="n1", **extra
    )
    pod = parse_pod(placed)
    assert (pod.node_name, pod.requests["cpu"]) == ("n1", 500)


def test_placed_pod_with_unreadable_requests_is_still_an_error() -> None:
    """Requests are what a placed pod holds on its node: never guessed."""
    with pytest.raises(ObjectError, match="cpu"):
        parse_pod(pod_obj("web", requests={"cpu": "lots"}, nodeName="n1"))


@pytest.mark.parametrize(
    ("value", "opt_out", "opt_in"),
    [
        ("false", True, False),
        ("False", True, False),
        (" FALSE ", True, False),
        ("no", True, False),
        ("0", True, False),
        ("off", True, False),
        ("Off", True, False),
        ("true", False, True),
        ("TRUE", False, True),
        ("yes", False, True),
        ("1", False, True),
        ("on", False, True),
    ],
)
def test_the_rebalance_annotation_reads_kubernetes_style_booleans(
    value: str, opt_out: bool, opt_in: bool
) -> None:
    """ "no", "0" and "off" mean false as "false" does (docs/operations.md): an owner who
    wrote them is never evicted by the rebalancer; none of these is a warning."""
    pod = parse_pod(pod_obj(annotations={"interference.io/rebalance": value}))
    assert (pod.rebalance_opt_out, pod.rebalance_opt_in) == (opt_out, opt_in)
    assert pod.warnings == ()


@pytest.mark.parametrize("value", ["never", "disabled", "", "t", "nope", "2"])
def test_an_unreadable_rebalance_value_is_a_warning_and_never_an_eviction(value: str) -> None:
    """Never silently ignored: a Warning InvalidAnnotation naming the accepted values, and
    the pod is read as opting out (the rebalancer does not evict on a guess) without
    opting in."""
    pod = parse_pod(pod_obj(annotations={"interference.io/rebalance": value}))
    assert (pod.rebalance_opt_out, pod.rebalance_opt_in) == (True, False)
    assert [w.reason for w in pod.warnings] == ["InvalidAnnotation"]
    message = pod.warnings[0].message
    assert "interference.io/rebalance" in message and repr(value) in message
    assert '"true" or "false"' in message


def test_an_unreadable_degradable_value_is_a_warning() -> None:
    pod = parse_pod(pod_obj(annotations={"interference.io/degradable": "si"}))
    assert [w.reason for w in pod.warnings] == ["InvalidAnnotation"]
    assert "interference.io/degradable" in pod.warnings[0].message
    assert parse_pod(pod_obj(annotations={"interference.io/degradable": "Yes"})).warnings == ()
