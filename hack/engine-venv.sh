#!/usr/bin/env bash
# Build (once) the engine test venv: the pinned vLLM from PyPI (its default torch runs on CPU),
# the CPU build of the Mooncake transfer engine at the version the image pins, and the test-only
# tools. Prints the venv path on stdout; progress goes to stderr.
#
# The venv lives outside the repo, named by a hash of every pin, so CI's fresh clones reuse it and
# a pin change builds a new one. pdmtp_engine itself is NOT installed into it: the tests put
# images/engine on PYTHONPATH, so a cached venv never points into a stale clone.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image_requirements="$repo_root/images/engine/requirements.txt"
test_requirements="$repo_root/tests/engine/requirements.txt"
dockerfile="$repo_root/images/engine/Dockerfile"
cache_dir="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
uv_version="0.13.8"

log() { echo "engine-venv: $*" >&2; }

# One source of truth for the vLLM version: the image's base tag.
vllm_version="$(sed -n 's/^ARG VLLM_VERSION=\([0-9][0-9.]*\)$/\1/p' "$dockerfile")"
if [[ -z "$vllm_version" ]]; then
  log "no 'ARG VLLM_VERSION=X.Y.Z' line in $dockerfile"
  exit 1
fi

# The image pins the CUDA build of the transfer engine; the CPU tier needs the "-non-cuda" build
# of the very same version.
mooncake_pin="$(grep -E '^mooncake-transfer-engine(-cuda[0-9]+)?==' "$image_requirements" || true)"
if [[ -z "$mooncake_pin" ]]; then
  log "no mooncake-transfer-engine pin in $image_requirements"
  exit 1
fi
mooncake_version="${mooncake_pin#*==}"
other_image_pins="$(grep -vE '^\s*(#|$)' "$image_requirements" | grep -vE '^mooncake-transfer-engine' || true)"

pin_hash="$(
  {
    echo "vllm==$vllm_version uv==$uv_version"
    cat "$image_requirements" "$test_requirements"
  } | sha256sum | cut -c1-12
)"
venv="$cache_dir/engine-venv-$pin_hash"

ensure_ibverbs() {
  # mooncake's engine links libibverbs.so.1 even for TCP; RDMA also needs the providers.
  local missing=() pkg sudo=""
  for pkg in libibverbs1 ibverbs-providers; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$pkg")
  done
  if ((${#missing[@]} == 0)); then return 0; fi
  if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
  log "installing ${missing[*]} with apt-get"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >&2
}

ensure_ibverbs

if [[ -f "$venv/.complete" ]]; then
  echo "$venv"
  exit 0
fi

mkdir -p "$cache_dir"
exec 9>"$cache_dir/engine-venv.lock"
flock 9
# Another process may have finished the build while this one waited for the lock.
if [[ -f "$venv/.complete" ]]; then
  echo "$venv"
  exit 0
fi

started=$SECONDS
rm -rf "$venv"
python="${PDMTP_ENGINE_PYTHON:-python3}"
log "creating $venv with $($python --version 2>&1)"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$uv_version" >&2

# uv downloads in parallel; the torch + CUDA runtime wheels vLLM pulls are several GB.
# shellcheck disable=SC2086
"$venv/bin/uv" pip install --python "$venv/bin/python" --quiet \
  "vllm==$vllm_version" \
  "mooncake-transfer-engine-non-cuda==$mooncake_version" \
  $other_image_pins \
  -r "$test_requirements" >&2

# Prove the result imports before marking it usable.
"$venv/bin/python" -c 'import vllm, mooncake.engine, pytest; print(vllm.__version__)' >&2
echo "$vllm_version $mooncake_version built in $((SECONDS - started))s" >"$venv/.complete"
log "built in $((SECONDS - started))s"
echo "$venv"
