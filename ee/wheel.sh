#!/usr/bin/env bash
# The controller package `fleetops` as a wheel, for the execution environment: AWX runs playbooks, and
# playbooks/remediate_auto.yml runs `fleetops remediate auto` inside the EE (execution-environment.yml
# installs this wheel; its dependencies, pyproject's, come from PyPI in the build).
#   ee/wheel.sh OUTDIR [PYTHON]   writes OUTDIR/fleetops-<version>-py3-none-any.whl (OUTDIR is emptied first)
# Built as `make dist` builds it (python -m build: the sdist, then the wheel from that sdist unpacked in a
# temporary folder, so nothing a setuptools build/ folder keeps between builds can enter it): the package,
# its default policy and the collection under ansible_collections/fleetops/node (setup.py).
# PYTHON (default python3) must have build, setuptools >= 77, PyYAML and ansible-core: no build
# isolation, nothing fetched.
# Prints the wheel's path.
set -euo pipefail

out=${1:?usage: ee/wheel.sh OUTDIR [PYTHON]}
py=${2:-python3}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m build --no-isolation --outdir "$tmp" "$repo" >"$tmp/log" 2>&1 || { cat "$tmp/log" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out"
mv "$tmp"/fleetops-*.whl "$out"/
shopt -s nullglob
wheels=("$out"/fleetops-*.whl)
if [[ ${#wheels[@]} -ne 1 ]]; then
  echo "error: expected one fleetops wheel in $out, found ${#wheels[@]}" >&2
  exit 1
fi
echo "${wheels[0]}"
