"""The PodMonitor fields deploy/components/prometheus-operator uses, checked against the
Prometheus Operator's monitoring.coreos.com/v1 API (kubernetes-validate has no schema for
its CRDs), strictly: an unknown or misspelt field is an error, as for built-in kinds."""

from __future__ import annotations

from typing import Any

from tests.deploy.manifests import Obj

SPEC_FIELDS = {
    "jobLabel", "podTargetLabels", "podMetricsEndpoints", "selector", "selectorMechanism",
    "namespaceSelector", "sampleLimit", "targetLimit", "labelLimit", "labelNameLengthLimit",
    "labelValueLengthLimit", "keepDroppedTargets", "attachMetadata", "scrapeClass",
    "scrapeProtocols", "fallbackScrapeProtocol", "bodySizeLimit",
    "nativeHistogramBucketLimit", "nativeHistogramMinBucketFactor",
    "convertClassicHistogramsToNHCB", "scrapeClassicHistograms",
}  # fmt: skip
"""PodMonitorSpec's fields."""
ENDPOINT_FIELDS = {
    "port", "portNumber", "targetPort", "path", "scheme", "params", "interval",
    "scrapeTimeout", "honorLabels", "honorTimestamps", "trackTimestampsStaleness",
    "metricRelabelings", "relabelings", "tlsConfig", "basicAuth", "bearerTokenSecret",
    "authorization", "oauth2", "proxyUrl", "noProxy", "proxyFromEnvironment",
    "proxyConnectHeader", "followRedirects", "enableHttp2", "filterRunning",
}  # fmt: skip
"""PodMetricsEndpoint's fields."""
TLS_FIELDS = {"ca", "cert", "keySecret", "serverName", "insecureSkipVerify", "minVersion",
              "maxVersion"}  # fmt: skip
KEY_SELECTOR_FIELDS = {"name", "key", "optional"}


def podmonitor_errors(obj: Obj) -> list[str]:
    """Why ``obj`` is not a valid PodMonitor of the fields we use ([] when it is)."""
    name = f"{obj.get('kind')}/{obj['metadata'].get('name')}"
    errors: list[str] = []
    if obj.get("apiVersion") != "monitoring.coreos.com/v1" or obj.get("kind") != "PodMonitor":
        return [f"{name}: not a monitoring.coreos.com/v1 PodMonitor"]
    if not obj["metadata"].get("namespace"):
        errors.append(f"{name}: no namespace")
    if unknown := set(obj) - {"apiVersion", "kind", "metadata", "spec"}:
        errors.append(f"{name}: unknown top-level fields {sorted(unknown)}")
    spec: Any = obj.get("spec", {})
    if unknown := set(spec) - SPEC_FIELDS:
        errors.append(f"{name}: unknown spec fields {sorted(unknown)}")
    selector = spec.get("selector")
    if not isinstance(selector, dict) or not selector.get("matchLabels"):
        errors.append(f"{name}: spec.selector.matchLabels is required here")
    endpoints = spec.get("podMetricsEndpoints")
    if not isinstance(endpoints, list) or not endpoints:
        errors.append(f"{name}: no podMetricsEndpoints")
        return errors
    for i, endpoint in enumerate(endpoints):
        where = f"{name}: podMetricsEndpoints[{i}]"
        if unknown := set(endpoint) - ENDPOINT_FIELDS:
            errors.append(f"{where}: unknown fields {sorted(unknown)}")
        if not isinstance(endpoint.get("port"), str):
            errors.append(f"{where}: port must be the container port's name")
        if endpoint.get("scheme", "http") not in ("http", "https", "HTTP", "HTTPS"):
            errors.append(f"{where}: scheme {endpoint.get('scheme')!r}")
        if "honorLabels" in endpoint and not isinstance(endpoint["honorLabels"], bool):
            errors.append(f"{where}: honorLabels must be a boolean")
        tls = endpoint.get("tlsConfig", {})
        if unknown := set(tls) - TLS_FIELDS:
            errors.append(f"{where}: unknown tlsConfig fields {sorted(unknown)}")
        for source in tls.get("ca", {}).values() if isinstance(tls.get("ca"), dict) else []:
            if not isinstance(source, dict) or set(source) - KEY_SELECTOR_FIELDS:
                errors.append(f"{where}: tlsConfig.ca {source}")
            elif not {"name", "key"} <= set(source):
                errors.append(f"{where}: tlsConfig.ca needs name and key")
        if isinstance(tls.get("ca"), dict) and set(tls["ca"]) - {"secret", "configMap"}:
            errors.append(f"{where}: tlsConfig.ca is a secret or a configMap")
    return errors
