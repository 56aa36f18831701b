#!/usr/bin/env bash
# The controller package `fleetops` as a wheel, for the execution environment: AWX runs playbooks, and
# playbooks/remediate_auto.yml runs `fleetops remediate auto` inside the EE (execution-environment.yml
# installs this wheel; its dependencies, pyproject's, come from PyPI in the build).
#   ee/wheel.sh OUTDIR [PYTHON]   writes OUTDIR/fleetops-<version>-py3-none-any.whl (OUTDIR is emptied first)
# Built from a copy of this checkout's pyproject.toml, README.md (the package's long description) and
# src/fleetops/, without __pycache__: setuptools builds in the source tree's build/ and keeps files there
# between builds (a module deleted since would still be packed), so the copy starts clean every time.
# PYTHON (default python3) must have pip, setuptools >= 77 and wheel: no build isolation, nothing fetched.
# Prints the wheel's path.
set -euo pipefail

out=${1:?usage: ee/wheel.sh OUTDIR [PYTHON]}
py=${2:-python3}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
mkdir -p "$src/src"
cp "$repo/pyproject.toml" "$repo/README.md" "$src/"
cp -R "$repo/src/fleetops" "$src/src/fleetops"
find "$src" -name __pycache__ -type d -prune -exec rm -rf {} +
find "$src" -name '*.egg-info' -type d -prune -exec rm -rf {} +

rm -rf "$out"
mkdir -p "$out"
"$py" -m pip wheel --no-deps --no-build-isolation --no-cache-dir -q -w "$out" "$src" >&2
shopt -s nullglob
wheels=("$out"/fleetops-*.whl)
if [[ ${#wheels[@]} -ne 1 ]]; then
  echo "error: expected one fleetops wheel in $out, found ${#wheels[@]}" >&2
  exit 1
fi
echo "${wheels[0]}"
