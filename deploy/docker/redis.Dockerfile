# Redis for clusters without a registry (deploy/overlays/local-images): Debian 12's
# redis-server, the same 7.0.15 release as the base's redis:7.0.15-alpine and the ACL tests.
# The pod's command (deploy/base/redis/entrypoint.sh) needs only sh, sed and sha256sum.
ARG BASE_IMAGE=debian:12.9-slim
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends redis-server redis-tools \
 && rm -rf /var/lib/apt/lists/*
USER 999:999
EXPOSE 6379
CMD ["redis-server", "--protected-mode", "no"]
