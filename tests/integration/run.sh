#!/usr/bin/env bash
# `make integration`: the integration suite in two lanes, then the check that every listed test ran.
#   1. the parallel lane: every test not marked `exclusive`, on FLEETOPS_TEST_WORKERS (default 3) xdist
#      workers, each with a lab of its own (gw0, gw1, ...: conftest.py), whole files per worker, the
#      longest first;
#   2. the exclusive lane: the tests that read or change machine-wide kernel state (host-wide memcg
#      counts, drop_caches, timing-sensitive rates), one after another with nothing beside them, on the
#      default lab;
#   3. ids.py: every test of ids.txt ran, none skipped under CI=true; the suite's count and wall time,
#      and where its CPU went (this machine's busy share, the files that took most).
# A run killed before (SIGKILL included) leaves labs behind: `fleetops-lab down --all` clears them
# first, and again at the end. Extra arguments go to both lanes' pytest (then the list is not checked).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
bin=${VENV:-$repo/.venv}/bin
export PATH="$bin:$PATH"
cd "$repo"
workers=${FLEETOPS_TEST_WORKERS:-3}
record=$(mktemp /tmp/fleetops-integration.XXXXXX)
cpu_since=$(mktemp /tmp/fleetops-integration-cpu.XXXXXX)
trap 'rm -f "$record" "$cpu_since"; "$bin/fleetops-lab" down --all -q || true' EXIT
"$bin/fleetops-lab" down --all -q || exit 2

lane() {  # lane NAME PYTEST-ARGS...: pytest's exit 5 (nothing selected) is no failure
  local name=$1 started=$SECONDS code=0
  shift
  FLEETOPS_TEST_RECORD=$record "$bin/pytest" -q "$@" || code=$?
  echo "== integration: $name lane in $((SECONDS - started)) s (pytest exit $code)"
  [ "$code" -eq 0 ] || [ "$code" -eq 5 ]
}

started=$SECONDS rc=0
head -1 /proc/stat >"$cpu_since"  # where the suite's CPU goes, printed at the end (ids.py)
parallel=(-n "$workers" --dist loadfile --no-loadscope-reorder)
[ "$workers" -gt 0 ] || parallel=()
lane parallel --durations=30 "${parallel[@]}" -m "not exclusive" tests/integration "$@" || rc=1
lane exclusive --durations=10 -m exclusive tests/integration "$@" || rc=1
if [ $# -eq 0 ]; then
  "$bin/python" -m tests.integration.ids check "$record" --seconds $((SECONDS - started)) \
    --cpu-since "$cpu_since" || rc=1
fi
exit $rc
