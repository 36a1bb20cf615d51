"""The agent's privileges as docs/operations.md tables them ("The agent's privileges") are
exactly what the rendered manifests grant it: every capability, host path, host namespace,
seccomp profile, uid, RBAC rule and Pod Security level is a row, every row is granted where
the row says, and every test a row names exists. And the namespaces keep their promise: the
agent's pod needs "privileged" only for those rows, every pod of interference-system passes
"restricted" (the Pod Security Standards' checks, as the API server runs them)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.deploy.manifests import REPO, Obj, find, kustomizations, pod_templates, render

DOC = REPO / "docs" / "operations.md"
AGENTS = "interference-agent"
SYSTEM = "interference-system"


def table() -> list[dict[str, str]]:
    """The rows of the table after ``<!-- privileges -->``."""
    text = DOC.read_text()
    start = text.index("<!-- privileges -->")
    lines = text[start:].splitlines()[1:]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = []
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append(dict(zip(header, cells, strict=True)))
    return rows


def agent_daemonset(objects: tuple[Obj, ...]) -> Obj:
    return find(objects, "DaemonSet", "interference-agent")


def privileges(objects: tuple[Obj, ...]) -> set[str]:
    """Every privilege the rendered manifests give the agent, worded as the table words it."""
    daemonset = agent_daemonset(objects)
    spec = daemonset["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    found: set[str] = set()
    for flag in ("hostPID", "hostNetwork", "hostIPC"):
        if spec.get(flag):
            found.add(f"`{flag}`")
    (agent,) = [c for c in spec["containers"] if c["name"] == "agent"]
    context = agent["securityContext"]
    assert context["capabilities"]["drop"] == ["ALL"] and not context.get("privileged")
    assert context["allowPrivilegeEscalation"] is False
    found |= {f"capability `{c}`" for c in context["capabilities"]["add"]}
    if context.get("runAsUser") == 0:
        found.add("uid 0")
    seccomp = context["seccompProfile"]
    if seccomp["type"] != "RuntimeDefault":
        found.add(f"seccomp `{seccomp['type']}` `{seccomp.get('localhostProfile')}`")
    env = {e["name"]: e.get("value") for e in agent["env"]}
    for mount in agent["volumeMounts"]:
        host_path = volumes[mount["name"]].get("hostPath")
        if host_path is None:
            continue
        assert mount.get("readOnly") is True, f"{mount} is writable"
        if mount["mountPath"] == host_path["path"]:
            found.add(f"host path `{host_path['path']}`, read-only")
        else:
            assert env.get("PROC_ROOT") == mount["mountPath"]
            where = f"`{host_path['path']}` at `{mount['mountPath']}`"
            found.add(f"host path {where}, read-only (`PROC_ROOT`)")
    for init in spec.get("initContainers", []):
        assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]
        assert init["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
        for mount in init["volumeMounts"]:
            host_path = volumes[mount["name"]].get("hostPath")
            if host_path is not None:
                found.add(f"host path `{host_path['path']}`, init container only, writable")
    namespace = find(objects, "Namespace", daemonset["metadata"]["namespace"])
    level = namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
    found.add(f"Pod Security `{level}` on `{namespace['metadata']['name']}`")
    account = spec["serviceAccountName"]
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(
            s["name"] == account and s.get("namespace") == daemonset["metadata"]["namespace"]
            for s in binding["subjects"]
        ):
            continue
        role = find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role["rules"]:
            found |= {f"RBAC `{v} {r}`" for r in rule["resources"] for v in rule["verbs"]}
    return found


def legacy_row(base: set[str], legacy: set[str]) -> str:
    """The legacy-kernel row: the capabilities it gives instead of the base's."""

    def caps(found: set[str]) -> set[str]:
        return {p.split("`")[1] for p in found if p.startswith("capability ")}

    added = ", ".join(f"`{c}`" for c in sorted(caps(legacy) - caps(base)))
    removed = ", ".join(f"`{c}`" for c in sorted(caps(base) - caps(legacy)))
    return f"capabilities {added} instead of {removed}"


def test_the_table_matches_the_manifests() -> None:
    rows = table()
    by_place: dict[str, set[str]] = {}
    for row in rows:
        by_place.setdefault(row["in"], set()).add(row["privilege"])
    base = privileges(render(kustomizations()["base"]))
    assert by_place.pop("base") == base
    host = privileges(render(kustomizations()["host-namespaces"]))
    assert by_place.pop("`host-namespaces`") == host - base
    assert base <= host
    legacy = privileges(render(kustomizations()["legacy-kernel"]))
    assert by_place.pop("`legacy-kernel`") == {legacy_row(base, legacy)}
    assert by_place == {}, f"rows for places not rendered here: {by_place}"


def test_every_named_test_exists() -> None:
    for row in table():
        cell = row["without it"]
        for path, name in re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", cell):
            tree = ast.parse((REPO / path).read_text())
            names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
            assert name in names, f"{row['privilege']}: {path} has no {name}"
        assert re.search(r"`tests/|`make e2e-cluster`", cell), row


def test_the_comparison_can_fail() -> None:
    base = privileges(render(kustomizations()["base"]))
    assert "capability `BPF`" in base and "uid 0" in base
    assert "`hostPID`" not in base and "`hostNetwork`" not in base
    assert "RBAC `get nodes/pods`" in base and "RBAC `list pods`" not in base


# --- Pod Security Standards (the checks of k8s.io/pod-security-admission, v1.36) ----------

BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def containers_of(pod_spec: Obj) -> list[Obj]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def baseline_violations(pod_spec: Obj) -> set[str]:
    found = set()
    for flag in ("hostPID", "hostNetwork", "hostIPC"):
        if pod_spec.get(flag):
            found.add(flag)
    if any("hostPath" in v for v in pod_spec.get("volumes", [])):
        found.add("hostPath volumes")
    for c in containers_of(pod_spec):
        context = c.get("securityContext", {})
        if context.get("privileged"):
            found.add("privileged")
        for cap in context.get("capabilities", {}).get("add", []):
            if cap not in BASELINE_CAPABILITIES:
                found.add(f"capability {cap}")
        if any("hostPort" in p for p in c.get("ports", [])):
            found.add("hostPort")
        for profile in (context.get("seccompProfile"), pod_spec.get("securityContext", {})):
            if profile and profile.get("type") == "Unconfined":
                found.add("seccomp Unconfined")
    return found


def restricted_violations(pod_spec: Obj) -> set[str]:
    found = baseline_violations(pod_spec)
    pod_context = pod_spec.get("securityContext", {})
    for volume in pod_spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if not kinds <= RESTRICTED_VOLUMES:
            found.add(f"volume {volume['name']}: {kinds}")
    for c in containers_of(pod_spec):
        context = c.get("securityContext", {})

        def setting(key: str, c_context: Obj = context) -> object:
            return c_context.get(key, pod_context.get(key))

        name = c["name"]
        if setting("runAsNonRoot") is not True:
            found.add(f"{name}: runAsNonRoot")
        if setting("runAsUser") == 0:
            found.add(f"{name}: runAsUser 0")
        if context.get("allowPrivilegeEscalation") is not False:
            found.add(f"{name}: allowPrivilegeEscalation")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []):
            found.add(f"{name}: drop ALL")
        if set(capabilities.get("add", [])) - {"NET_BIND_SERVICE"}:
            found.add(f"{name}: adds capabilities")
        seccomp = context.get("seccompProfile") or pod_context.get("seccompProfile")
        if not seccomp or seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.add(f"{name}: seccomp")
    return found


@pytest.mark.parametrize("name", sorted(kustomizations()))
def test_every_pod_of_interference_system_passes_restricted(name: str) -> None:
    objects = render(kustomizations()[name])
    namespace = find(objects, "Namespace", SYSTEM)
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    checked = 0
    for owner, template in pod_templates(objects):
        if owner["metadata"]["namespace"] == SYSTEM:
            assert restricted_violations(template["spec"]) == set(), owner["metadata"]["name"]
            checked += 1
    assert checked >= 2  # the scheduler and the issuer; Redis unless external
    assert [o["metadata"]["namespace"] for o, _ in pod_templates(objects)].count(AGENTS) == 1


def test_the_agent_pod_violates_baseline_only_by_its_listed_privileges() -> None:
    """Without "privileged" on its namespace the API server would refuse the agent: for its
    host paths and its two capabilities, the rows of the table, and for nothing else."""
    for name, expected in {
        "base": {"hostPath volumes", "capability BPF", "capability PERFMON"},
        "host-namespaces": {
            "hostPath volumes",
            "capability BPF",
            "capability PERFMON",
            "capability NET_ADMIN",
            "hostPID",
            "hostNetwork",
        },
    }.items():
        spec = agent_daemonset(render(kustomizations()[name]))["spec"]["template"]["spec"]
        assert baseline_violations(spec) == expected, name


UNCONFINED = {"type": "Unconfined"}


def test_the_pod_security_checks_can_fail() -> None:
    spec = agent_daemonset(render(kustomizations()["base"]))["spec"]["template"]["spec"]
    assert "agent: runAsUser 0" in restricted_violations(spec)
    assert "seccomp Unconfined" in baseline_violations(
        {
            "containers": [
                {"name": "c", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}
            ]
        }
    )


def test_the_seccomp_profile_is_the_runtime_default_plus_two() -> None:
    """The shipped profile refuses by default (EPERM) and allows, beyond the runtime
    default's unconditional list, only bpf and perf_event_open; nothing a runtime default
    gates behind CAP_SYS_ADMIN (mount, unshare, setns, ptrace, ...)."""
    import json

    profile = json.loads((REPO / "deploy/base/agent/seccomp-profile.json").read_text())
    assert profile["defaultAction"] == "SCMP_ACT_ERRNO"
    allowed = {
        n
        for rule in profile["syscalls"]
        if rule["action"] == "SCMP_ACT_ALLOW"
        for n in rule["names"]
    }
    assert {"bpf", "perf_event_open"} <= allowed
    for gated in ("mount", "umount2", "unshare", "setns", "ptrace", "kexec_load", "init_module"):
        assert gated not in allowed, gated
    agent = agent_daemonset(render(kustomizations()["base"]))
    spec = agent["spec"]["template"]["spec"]
    (context,) = [c["securityContext"] for c in spec["containers"] if c["name"] == "agent"]
    assert context["seccompProfile"] == {
        "type": "Localhost",
        "localhostProfile": "interference/agent.json",
    }
    # The init container writes the shipped file to <kubelet root>/seccomp/interference/.
    (init,) = spec["initContainers"]
    script = " ".join(init["command"])
    assert "/host-seccomp/interference/agent.json" in script
    assert Path("/profile/agent.json").name in script
