"""The extender component's TLS wiring agrees with itself and with the code: kube-scheduler's
tlsConfig files lie in its mounted client Secret, the scheduler's default certificate files
in its mounted serving Secret, the Service and kube-scheduler's URL reach the extender's
port by a name the certificates hold, cert-manager.yaml makes exactly the Secrets mounted.
(Which pods may open the extender port: tests/deploy/test_network_policy.py.)"""

from __future__ import annotations

import urllib.parse
from pathlib import PurePosixPath

import yaml

from scheduler.endpoint.http import EXTENDER_PORT, ExtenderSettings
from tests.deploy.manifests import DEPLOY, Obj, container, find, kustomizations, render

COMPONENT = DEPLOY / "components" / "extender"
SERVING = "interference-extender-serving"
CLIENT = "interference-extender-client"


def extender_config(objects: tuple[Obj, ...]) -> Obj:
    rendered = find(objects, "ConfigMap", "interference-kube-scheduler-config")
    (extender,) = yaml.safe_load(rendered["data"]["config.yaml"])["extenders"]
    return dict(extender)


def secret_mounts(objects: tuple[Obj, ...], deployment: str, name: str) -> dict[str, str]:
    """Secret name → mount path, for the Secrets mounted into ``name``'s container."""
    spec = find(objects, "Deployment", deployment)["spec"]["template"]["spec"]
    secrets = {v["name"]: v["secret"]["secretName"] for v in spec["volumes"] if "secret" in v}
    return {
        secrets[m["name"]]: m["mountPath"]
        for m in container(find(objects, "Deployment", deployment), name)["volumeMounts"]
        if m["name"] in secrets
    }


def inside(path: str, directory: str) -> bool:
    return PurePosixPath(path).parent == PurePosixPath(directory)


def test_each_side_reads_its_certificate_files_from_its_mounted_secret() -> None:
    objects = render(kustomizations()["extender"])
    extender = extender_config(objects)
    assert extender["enableHTTPS"] is True
    client_dir = secret_mounts(objects, "interference-kube-scheduler", "kube-scheduler")[CLIENT]
    assert all(inside(path, client_dir) for path in extender["tlsConfig"].values())
    assert {PurePosixPath(p).name for p in extender["tlsConfig"].values()} == {
        "tls.crt",
        "tls.key",
        "ca.crt",
    }
    serving_dir = secret_mounts(objects, "interference-scheduler", "scheduler")[SERVING]
    defaults = ExtenderSettings()
    assert not defaults.plaintext
    for path in (defaults.tls_cert_file, defaults.tls_key_file, defaults.client_ca_file):
        assert inside(path, serving_dir), path


def test_kube_scheduler_reaches_the_extender_port_by_a_certified_name() -> None:
    objects = render(kustomizations()["extender"])
    url = urllib.parse.urlsplit(extender_config(objects)["urlPrefix"])
    assert url.scheme == "https"
    service = find(objects, "Service", "interference-scheduler-extender")
    (port,) = service["spec"]["ports"]
    assert url.port == port["port"]
    ports = container(find(objects, "Deployment", "interference-scheduler"), "scheduler")["ports"]
    assert {"name": "extender", "containerPort": EXTENDER_PORT, "protocol": "TCP"} in ports
    assert port["targetPort"] == "extender"
    name, namespace = service["metadata"]["name"], service["metadata"]["namespace"]
    assert url.hostname == f"{name}.{namespace}.svc"
    certificates = {
        c["metadata"]["name"]: c["spec"]
        for c in yaml.safe_load_all((COMPONENT / "cert-manager.yaml").read_text())
        if c and c["kind"] == "Certificate"
    }
    assert url.hostname in certificates[SERVING]["dnsNames"]
    assert "server auth" in certificates[SERVING]["usages"]
    assert "client auth" in certificates[CLIENT]["usages"]
    assert {c["secretName"] for c in certificates.values()} == {
        SERVING,
        CLIENT,
        "interference-extender-ca",
    }
    assert (
        "cert-manager.yaml"
        not in (COMPONENT / "kustomization.yaml")
        .read_text()
        .split("resources:")[1]
        .split("labels:")[0]
    )  # not rendered: the kind exists only with cert-manager
    script = (DEPLOY.parent / "scripts" / "create-extender-certs.sh").read_text()
    assert "DNS:$HOST" in script and 'HOST="$SERVICE.$NAMESPACE.svc"' in script
    assert f"SERVICE=${{SERVICE:-{name}}}" in script
