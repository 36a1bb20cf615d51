# Debian's nginx, standing in for the example's nginx:1.27.3-alpine where no registry is
# reachable (make e2e-cluster): it serves / on port 80 like the original.
ARG BASE_IMAGE=debian:12.9-slim
FROM ${BASE_IMAGE}
ARG DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends nginx-light \
 && rm -rf /var/lib/apt/lists/* \
 && ln -sf /dev/stdout /var/log/nginx/access.log \
 && ln -sf /dev/stderr /var/log/nginx/error.log
EXPOSE 80
CMD ["nginx", "-g", "daemon off;"]
