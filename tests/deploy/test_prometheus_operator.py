"""deploy/components/prometheus-operator: a PodMonitor for each program with a metrics port,
each selecting that program's pods by their own labels and port, in their namespace, and
admitted by the base's NetworkPolicies for the scraper label the docs name."""

from __future__ import annotations

import copy

import pytest

from tests.deploy.manifests import REPO, Obj, kustomizations, pod_templates, render
from tests.deploy.prometheus_operator import podmonitor_errors

SCRAPER_LABEL = "interference.io/metrics-scraper"


def monitors() -> list[Obj]:
    return [o for o in render(kustomizations()["prometheus-operator"]) if o["kind"] == "PodMonitor"]


def selected(monitor: Obj) -> list[tuple[Obj, Obj]]:
    """(workload, pod template) of the rendered workloads the PodMonitor selects."""
    wanted = monitor["spec"]["selector"]["matchLabels"]
    namespace = monitor["metadata"]["namespace"]
    return [
        (owner, template)
        for owner, template in pod_templates(render(kustomizations()["prometheus-operator"]))
        if owner["metadata"].get("namespace") == namespace
        and wanted.items() <= template["metadata"].get("labels", {}).items()
    ]


def test_every_program_with_a_metrics_port_has_a_podmonitor() -> None:
    """The programs whose pods carry prometheus.io/scrape (kept for a plain Prometheus) are
    exactly the ones a PodMonitor selects, on the annotated port and path and scheme."""
    base = render(kustomizations()["base"])
    annotated = {
        (owner["metadata"]["namespace"], owner["metadata"]["name"]): template["metadata"][
            "annotations"
        ]
        for owner, template in pod_templates(base)
        if template["metadata"].get("annotations", {}).get("prometheus.io/scrape") == "true"
    }
    assert len(annotated) == 3
    covered = {}
    for monitor in monitors():
        assert podmonitor_errors(monitor) == []
        assert (
            monitor["metadata"]["labels"]["app.kubernetes.io/part-of"] == "interference-scheduler"
        )
        (workload, template), *others = selected(monitor)
        assert others == [], monitor["metadata"]["name"]
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        ports = {
            p["name"]: p["containerPort"]
            for c in template["spec"]["containers"]
            for p in c.get("ports", [])
        }
        key = (workload["metadata"]["namespace"], workload["metadata"]["name"])
        annotations = annotated[key]
        assert str(ports[endpoint["port"]]) == annotations["prometheus.io/port"]
        assert endpoint["path"] == annotations["prometheus.io/path"]
        assert endpoint.get("scheme", "http") == annotations.get("prometheus.io/scheme", "http")
        covered[key] = endpoint
    assert set(covered) == set(annotated)
    # The agents' per-pod series name the measured pod in namespace/pod: honoured, never
    # renamed exported_namespace/exported_pod under the agent pod's own target labels.
    assert covered[("interference-agent", "interference-agent")]["honorLabels"] is True


def test_the_networkpolicies_admit_the_scraper_label_the_docs_name() -> None:
    """Each monitored program's NetworkPolicy admits pods labelled with the scraper label
    in a namespace labelled the same, on the monitored port; the Metrics section names it."""
    objects = render(kustomizations()["prometheus-operator"])
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    for monitor in monitors():
        ((_, template),) = selected(monitor)
        labels = template["metadata"]["labels"]
        namespace = monitor["metadata"]["namespace"]
        admitting = [
            rule
            for policy in policies
            if policy["metadata"]["namespace"] == namespace
            and policy["spec"]["podSelector"].get("matchLabels", {}).items() <= labels.items()
            for rule in policy["spec"].get("ingress", [])
            for peer in rule.get("from", [])
            if peer.get("namespaceSelector", {}).get("matchLabels") == {SCRAPER_LABEL: "true"}
            and peer.get("podSelector", {}).get("matchLabels") == {SCRAPER_LABEL: "true"}
        ]
        assert admitting, monitor["metadata"]["name"]
        assert any(
            p.get("port") == monitor["spec"]["podMetricsEndpoints"][0]["port"]
            for rule in admitting
            for p in rule.get("ports", [])
        )
    text = (REPO / "docs" / "operations.md").read_text()
    metrics = text.split("### Metrics", 1)[1].split("\n### ", 1)[0]
    grafana = text.split("### Grafana dashboard", 1)[1].split("\n## ", 1)[0]
    for section in (metrics, grafana):
        assert f"{SCRAPER_LABEL}=true" in section
        assert "deploy/overlays/prometheus-operator" in section


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (lambda m: m["spec"].update(podMetricEndpoints=[]), "unknown spec fields"),
        (lambda m: m["spec"]["podMetricsEndpoints"][0].update(honourLabels=True), "unknown"),
        (lambda m: m["spec"]["podMetricsEndpoints"][0].update(port=10271), "port"),
        (lambda m: m["spec"]["podMetricsEndpoints"][0].update(scheme="tcp"), "scheme"),
        (lambda m: m["spec"].pop("podMetricsEndpoints"), "no podMetricsEndpoints"),
        (lambda m: m["metadata"].pop("namespace"), "no namespace"),
    ],
)
def test_the_podmonitor_check_can_fail(change: object, complaint: str) -> None:
    monitor = copy.deepcopy(monitors()[0])
    change(monitor)  # type: ignore[operator]
    assert any(complaint in e for e in podmonitor_errors(monitor))
