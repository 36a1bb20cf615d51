"""``kubectl interference …``: the ``interference`` CLI against the cluster of the current
kubeconfig context, with no set-up (a kubectl plugin: kubectl runs the executable
``kubectl-interference`` found on ``PATH``).

What an operator otherwise does by hand (docs/operations.md, "Secrets and Redis users"),
done for one command and undone after it:

1. read the viewer's Secret ``redis-viewer`` (its ``username``, ``password`` and
   ``ca.crt``) with ``kubectl get secret`` — the Role ``interference-redis-viewer`` allows
   exactly that;
2. ``kubectl port-forward svc/redis :6379`` on a free local port;
3. run ``interference`` with ``REDIS_URL=rediss://127.0.0.1:PORT/0`` (the certificate names
   127.0.0.1), ``REDIS_USERNAME``, ``REDIS_PASSWORD_FILE`` and ``REDIS_CA_FILE`` pointing at
   files only this user can read, in a directory removed afterwards;
4. stop the port-forward.

kubectl's own ``--context``, ``--kubeconfig`` and ``-n``/``--namespace`` (the install's
namespace, ``interference-system`` by default) may come before the command:
``kubectl interference --context prod top -o json``. ``KUBECTL`` names another kubectl.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from interference_cli.main import main as interference_main
from interference_cli.plain import plain
from interference_infra.cliparse import RUNTIME_EXIT

NAMESPACE = "interference-system"
SECRET = "redis-viewer"
ROLE = "interference-redis-viewer"
SERVICE = "svc/redis"
REDIS_PORT = 6379
DEFAULT_USERNAME = "interference-viewer"
FORWARD_TIMEOUT_S = 20.0
"""How long the port-forward may take to say which local port it listens on."""
FORWARDING = re.compile(r"Forwarding from 127\.0\.0\.1:(\d+) -> ")
KUBECTL_FLAGS = ("--context", "--kubeconfig", "-n", "--namespace")
"""kubectl's flags taken before the command (each with a value)."""


class PluginError(Exception):
    """What went wrong, as one line for the user."""


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point of ``kubectl-interference``; exit status as ``interference``'s, 1 when
    the cluster could not give Redis or its credentials."""
    env = dict(os.environ if environ is None else environ)
    args = list(sys.argv[1:] if argv is None else argv)
    kube, namespace, rest = _kubectl_flags(args)
    kubectl = [env.get("KUBECTL") or "kubectl", *kube, "-n", namespace]
    try:
        secret = _secret(kubectl, env)
        with tempfile.TemporaryDirectory(prefix="kubectl-interference-") as folder:
            env.pop("REDIS_PASSWORD", None)
            env["REDIS_USERNAME"] = secret.get("username", "") or DEFAULT_USERNAME
            env["REDIS_PASSWORD_FILE"] = _private_file(folder, "password", secret["password"])
            scheme = "redis"
            if secret.get("ca.crt"):
                env["REDIS_CA_FILE"] = _private_file(folder, "ca.crt", secret["ca.crt"])
                scheme = "rediss"
            forward = subprocess.Popen(
                [*kubectl, "port-forward", SERVICE, f":{REDIS_PORT}"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
            try:
                port = _forwarded_port(forward)
                env["REDIS_URL"] = f"{scheme}://127.0.0.1:{port}/0"
                return interference_main(rest, environ=env)
            finally:
                forward.terminate()
                try:
                    forward.wait(5)
                except subprocess.TimeoutExpired:
                    forward.kill()
                    forward.wait()
    except PluginError as exc:
        print(f"kubectl interference: {plain(exc)}", file=sys.stderr)
        return RUNTIME_EXIT


def _kubectl_flags(args: list[str]) -> tuple[list[str], str, list[str]]:
    """(kubectl's flags, the install's namespace, the ``interference`` arguments)."""
    kube: list[str] = []
    namespace = NAMESPACE
    while args and (args[0] in KUBECTL_FLAGS or args[0].split("=", 1)[0] in KUBECTL_FLAGS):
        flag, equals, value = args.pop(0).partition("=")
        if not equals:
            value = args.pop(0) if args else ""
        if flag in ("-n", "--namespace"):
            namespace = value
        else:
            kube += [flag, value]
    return kube, namespace, args


def _secret(kubectl: list[str], env: Mapping[str, str]) -> dict[str, str]:
    """The viewer Secret's data, decoded."""
    try:
        done = subprocess.run(
            [*kubectl, "get", "secret", SECRET, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=FORWARD_TIMEOUT_S,
            env=dict(env),
            check=False,
        )
    except FileNotFoundError:
        raise PluginError(f"{kubectl[0]} not found: install kubectl or set KUBECTL") from None
    except subprocess.TimeoutExpired:
        raise PluginError(f"kubectl get secret {SECRET} did not answer in time") from None
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise PluginError(
            f"cannot read the Secret {SECRET} ({why[0]}); the user needs the Role {ROLE}"
            f" (kubectl -n {kubectl[-1]} create rolebinding NAME --role {ROLE} --user USER)"
        )
    try:
        data = json.loads(done.stdout).get("data") or {}
        decoded = {k: base64.b64decode(v).decode() for k, v in data.items()}
    except (ValueError, AttributeError, binascii.Error) as exc:
        raise PluginError(f"the Secret {SECRET} does not read as a Secret: {exc}") from None
    if not decoded.get("password"):
        raise PluginError(f"the Secret {SECRET} has no password (scripts/create-redis-secret.sh)")
    return decoded


def _private_file(folder: str, name: str, content: str) -> str:
    path = Path(folder) / name
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(content)
    return str(path)


def _forwarded_port(forward: subprocess.Popen[str]) -> int:
    """The local port ``kubectl port-forward`` says it listens on. Both its outputs are
    read to the end by threads of their own (a line per connection, its errors), so it
    never blocks on a full pipe however long the command runs."""
    assert forward.stdout is not None and forward.stderr is not None
    found: list[int] = []
    errors: list[str] = []
    ready = threading.Event()

    def read_out(stream: IO[str]) -> None:
        for line in stream:
            match = FORWARDING.search(line)
            if match and not found:
                found.append(int(match.group(1)))
                ready.set()
        ready.set()  # the output ended: port-forward exited

    def read_errors(stream: IO[str]) -> None:
        for line in stream:
            if line.strip():
                errors[:] = [line.strip()]

    for target, stream in ((read_out, forward.stdout), (read_errors, forward.stderr)):
        threading.Thread(target=target, args=(stream,), daemon=True).start()
    deadline = time.monotonic() + FORWARD_TIMEOUT_S
    while not ready.wait(0.1):
        if forward.poll() is not None or time.monotonic() > deadline:
            break
    if found:
        return found[0]
    exited = forward.poll() is not None
    time.sleep(0.2)  # its last error line
    raise PluginError(
        f"kubectl port-forward {SERVICE} :{REDIS_PORT} gave no local port"
        + (f" ({errors[-1]})" if errors else "")
        + ("" if exited else f" within {FORWARD_TIMEOUT_S:g} s")
    )


if __name__ == "__main__":
    sys.exit(main())
