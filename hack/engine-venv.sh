#!/usr/bin/env bash
# Build (once) the engine test venv: the image's vLLM from PyPI (its default torch runs on CPU),
# the CPU build of the image's Mooncake transfer engine (both pinned in versions.env), and the
# test-only tools. Prints the venv path on stdout; progress goes to stderr.
# Cached by a hash of every pin (hack/cached-venv.sh).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
test_requirements="$repo_root/tests/engine/requirements.txt"
name=engine-venv
# shellcheck source=hack/cached-venv.sh
source "$repo_root/hack/cached-venv.sh"

# RDMA also needs the providers.
ensure_debs libibverbs1 ibverbs-providers
venv_begin "vllm==$VLLM_VERSION $mooncake_pin uv==$UV_VERSION" "$test_requirements"

# uv downloads in parallel; the torch + CUDA runtime wheels vLLM pulls are several GB.
"$venv/bin/uv" "${uv_install[@]}" --python "$venv/bin/python" --quiet \
  "vllm==$VLLM_VERSION" "$mooncake_pin" -r "$test_requirements" >&2

# Prove the result imports before marking it usable.
"$venv/bin/python" -c 'import vllm, mooncake.engine, pytest; print(vllm.__version__)' >&2
venv_done "$VLLM_VERSION $MOONCAKE_VERSION"
