#!/usr/bin/env bash
# ansible-test sanity on the built collection (design §9): build the tarball, install it into a
# temporary ansible_collections tree, run the sanity tests there with this venv's Python.
#   tests/sanity.sh [ANSIBLE-TEST OPTIONS]   e.g. --prime-venvs: build the per-test venvs only (cold: about
#   90 s from the package index; cached in ~/.ansible/test by their requirements), what make test starts in
#   the background with the other cold builds. One at a time: a second run waits for the first.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:-$repo/.venv}
py=$("$venv/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
pip_version=$("$venv/bin/python" - <<'PY'
import re, ansible_test, pathlib
src = pathlib.Path(ansible_test.__file__).parent / "_internal" / "python_requirements.py"
print(re.search(r"pip='([0-9.]+)'", src.read_text()).group(1))
PY
)
# ansible-test fetches get-pip.py from a host this machine cannot reach: give it our stand-in.
cache=~/.ansible/test/cache
mkdir -p "$cache"
exec 9>"$cache/.fleetops-sanity.lock"
flock 9
cp "$repo/tests/get_pip_stub.py" "$cache/get_pip_${pip_version//./_}.py"

work=$(mktemp -d /tmp/fleetops-sanity.XXXXXX)
trap 'rm -rf "$work"' EXIT
"$venv/bin/ansible-galaxy" collection build "$repo" --output-path "$work" --force >/dev/null
"$venv/bin/ansible-galaxy" collection install "$work"/fleetops-node-*.tar.gz -p "$work/col" --force >/dev/null
cd "$work/col/ansible_collections/fleetops/node"
# ansible-test wants a git repo or it scans everything; an install has no .git: that is what we want.
PATH="$venv/bin:$PATH" "$venv/bin/ansible-test" sanity --local --python "$py" --color no "$@"
