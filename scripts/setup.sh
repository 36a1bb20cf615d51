#!/usr/bin/env bash
# One-shot set-up of a fresh Debian machine for building, testing and the demo:
# apt packages, kernel-header stand-ins for BCC, tracefs, and the project venv.
# Idempotent: every step checks before it acts. Needs root for the system steps.
set -euo pipefail
cd "$(dirname "$0")/.."

# chromium: the decision page is tested in a real headless browser (tests/cli).
# prometheus: every dashboard query is tested against a real one (tests/deploy).
APT_PACKAGES=(redis-server redis-tools python3-bpfcc bpfcc-tools stress-ng linux-perf
              libbpf-tools linux-headers-cloud-amd64 iproute2 kmod chromium prometheus)
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
    if [[ $EUID -ne 0 ]]; then
        echo "setup: missing apt packages ${missing[*]}; run 'sudo make setup'" >&2
        exit 1
    fi
    echo "setup: installing ${missing[*]}"
    apt-get update -qq
    # Tests start their own redis-server and prometheus: a policy-rc.d refusing every start
    # keeps the packages' daemons (prometheus's, its node exporter's) from starting.
    policy=/usr/sbin/policy-rc.d
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy"
        chmod +x "$policy"
        trap 'rm -f "$policy"' EXIT  # a failed install leaves no policy behind either
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# BCC compiles against /lib/modules/$(uname -r)/build. This kernel ships no headers, so
# Debian's cloud headers stand in: our programs read only tracepoint arguments and
# helpers, never kernel struct fields, so a version mismatch cannot change what they read.
modules="/lib/modules/$(uname -r)"
if [[ $EUID -eq 0 && ! -e "$modules/build" ]]; then
    arch_dir=$(ls -d /usr/src/linux-headers-*-cloud-amd64 2>/dev/null | sort -V | tail -1)
    common_dir=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -1)
    if [[ -n "$arch_dir" && -n "$common_dir" ]]; then
        mkdir -p "$modules"
        ln -sfn "$arch_dir" "$modules/build"
        ln -sfn "$common_dir" "$modules/source"
        echo "setup: linked $modules/{build,source} to Debian cloud headers"
    fi
fi

if [[ $EUID -eq 0 ]]; then
    if [[ -z "$(ls -A /sys/kernel/tracing 2>/dev/null)" ]]; then
        mount -t tracefs tracefs /sys/kernel/tracing && echo "setup: mounted tracefs"
    fi
    if [[ -d /sys/kernel/debug && -z "$(ls -A /sys/kernel/debug 2>/dev/null)" ]]; then
        mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null || true
    fi
fi

if [[ ! -x "$VENV/bin/python" ]]; then
    "$PYTHON" -m venv "$VENV"
fi
# The venv sees Debian's bcc module (pure Python over libbcc) and nothing else of Debian's.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [[ -d /usr/lib/python3/dist-packages/bcc && ! -e "$site/bcc" ]]; then
    ln -s /usr/lib/python3/dist-packages/bcc "$site/bcc"
fi
stamp="$VENV/.installed"
if [[ ! -f "$stamp" || pyproject.toml -nt "$stamp" ]]; then
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -e '.[dev]'
    touch "$stamp"
fi
echo "setup: ready ($VENV)"
