#!/usr/bin/env bash
# `make ee`: build the execution environment localhost/fleetops-ee:latest with ansible-builder and
# podman, from the base image ee/base-image.sh makes locally (no registry).
#   1. the base image (debootstrap of Debian trixie, imported once per recipe)
#   2. the collection tarball build/fleetops-node-<version>.tar.gz from this checkout
#   3. build/ee-wheel/fleetops-<version>-py3-none-any.whl: the controller package from this checkout
#      (ee/wheel.sh), so that `fleetops` runs in the EE (playbooks/remediate_auto.yml)
#   4. build/ee-trust/: the host's pip settings and CA bundle (ee/trust.sh)
#   5. ansible-builder build, skipped when the image already carries the label
#      org.fleetops.ee.inputs=<hash of every input above>
# Podman runs with ee/containers.conf (runc, lowered ulimits: see there) unless CONTAINERS_CONF is set;
# the build's RUN steps use the host network (PyPI, the Debian mirror).
#   PY=.venv/bin/python  the Python whose ansible-galaxy / ansible-builder / pip config are used
#   FLEETOPS_EE_FORCE=1  build even when the inputs are unchanged
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
cd "$repo"
export CONTAINERS_CONF=${CONTAINERS_CONF:-$here/containers.conf}
py=${PY:-$repo/.venv/bin/python}
bin=$(dirname "$py")
image=localhost/fleetops-ee:latest
label=org.fleetops.ee.inputs

for tool in podman debootstrap; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "error: $tool not found (\`make ee\` installs it: tools/debian-deps.sh --ee)" >&2
    exit 2
  fi
done

# One build at a time on this machine (CI's background build and test_ee's own call): the image is
# machine-wide and build/ is the checkout's. The second builder waits, then finds the image current.
mkdir -p /run/fleetops
exec 9>/run/fleetops/ee-build.lock
flock 9

start=$SECONDS
base=$("$here/base-image.sh")
base_id=$(podman image inspect --format '{{.Id}}' "$base")

rm -f build/fleetops-node-*.tar.gz
"$bin/ansible-galaxy" collection build . --output-path build --force >/dev/null
tarball=$(ls build/fleetops-node-*.tar.gz)
wheel=$("$here/wheel.sh" build/ee-wheel "$py")
"$here/trust.sh" build/ee-trust "$py"

# The tarball and the wheel themselves differ on every build (mtimes); the tarball's MANIFEST.json and
# the wheel's RECORD name every file's sha256 (the wheel's: its modules, the default policy, the
# collection's files, and its METADATA, which holds pyproject's dependencies and the README).
inputs=$(
  {
    sha256sum execution-environment.yml requirements.txt constraints.txt bindep.txt ee/pkgmgr build/ee-trust/*
    tar -xzOf "$tarball" MANIFEST.json | sha256sum
    "$py" -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); sys.stdout.buffer.write(z.read(next(n for n in z.namelist() if n.endswith(".dist-info/RECORD"))))' "$wheel" | sha256sum
    echo "wheel $(basename "$wheel")"
    echo "base $base $base_id"
    "$bin/ansible-builder" --version
  } | sha256sum | cut -c1-16
)

current=$(podman image inspect --format "{{index .Labels \"$label\"}}" "$image" 2>/dev/null || true)
if [[ "$current" == "$inputs" && -z "${FLEETOPS_EE_FORCE:-}" ]]; then
  echo "== $image is up to date (inputs $inputs); nothing to build"
  exit 0
fi
built_after=$(date -u +%Y-%m-%dT%H:%M:%SZ)

echo "== ansible-builder build $image from $base (inputs $inputs; a cold build takes a few minutes)"
"$bin/ansible-builder" build -f execution-environment.yml -c build/ee-context \
  --container-runtime podman -v 2 \
  --build-arg EE_BASE_IMAGE="$base" \
  --extra-build-cli-args "--network host --label $label=$inputs"

# What earlier builds of this image left (their untagged stages): this build's own stay, as the layer
# cache of the next one.
podman image prune -f --filter label=$label --filter until="$built_after" >/dev/null
size=$(podman image inspect --format '{{.Size}}' "$image")
echo "== built $image in $((SECONDS - start)) s ($((size / 1000000)) MB)"
