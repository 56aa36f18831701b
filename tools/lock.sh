#!/usr/bin/env bash
# `make lock`: refresh constraints.txt, the lock that `make venv` and `make ee` install from, so that a
# fresh machine builds and tests exactly what a warm one did. The wheel's own dependency ranges
# (pyproject.toml) stay ranges for users; this file pins the development venv and the EE.
#   tools/lock.sh PYTHON
# Resolves pyproject's dependencies with the test extra and the lab's from the package index in a
# throwaway venv, with no constraint of ours, and writes every package it installed, pinned.
# Refresh on purpose, then run `make test` on the new lock before committing it (the EE is rebuilt:
# the lock is one of its inputs).
set -euo pipefail
py=${1:?usage: tools/lock.sh PYTHON}
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install -q --upgrade pip
# PIP_CONSTRAINT: none of ours (a pip configuration may name a machine-wide constraints file: kept)
"$tmp/venv/bin/python" -m pip install -q "${repo}[test]" "$repo/lab"
{
  echo "# The lock: every package of the development venv and the EE, pinned (make lock wrote it on $(date -u +%F)"
  echo "# with $("$tmp/venv/bin/python" -V); Python >= 3.12). make venv and make ee install with -c constraints.txt."
  echo "# Do not edit by hand: run make lock, then make test."
  "$tmp/venv/bin/python" -m pip freeze --exclude-editable | grep -viE '^(fleetops|fleetops-lab|fleetops_lab)[=@ ]' | LC_ALL=C sort -f
} >"$repo/constraints.txt.new"
mv "$repo/constraints.txt.new" "$repo/constraints.txt"
echo "== constraints.txt: $(grep -vc '^#' "$repo/constraints.txt") packages pinned"
