# shellcheck shell=bash disable=SC2034,SC2154 # sets variables for, and reads `name` from, its caller
# Sourced by hack/engine-venv.sh and hack/pd-cpu-venv.sh: what their venvs share, and the pins of
# versions.env (hack/versions.sh).
#
# Each venv lives outside the repo (PDMTP_CACHE_DIR, default ~/.cache/pdmtp), named by a hash of
# every pin it installs, so fresh clones reuse it and a pin change builds a new one. pdmtp_engine
# is NOT installed into it: the tiers put images/engine on PYTHONPATH, so a cached venv never
# points into a stale clone. The caller sets `name` (for logs, the lock and the directory) before
# sourcing; the functions report on stderr and leave stdout to the venv's path.

# shellcheck source=hack/versions.sh
source "$(dirname "${BASH_SOURCE[0]}")/versions.sh"
cache_dir="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
# The image pins the CUDA build of the Mooncake transfer engine; the CPU tiers take the
# "-non-cuda" build of the very same version.
mooncake_pin="mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION"

log() { echo "$name: $*" >&2; }

# ensure_debs PACKAGE...: apt-get installs those not installed (mooncake's engine links
# libibverbs.so.1 even for TCP).
ensure_debs() {
  local missing=() pkg sudo=""
  for pkg in "$@"; do
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

# The venvs' installs compile every module's bytecode (uv's default does not, and this machine's
# environment sets PYTHONDONTWRITEBYTECODE, so nothing writes it later): without it, each engine
# process compiles vLLM's sources afresh, ~50 s of CPU per start (`import vllm` 78 s -> 28 s).
# Part of the hash, so that venvs built before it are rebuilt.
uv_install=(pip install --compile-bytecode)

# venv_begin PINS FILE...: sets venv to the cached venv for these pins (a line naming them, and
# the requirements files). When it is complete, prints its path and exits; otherwise (under a
# lock, so concurrent runs build it once) removes this venv's superseded builds (other hashes:
# several GB each), creates it empty with uv in it and returns for the caller to install into it
# (`"$venv/bin/uv" "${uv_install[@]}" ...`) and call venv_done.
venv_begin() {
  local pin_hash
  pin_hash="$({ echo "$1 ${uv_install[*]}"; cat "${@:2}"; } | sha256sum | cut -c1-12)"
  venv="$cache_dir/$name-$pin_hash"
  if [[ -f "$venv/.complete" ]]; then
    echo "$venv"
    exit 0
  fi
  mkdir -p "$cache_dir"
  exec 9>"$cache_dir/$name.lock"
  flock 9
  # Another process may have finished the build while this one waited for the lock.
  if [[ -f "$venv/.complete" ]]; then
    echo "$venv"
    exit 0
  fi
  started=$SECONDS
  local stale
  for stale in "$cache_dir/$name"-????????????; do
    [[ -d $stale && $stale != "$venv" ]] || continue
    log "removing the superseded $stale"
    rm -rf "$stale"
  done
  rm -rf "$venv"
  local python="${PDMTP_ENGINE_PYTHON:-python3}"
  log "creating $venv with $($python --version 2>&1)"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$UV_VERSION" >&2
}

# venv_done SUMMARY: marks the venv usable (the caller has proven it imports) and prints its path.
venv_done() {
  echo "$1 built in $((SECONDS - started))s" >"$venv/.complete"
  log "built in $((SECONDS - started))s"
  echo "$venv"
}
