#!/usr/bin/env bash
# Builds a Debian 12 base image without a registry: debootstrap --variant=minbase bookworm,
# then `docker import`. Usage: scripts/build-base-image.sh [TAG]  (default interference-base:bookworm)
# Env: DOCKER (docker CLI, default docker), DEBIAN_MIRROR (default http://deb.debian.org/debian).
# Idempotent: does nothing when the tag exists.
set -euo pipefail
tag=${1:-interference-base:bookworm}
docker_cli=${DOCKER:-docker}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if "$docker_cli" image inspect "$tag" >/dev/null 2>&1; then
    echo "base image: $tag exists"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "base image: debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
[[ $EUID -eq 0 ]] || { echo "base image: debootstrap needs root: run as root" >&2; exit 1; }
rootfs=$(mktemp -d /tmp/interference-rootfs.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
# Nothing of the build host's apt state or caches goes into the image.
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" --numeric-owner -c . | "$docker_cli" import - "$tag" >/dev/null
echo "base image: built $tag"
