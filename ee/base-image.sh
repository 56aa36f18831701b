#!/usr/bin/env bash
# The execution environment's base image, made locally (no registry): a Debian trixie minbase rootfs
# from debootstrap, imported into podman as localhost/fleetops-ee-base:<recipe hash>. It is the local
# equivalent of docker.io/library/debian:trixie-slim (Python 3.13 from Debian; ansible-core 2.21
# needs >= 3.12). Built once per recipe: when the tag exists, nothing is done.
# Prints the image reference on stdout; progress goes to stderr. Needs root (debootstrap).
#   ee/base-image.sh [--print]   --print: only print the reference, build nothing
set -euo pipefail

SUITE=trixie
MIRROR=${FLEETOPS_EE_MIRROR:-http://deb.debian.org/debian}
VARIANT=minbase
# Bump when this script changes the image in a way the variables above do not capture.
RECIPE_VERSION=1

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}

hash=$(printf '%s\n' "$SUITE" "$MIRROR" "$VARIANT" "$RECIPE_VERSION" | sha256sum | cut -c1-12)
image=localhost/fleetops-ee-base:$hash

if [[ "${1:-}" == "--print" ]] || podman image exists "$image"; then
  echo "$image"
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "error: building the base image $image needs root (debootstrap)" >&2
  exit 2
fi

work=$(mktemp -d /var/tmp/fleetops-ee-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
echo "== debootstrap $SUITE ($VARIANT) from $MIRROR into $work (about 1-2 min)" >&2
start=$SECONDS
if ! debootstrap --variant="$VARIANT" \
  --keyring=/usr/share/keyrings/debian-archive-keyring.gpg \
  "$SUITE" "$work/root" "$MIRROR" >"$work/debootstrap.log" 2>&1; then
  echo "error: debootstrap failed; the end of its log:" >&2
  tail -n 30 "$work/debootstrap.log" >&2
  exit 1
fi
root=$work/root
# What a container image does not carry: the build host's resolver and name, caches, logs.
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*.log \
  "$root"/var/log/apt/* "$root"/etc/resolv.conf "$root"/etc/hostname
printf 'deb %s %s main\n' "$MIRROR" "$SUITE" >"$root/etc/apt/sources.list"
echo "== podman import -> $image" >&2
tar --numeric-owner -C "$root" -c . |
  podman import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' \
    - "$image" >/dev/null
echo "== base image $image built in $((SECONDS - start)) s" >&2
echo "$image"
