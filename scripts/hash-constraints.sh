#!/usr/bin/env bash
# Writes into deploy/docker/constraints.txt the SHA-256 of every file pip may install for
# each pinned version in the images (Python 3.11 of Debian 12, on x86_64 and aarch64), so
# the image builds install with `pip install --require-hashes`: a wheel that differs from
# the one hashed here (a compromised index or mirror, a re-uploaded file) fails the build.
# Run it after changing a pin (docs/operations.md, "Images"); it downloads the wheels with
# pip from the index pip is configured for (PIP_INDEX_URL, PIP_CERT, … as for any pip).
#   PIP  the pip to run (default .venv/bin/pip)
set -euo pipefail
cd "$(dirname "$0")/.."
pip=${PIP:-.venv/bin/pip}
file=deploy/docker/constraints.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

grep -E '^[A-Za-z0-9_.-]+==' "$file" | sed 's/[ \\].*//' > "$work/pins"
for arch in x86_64 aarch64; do
    # Debian 12's glibc is 2.36: the manylinux tags its pip accepts, most specific first.
    platforms=()
    for minor in $(seq 36 -1 17); do platforms+=(--platform "manylinux_2_${minor}_$arch"); done
    platforms+=(--platform "manylinux2014_$arch")
    "$pip" download --quiet --no-deps --only-binary=:all: --python-version 3.11 \
        --implementation cp --abi cp311 --abi abi3 --abi none "${platforms[@]}" \
        --dest "$work/$arch" --requirement "$work/pins"
done

normal() { tr '[:upper:]' '[:lower:]' | sed -E 's/[-_.]+/_/g'; }
{
    sed -n '/^#/p' "$file"
    while IFS= read -r pin; do
        name=$(printf '%s' "${pin%%==*}" | normal)
        hashes=$(for wheel in "$work"/*/*.whl; do
            [[ $(basename "$wheel" | cut -d- -f1 | normal) == "$name" ]] || continue
            sha256sum "$wheel" | cut -d' ' -f1
        done | sort -u)
        [[ -n $hashes ]] || { echo "hash-constraints: no wheel of $pin was downloaded" >&2; exit 1; }
        printf '%s' "$pin"
        for hash in $hashes; do printf ' \\\n    --hash=sha256:%s' "$hash"; done
        printf '\n'
    done < "$work/pins"
} > "$work/constraints.txt"
mv "$work/constraints.txt" "$file"
echo "hash-constraints: $(grep -c -- '--hash=' "$file") hashes for $(wc -l < "$work/pins") pins in $file"
