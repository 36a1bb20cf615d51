# syntax=docker/dockerfile:1
# interference-agent: Debian's BCC (python3-bpfcc) plus the project in a venv that sees it.
# Build from the repository root: make images (docker build -f deploy/docker/agent.Dockerfile .)
# Kernel headers are not in the image: BCC compiles against the host's, which the DaemonSet
# mounts read-only at /lib/modules and /usr/src.
FROM debian:12.9-slim

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-bpfcc \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md ./
COPY interference/ interference/
COPY node_agent/ node_agent/
# --system-site-packages: the venv imports Debian's bcc module, built for this python3.
# The gpu extra brings NVML bindings for the GPU inventory on GPU nodes.
RUN python3 -m venv --system-site-packages /opt/interference \
 && /opt/interference/bin/pip install --no-cache-dir '.[gpu]' \
 && rm -rf /src
COPY bpf/ /opt/interference/bpf/

WORKDIR /
ENV PATH=/opt/interference/bin:$PATH \
    INTERFERENCE_BPF_DIR=/opt/interference/bpf \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Runs as uid 0 with only the capabilities the DaemonSet adds (deploy/base/agent/daemonset.yaml).
USER 0:0
ENTRYPOINT ["interference-agent"]
