#!/usr/bin/env bash
# Builds the images from deploy/docker/ with BuildKit (`make images` runs this).
#   IMAGES         which to build (default "agent scheduler"; also: redis pause, for
#                  clusters without a registry, see deploy/overlays/local-images). The
#                  scheduler image also holds the credential issuer (interference-credentials)
#   IMAGE_TAG      tag of agent and scheduler (default: the version in pyproject.toml,
#                  the tag deploy/base/kustomization.yaml deploys)
#   BASE_IMAGE     Debian 12 base (default debian:12.9-slim; scripts/build-base-image.sh
#                  builds interference-base:bookworm without a registry)
#   PIP_INDEX_URL  package index for pip (build arg; no credentials here, use PIP_CONF)
#   PIP_CA         CA bundle file pip trusts (a TLS-intercepting proxy's CA); passed as a
#                  build secret, never stored in the image
#   PIP_CONF       a pip.conf file (index credentials, proxies); a build secret too
#   DOCKER         docker CLI (default docker; must support BuildKit: docker >= 18.09 with
#                  DOCKER_BUILDKIT=1, or buildx)
#   DOCKER_BUILD_FLAGS  extra flags, e.g. --network host for a daemon run with --bridge=none
set -euo pipefail
cd "$(dirname "$0")/.."
images=${IMAGES:-agent scheduler}
tag=${IMAGE_TAG:-$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)}
base=${BASE_IMAGE:-debian:12.9-slim}
docker_cli=${DOCKER:-docker}
read -r -a extra <<<"${DOCKER_BUILD_FLAGS:-}"

flags=(--build-arg "BASE_IMAGE=$base")
[[ -n ${PIP_INDEX_URL:-} ]] && flags+=(--build-arg "PIP_INDEX_URL=$PIP_INDEX_URL")
for pair in "pip_ca:${PIP_CA:-}" "pip_conf:${PIP_CONF:-}"; do
    id=${pair%%:*} file=${pair#*:}
    [[ -z $file ]] && continue
    [[ -r $file ]] || { echo "images: $id file $file is not readable: fix PIP_CA/PIP_CONF" >&2; exit 2; }
    flags+=(--secret "id=$id,src=$file")
done

# The builds run side by side: each spends most of its time waiting on apt and pip
# downloads (agent and scheduler one after the other: 74 + 76 s in e2e-cluster's runs).
declare -A building=()
for image in $images; do
    case $image in
        agent|scheduler) name=interference-$image:$tag ;;
        redis) name=interference-redis:7.0.15 ;;
        pause) name=interference-pause:bookworm ;;
        *) echo "images: unknown image '$image': choose from agent scheduler redis pause" >&2; exit 2 ;;
    esac
    (
        start=$SECONDS
        DOCKER_BUILDKIT=1 "$docker_cli" build -q "${flags[@]}" "${extra[@]}" \
            -f "deploy/docker/$image.Dockerfile" -t "$name" . >/dev/null
        echo "images: built $name in $((SECONDS - start)) s"
    ) &
    building[$!]=$name
done
failed=()
for pid in "${!building[@]}"; do
    wait "$pid" || failed+=("${building[$pid]}")
done
if ((${#failed[@]})); then
    echo "images: the build of ${failed[*]} failed" >&2
    exit 1
fi
