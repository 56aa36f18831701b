#!/usr/bin/env bash
# What an execution environment build needs to reach PyPI the way this host does, written into
# OUTDIR for ansible-builder's additional_build_files (execution-environment.yml copies it to
# /etc/pip.conf and /etc/fleetops-ee/ca-bundle.crt in the image, before anything is pip-installed):
#   OUTDIR/pip.conf       the host's pip settings that mean something inside a container: index-url,
#                         extra-index-url and find-links only when not file:// or a local path,
#                         trusted-host, proxy, timeouts and retries; `cert` points at the bundle below.
#   OUTDIR/ca-bundle.crt  the CA bundle the host's pip trusts (pip's `cert`, else REQUESTS_CA_BUNDLE,
#                         SSL_CERT_FILE, else /etc/ssl/certs/ca-certificates.crt): on a network behind
#                         a TLS-intercepting proxy it holds the proxy's CA. Empty when there is none.
# Settings come from `pip config list` (files and PIP_* variables). HTTP(S)_PROXY variables need no
# copy: podman build passes them to every RUN step.
#   ee/trust.sh OUTDIR [PYTHON]     PYTHON: whose pip to ask (default python3)
set -euo pipefail

out=${1:?usage: ee/trust.sh OUTDIR [PYTHON]}
py=${2:-python3}
mkdir -p "$out"

keep=(index-url extra-index-url find-links trusted-host proxy timeout default-timeout retries)
declare -A conf=()
cert=""
config=$("$py" -m pip config list 2>/dev/null || true)
while IFS= read -r line; do
  [[ "$line" == *=* ]] || continue
  key=${line%%=*}
  key=${key#*.}
  value=${line#*=}
  value=${value#\'}
  value=${value%\'}
  if [[ "$key" == cert ]]; then
    cert=$value
    continue
  fi
  for k in "${keep[@]}"; do
    [[ "$key" == "$k" ]] || continue
    if [[ "$key" == *index-url || "$key" == find-links ]]; then
      urls=()
      for u in $value; do
        [[ "$u" == http://* || "$u" == https://* ]] && urls+=("$u")
      done
      ((${#urls[@]})) || continue
      value=${urls[*]}
    fi
    conf[$key]=$value
  done
done <<<"$config"

for candidate in "$cert" "${REQUESTS_CA_BUNDLE:-}" "${SSL_CERT_FILE:-}" /etc/ssl/certs/ca-certificates.crt; do
  if [[ -n "$candidate" && -f "$candidate" ]]; then
    cert=$candidate
    break
  fi
  cert=""
done

: >"$out/ca-bundle.crt"
{
  echo "# written by ee/trust.sh from this build host's pip configuration"
  echo "[global]"
  if [[ -n "$cert" ]]; then
    cp "$cert" "$out/ca-bundle.crt"
    echo "cert = /etc/fleetops-ee/ca-bundle.crt"
  fi
  for k in "${keep[@]}"; do
    [[ -n "${conf[$k]:-}" ]] && echo "$k = ${conf[$k]}"
  done
  true
} >"$out/pip.conf"
echo "== ee/trust.sh: $out/pip.conf ($(grep -vc '^#' "$out/pip.conf") lines), CA bundle from ${cert:-nowhere}" >&2
