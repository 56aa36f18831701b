#!/usr/bin/env bash
# Install the Debian packages that `make demo` and `make test` need, once, saying what it installs.
#   systemd-container  systemd-nspawn: the lab's hosts
#   debootstrap        the lab's Debian rootfs
#   the shellcheck package: ansible-test sanity's shellcheck test (silently skipped without it)
#   iproute2           the lab's bridge, veth pairs and network namespaces
#   openssh-client     ssh to the lab hosts (ansible's ssh connection)
#   ca-certificates    pip over TLS
#   --vm: qemu-system-x86 qemu-utils e2fsprogs (VM lab hosts, `make test-vm`)
#   with --ee: podman and runc (crun, podman's default, cannot start containers without
#   CAP_SYS_RESOURCE): `make ee` / `make test-ee` build and run the execution environment
# Idempotent: prints nothing and installs nothing when every package is there. Needs root (apt-get)
# only when something is missing; otherwise it says which packages to install and exits 2.
set -euo pipefail

need=(systemd-container debootstrap shellcheck iproute2 openssh-client ca-certificates)
for arg in "$@"; do
  case "$arg" in
    --ci) need+=(make git) ;;
    # VM lab hosts (fleetops-lab up --vm): QEMU, qemu-img for the per-host qcow2 disks, mke2fs for
    # the image (the guest kernel is installed into the image itself, not on this machine).
    --vm) need+=(qemu-system-x86 qemu-utils e2fsprogs) ;;
    --ee) need+=(podman runc) ;;
    *) echo "tools/debian-deps.sh: unknown flag $arg (--ci, --vm, --ee)" >&2; exit 2 ;;
  esac
done

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "tools/debian-deps.sh: not a Debian-family system (no dpkg-query); install by hand: ${need[*]}" >&2
  exit 0
fi

missing=()
for p in "${need[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
((${#missing[@]})) || exit 0

if [[ $(id -u) -ne 0 ]]; then
  echo "error: missing Debian packages: ${missing[*]} (run as root, or: sudo apt-get install -y ${missing[*]})" >&2
  exit 2
fi
echo "== installing Debian packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
echo "== installed: ${missing[*]}"
