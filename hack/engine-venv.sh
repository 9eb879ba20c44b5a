#!/usr/bin/env bash
# Build (once) the engine test venv: the pinned vLLM from PyPI (its default torch runs on CPU),
# the CPU build of the Mooncake transfer engine at the version the image pins, and the test-only
# tools. Prints the venv path on stdout; progress goes to stderr.
# Cached by a hash of every pin (hack/cached-venv.sh).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image_requirements="$repo_root/images/engine/requirements.txt"
test_requirements="$repo_root/tests/engine/requirements.txt"
dockerfile="$repo_root/images/engine/Dockerfile"
name=engine-venv
# shellcheck source=hack/cached-venv.sh
source "$repo_root/hack/cached-venv.sh"

# One source of truth for the vLLM version: the image's base tag.
vllm_version="$(sed -n 's/^ARG VLLM_VERSION=\([0-9][0-9.]*\)$/\1/p' "$dockerfile")"
if [[ -z "$vllm_version" ]]; then
  log "no 'ARG VLLM_VERSION=X.Y.Z' line in $dockerfile"
  exit 1
fi
image_pins "$image_requirements"
# RDMA also needs the providers.
ensure_debs libibverbs1 ibverbs-providers
venv_begin "vllm==$vllm_version uv==$uv_version" "$image_requirements" "$test_requirements"

# uv downloads in parallel; the torch + CUDA runtime wheels vLLM pulls are several GB.
# shellcheck disable=SC2086
"$venv/bin/uv" pip install --python "$venv/bin/python" --quiet \
  "vllm==$vllm_version" \
  "mooncake-transfer-engine-non-cuda==$mooncake_version" \
  $other_image_pins \
  -r "$test_requirements" >&2

# Prove the result imports before marking it usable.
"$venv/bin/python" -c 'import vllm, mooncake.engine, pytest; print(vllm.__version__)' >&2
venv_done "$vllm_version $mooncake_version"
