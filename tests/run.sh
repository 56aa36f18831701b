#!/usr/bin/env bash
# `make test`: every suite, each run even when an earlier one failed (one CI run reports every failure),
# then a table of what each stage took (where CI's time goes, in CI's log).
#   - in the background from the start, each cached by its inputs and locked against a second builder
#     (a test that needs one waits on its lock): the lab's rootfs, VM image and UCX wheels
#     (`fleetops-lab prepare --vm --ucx`), the execution environment (`make ee`) and ansible-test
#     sanity's per-test venvs (`tests/sanity.sh --prime-venvs`);
#   - lint, then the unit and package suites (2 xdist workers, a whole file per worker) with sanity and the
#     site (make docs: a warning fails) beside them (they use less than a core: their logs and rows are
#     printed once the unit suites are done);
#   - the integration suite (tests/integration/run.sh: labs side by side, then the exclusive lane);
#   - the molecule scenarios (tests/molecule/run.sh).
# Needs root (the lab) and the Debian packages of tools/debian-deps.sh --ee --vm.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${VENV:-$repo/.venv}/bin
export PATH="$bin:$PATH"
cd "$repo" || exit 2
logs=$(mktemp -d /tmp/fleetops-test.XXXXXX)
rc=0 table=() started=$SECONDS

stage() {  # stage NAME COMMAND...: run it, time it, remember a failure
  local name=$1 began=$SECONDS code=0
  shift
  echo "== $name"
  "$@" || code=$?
  table+=("$(printf '%-12s %5d s  %s' "$name" $((SECONDS - began)) "$([ $code -eq 0 ] && echo ok || echo "FAILED ($code)")")")
  [ $code -eq 0 ] || rc=1
}

background() {  # background NAME COMMAND...: started now, its log in $logs/NAME.log
  local name=$1
  shift
  ("$@" >"$logs/$name.log" 2>&1; echo $? >"$logs/$name.rc") &
  echo "== $name: building in the background (log: $logs/$name.log)"
}

declare -A beside_pids
beside() {  # beside NAME COMMAND...: a stage started now, beside the stages after it; `ended NAME` reports it
  local name=$1
  shift
  (began=$SECONDS && "$@" >"$logs/$name.log" 2>&1; echo "$? $((SECONDS - began))" >"$logs/$name.rc") &
  beside_pids[$name]=$!
  echo "== $name: beside the next stage (log: $logs/$name.log)"
}

ended() {  # ended NAME: wait for a stage started by `beside`, print its log, add its row as `stage` does
  local name=$1 code="?" seconds=0
  wait "${beside_pids[$name]}"
  read -r code seconds <"$logs/$name.rc" || true
  echo "== $name (ran beside the stage before)"
  cat "$logs/$name.log"
  table+=("$(printf '%-12s %5d s  %s' "$name" "$seconds" "$([ "$code" = 0 ] && echo ok || echo "FAILED ($code)")")")
  [ "$code" = 0 ] || rc=1
}

joined() {  # joined NAME: wait for a background build; its failure fails the run, with its log's tail
  local name=$1 code
  code=$(cat "$logs/$name.rc" 2>/dev/null || echo "?")
  if [ "$code" != 0 ]; then
    echo "== $name (background) FAILED ($code):" >&2
    tail -20 "$logs/$name.log" >&2
    rc=1
  fi
  table+=("$(printf '%-12s %7s  %s' "$name" "(bg)" "$([ "$code" = 0 ] && echo ok || echo "FAILED ($code)")")")
}

background prepare "$bin/fleetops-lab" prepare --vm --ucx
background ee make --no-print-directory ee
background sanity-venvs bash tests/sanity.sh --prime-venvs  # the sanity stage waits on its lock
stage lint make --no-print-directory lint
beside sanity make --no-print-directory sanity
beside docs make --no-print-directory docs
stage unit "$bin/pytest" -q --durations=20 -n 2 --dist loadfile tests/unit tests/fleetops
ended sanity
ended docs
# shellcheck disable=SC2317  # called through stage
integration() {  # the integration suite, its summary kept for the end of the log (the trend)
  bash tests/integration/run.sh 2>&1 | tee "$logs/integration.log"
  return "${PIPESTATUS[0]}"
}
stage integration integration  # a test that needs a build still running waits on its lock
wait
joined prepare
joined ee
joined sanity-venvs
stage molecule bash tests/molecule/run.sh

echo "== make test: $((SECONDS - started)) s"
printf '%s\n' "${table[@]}"
grep -E '^integration( suite| CPU)?' "$logs/integration.log" 2>/dev/null || true
exit $rc
