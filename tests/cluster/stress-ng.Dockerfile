# Debian's stress-ng: the antagonist of the demo's acts on the real cluster
# (interference_cli/cluster_demo.py), where no registry is reachable.
ARG BASE_IMAGE=debian:12.9-slim
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends stress-ng \
 && rm -rf /var/lib/apt/lists/*
CMD ["stress-ng", "--cpu", "4", "--cpu-method", "int64", "--quiet"]
