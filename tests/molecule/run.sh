#!/usr/bin/env bash
# Run every molecule scenario under tests/molecule on lab hosts (root: the lab boots nspawn hosts).
# Boots two lab hosts, runs the scenarios, and tears the lab down again.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin="$repo/.venv/bin"
export PATH="$bin:$PATH"
"$bin/fleetops" lab up 2 >/dev/null
trap '"$bin/fleetops" lab down >/dev/null' EXIT
FLEETOPS_LAB_INVENTORY=$("$bin/fleetops" lab inventory)
export FLEETOPS_LAB_INVENTORY
export FLEETOPS_COLLECTIONS_PATH="$repo/collections"
export ANSIBLE_CONFIG="$repo/ansible.cfg"
cd "$repo/tests"
for scenario in molecule/*/molecule.yml; do
  name=$(basename "$(dirname "$scenario")")
  echo "== molecule scenario $name"
  "$bin/molecule" test -s "$name"
done
