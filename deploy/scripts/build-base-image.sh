#!/bin/sh
# Build the base image `debian:bookworm-slim` locally when it is missing and no registry is
# reachable (air-gapped hosts, CI machines behind a proxy): debootstrap a minimal Debian
# bookworm root file system from a Debian mirror and `docker import` it under the same name,
# so deploy/Dockerfile builds unchanged here and pulls the real image everywhere else.
#
# Usage: deploy/scripts/build-base-image.sh [IMAGE] [MIRROR]
#   IMAGE   default debian:bookworm-slim
#   MIRROR  default $DEBIAN_MIRROR or http://deb.debian.org/debian
# Needs root, debootstrap and a running Docker engine. Does nothing if IMAGE already exists.
set -eu
IMAGE="${1:-debian:bookworm-slim}"
MIRROR="${2:-${DEBIAN_MIRROR:-http://deb.debian.org/debian}}"
DOCKER="${DOCKER:-docker}"

if "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "base image $IMAGE present"
    exit 0
fi
command -v debootstrap >/dev/null 2>&1 || {
    echo "build-base-image: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 1
}
ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/hushnet-rootfs.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT INT TERM
echo "debootstrap bookworm (minbase) from $MIRROR ..."
debootstrap --variant=minbase bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 || {
    echo "build-base-image: debootstrap failed; last lines of its log:" >&2
    tail -n 20 "$ROOTFS.log" >&2
    rm -f "$ROOTFS.log"
    exit 1
}
rm -f "$ROOTFS.log"
# what the official slim image also drops: apt lists and caches
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/archives/*.deb
tar -C "$ROOTFS" -c . | "$DOCKER" import \
    --change 'CMD ["bash"]' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    - "$IMAGE" >/dev/null
echo "imported $IMAGE"
