# interference-scheduler: Debian's Python 3.11, the project in a venv, an unprivileged user.
# Also runs the credential issuer (deploy/base/credentials: command interference-credentials),
# so a cluster needs no third image.
# Build from the repository root with BuildKit: make images (docs/operations.md, "Images").
# BASE_IMAGE, PIP_INDEX_URL and the pip_ca / pip_conf secrets: as in agent.Dockerfile.
# Python packages: hashed in constraints.txt, installed with --require-hashes (agent.Dockerfile).
ARG BASE_IMAGE=debian:12.9-slim
FROM ${BASE_IMAGE} AS build
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md deploy/docker/constraints.txt ./
COPY interference/ interference/
COPY interference_infra/ interference_infra/
COPY scheduler/ scheduler/
COPY credential_issuer/ credential_issuer/
ARG PIP_INDEX_URL=
RUN --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_conf \
    set -eu; \
    if [ -s /run/secrets/pip_ca ]; then export PIP_CERT=/run/secrets/pip_ca; fi; \
    if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    if [ -n "$PIP_INDEX_URL" ]; then export PIP_INDEX_URL; else unset PIP_INDEX_URL; fi; \
    export PIP_DISABLE_PIP_VERSION_CHECK=1; \
    python3 -m venv /opt/interference; \
    /opt/interference/bin/pip install --no-cache-dir --require-hashes --no-deps \
        --requirement /src/constraints.txt; \
    /opt/interference/bin/pip install --no-cache-dir --no-index --no-deps \
        --no-build-isolation .; \
    /opt/interference/bin/pip check; \
    for program in interference-scheduler interference-credentials; do \
        /opt/interference/bin/$program --help >/dev/null; \
    done

FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/interference /opt/interference
ENV PATH=/opt/interference/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
EXPOSE 10251
ENTRYPOINT ["interference-scheduler"]
