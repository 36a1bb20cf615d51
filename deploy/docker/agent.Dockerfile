# interference-agent: Debian's BCC (python3-bpfcc) plus the project in a venv that sees it.
# Build from the repository root with BuildKit: make images (docs/operations.md, "Images").
# BASE_IMAGE: any Debian 12 image (default: Docker Hub's; without a registry, the one
# scripts/build-base-image.sh makes). PyPI access: build arg PIP_INDEX_URL, and the secrets
# pip_ca (a CA bundle file) and pip_conf (a pip.conf, e.g. with index credentials), mounted
# only while pip runs: nothing of them stays in a layer.
# Kernel headers are not in the image: BCC compiles against the host's, which the DaemonSet
# mounts read-only at /lib/modules and /usr/src.
ARG BASE_IMAGE=debian:12.9-slim
FROM ${BASE_IMAGE}

ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-bpfcc \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /src
COPY pyproject.toml README.md deploy/docker/constraints.txt ./
COPY interference/ interference/
COPY interference_infra/ interference_infra/
COPY node_agent/ node_agent/
ARG PIP_INDEX_URL=
# --system-site-packages: the venv imports Debian's bcc module, built for this python3.
# The gpu extra brings NVML bindings for the GPU inventory on GPU nodes. Every dependency,
# the build backend included, comes from constraints.txt with its SHA-256 checked
# (--require-hashes); the project then installs from the build context with no index, so
# nothing unhashed is downloaded.
RUN --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_conf \
    set -eu; \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi; \
    if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    if [ -n "$PIP_INDEX_URL" ]; then export PIP_INDEX_URL; else unset PIP_INDEX_URL; fi; \
    export PIP_DISABLE_PIP_VERSION_CHECK=1; \
    python3 -m venv --system-site-packages /opt/interference; \
    /opt/interference/bin/pip install --no-cache-dir --require-hashes --no-deps \
        --requirement /src/constraints.txt; \
    /opt/interference/bin/pip install --no-cache-dir --no-index --no-deps \
        --no-build-isolation '.[gpu]'; \
    rm -rf /src
COPY bpf/ /opt/interference/bpf/

WORKDIR /
ENV PATH=/opt/interference/bin:$PATH \
    INTERFERENCE_BPF_DIR=/opt/interference/bpf \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# Runs as uid 0 with only the capabilities the DaemonSet adds (deploy/base/agent/daemonset.yaml).
USER 0:0
ENTRYPOINT ["interference-agent"]
