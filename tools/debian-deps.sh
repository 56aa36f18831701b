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
#   --slurm: slurm-client (scontrol, sinfo: the quarantine's Slurm backend on the controller, and the lab's
#   Slurm cluster tests) and munge (its munged authenticates scontrol; `fleetops-lab up --slurm` runs one
#   of the lab's own on its own socket): wanted for their tools only, daemons kept from starting and
#   disabled; the lab hosts' Slurm packages are installed into a cached layer of the lab's, not here
#   with --ci: make, git; prometheus (promtool) and prometheus-alertmanager (amtool) for the alert
#   rules' tests (tests/unit/test_prometheus_rules.py) and prometheus-node-exporter, wanted for their
#   binaries only: installed without recommends, with their daemons kept from starting (ports 9090,
#   9093, 9100), then disabled and stopped; the test that runs them as servers
#   (tests/integration/test_eda_lab.py) starts its own on loopback and the lab's network and stops them
#   by PID; openjdk-17-jre-headless, the Java ansible-rulebook's rule engine (Drools) runs on
#   (tests/unit/test_eda_rulebook.py; about 7 s to download and unpack here, nothing on an image that
#   has it)
# Idempotent: prints nothing and installs nothing when every package is there. Needs root (apt-get)
# only when something is missing; otherwise it says which packages to install and exits 2.
set -euo pipefail

need=(systemd-container debootstrap shellcheck iproute2 openssh-client ca-certificates)
tools=()  # packages wanted for a command-line tool only, not for the service they ship
for arg in "$@"; do
  case "$arg" in
    --ci)
      need+=(make git openjdk-17-jre-headless)
      tools+=(prometheus prometheus-alertmanager prometheus-node-exporter)
      ;;
    # VM lab hosts (fleetops-lab up --vm): QEMU, qemu-img for the per-host qcow2 disks, mke2fs for
    # the image (the guest kernel is installed into the image itself, not on this machine).
    --vm) need+=(qemu-system-x86 qemu-utils e2fsprogs) ;;
    --ee) need+=(podman runc) ;;
    --slurm) tools+=(slurm-client munge) ;;
    *) echo "tools/debian-deps.sh: unknown flag $arg (--ci, --vm, --ee, --slurm)" >&2; exit 2 ;;
  esac
done

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "tools/debian-deps.sh: not a Debian-family system (no dpkg-query); install by hand: ${need[*]} ${tools[*]}" >&2
  exit 0
fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "ok installed"; }
missing=() missing_tools=()
for p in "${need[@]}"; do installed "$p" || missing+=("$p"); done
for p in "${tools[@]}"; do installed "$p" || missing_tools+=("$p"); done
((${#missing[@]} + ${#missing_tools[@]})) || exit 0

if [[ $(id -u) -ne 0 ]]; then
  all=("${missing[@]}" "${missing_tools[@]}")
  echo "error: missing Debian packages: ${all[*]} (run as root, or: sudo apt-get install -y ${all[*]})" >&2
  exit 2
fi
echo "== installing Debian packages: ${missing[*]} ${missing_tools[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
((${#missing[@]} == 0)) || apt-get install -y -qq "${missing[@]}" >/dev/null
if ((${#missing_tools[@]})); then
  # policy-rc.d exiting 101 holds back every service start during the install (invoke-rc.d and
  # systemd's deb-systemd-invoke both ask it); one that is already there is left as it is.
  guard=
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    guard=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\nexit 101\n' >"$guard"
    chmod 755 "$guard"
    trap 'rm -f "$guard"' EXIT
  fi
  apt-get install -y -qq --no-install-recommends "${missing_tools[@]}" >/dev/null
  [[ -z $guard ]] || rm -f "$guard"
  # Enabled by their postinst: disabled, so that no boot starts them either (no-op without systemd).
  if [[ -d /run/systemd/system ]]; then
    for p in "${missing_tools[@]}"; do systemctl disable --now --quiet "$p.service" 2>/dev/null || true; done
  fi
fi
echo "== installed: ${missing[*]} ${missing_tools[*]}"
