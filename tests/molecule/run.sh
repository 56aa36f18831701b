#!/usr/bin/env bash
# Run the molecule scenarios under tests/molecule on lab hosts (root: the lab boots nspawn hosts).
# Usage: run.sh [SCENARIO ...] (default: every scenario). Scenarios run one after another, never in
# parallel: zombie_reclaim reads the kernel's host-wide memcg count, which every lab host shares.
# Boots two lab hosts, runs the scenarios, and tears the lab down again.
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
"$bin/fleetops-lab" up 2 >/dev/null
trap '"$bin/fleetops-lab" down >/dev/null' EXIT
FLEETOPS_LAB_INVENTORY=$("$bin/fleetops-lab" inventory)
export FLEETOPS_LAB_INVENTORY
export FLEETOPS_COLLECTIONS_PATH="$repo/collections"
export ANSIBLE_CONFIG="$repo/ansible.cfg"
for name in "${scenarios[@]}"; do
  echo "== molecule scenario $name"
  started=$SECONDS
  "$bin/molecule" test -s "$name"
  echo "== molecule scenario $name passed in $((SECONDS - started)) s"
done
