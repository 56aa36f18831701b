#!/usr/bin/env bash
# Run the molecule scenarios under tests/molecule on lab hosts (root: the lab boots nspawn hosts).
# Usage: run.sh [SCENARIO ...] (default: every scenario). Scenarios run one after another, never in
# parallel: zombie_reclaim reads the kernel's host-wide memcg count, which every lab host shares.
# Boots two lab hosts, runs the scenarios, and tears the lab down again. A scenario whose directory holds a
# file named lab-vm runs afterwards on one VM lab host instead (`fleetops-lab up 1 --vm`: its own kernel,
# cgroup v2; QEMU needed, tools/debian-deps.sh --vm), after the nspawn hosts are down.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin="$repo/.venv/bin"
export PATH="$bin:$PATH"
cd "$repo/tests"
scenarios=("$@")
if [ "${#scenarios[@]}" -eq 0 ]; then
  for file in molecule/*/molecule.yml; do
    scenarios+=("$(basename "$(dirname "$file")")")
  done
fi
for name in "${scenarios[@]}"; do
  if [ ! -f "molecule/$name/molecule.yml" ]; then
    echo "run.sh: no molecule scenario $name under tests/molecule" >&2
    exit 2
  fi
done
nspawn=() vm=()
for name in "${scenarios[@]}"; do
  if [ -e "molecule/$name/lab-vm" ]; then vm+=("$name"); else nspawn+=("$name"); fi
done
trap '"$bin/fleetops-lab" down >/dev/null' EXIT
export FLEETOPS_COLLECTIONS_PATH="$repo/collections"
export ANSIBLE_CONFIG="$repo/ansible.cfg"
run() {  # run.sh's lab must be up: run these scenarios, one after another
  FLEETOPS_LAB_INVENTORY=$("$bin/fleetops-lab" inventory)
  export FLEETOPS_LAB_INVENTORY
  for name in "$@"; do
    echo "== molecule scenario $name"
    started=$SECONDS
    "$bin/molecule" test -s "$name"
    echo "== molecule scenario $name passed in $((SECONDS - started)) s"
  done
}
if [ "${#nspawn[@]}" -gt 0 ]; then
  "$bin/fleetops-lab" up 2 >/dev/null
  run "${nspawn[@]}"
fi
if [ "${#vm[@]}" -gt 0 ]; then
  "$bin/fleetops-lab" down >/dev/null
  "$bin/fleetops-lab" up 1 --vm >/dev/null
  run "${vm[@]}"
fi
