# The pod sandbox ("pause") image for a containerd node without a registry: holds the pod's
# namespaces, exits on SIGTERM/SIGINT, reaps nothing (the pod's containers are not its children).
ARG BASE_IMAGE=debian:12.9-slim
FROM ${BASE_IMAGE}
USER 65535:65535
ENTRYPOINT ["/bin/sh", "-c", "trap 'exit 0' TERM INT; sleep infinity & wait"]
