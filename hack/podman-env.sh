#!/usr/bin/env bash
# podman for this project: install it (once) and point it at a project-local containers.conf.
#
#   source hack/podman-env.sh          # installs if needed, exports CONTAINERS_CONF
#   eval "$(hack/podman-env.sh)"       # same, from a script that should not source it
#   hack/podman-env.sh --check         # also runs a throwaway container to prove it works
#
# Why each piece (Debian 12 sandboxes: cgroup v1 hybrid, root without CAP_SYS_RESOURCE):
# - runc, not crun: crun refuses "cgroups in hybrid mode not supported".
# - default_ulimits = []: podman's default nofile/nproc ulimits fail with "setrlimit ...
#   operation not permitted" where CAP_SYS_RESOURCE is missing.
# - mmdebstrap: no registry is reachable, so base images are built from Debian packages
#   (hack/lib/build_images.py).
# The file lives in the cache, never in /etc: the machine's own podman setup stays untouched.
# Idempotent: a second run only re-exports the variables. Progress goes to stderr.

_pdmtp_podman_env() {
  local cache_dir="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
  local conf_dir="$cache_dir/containers"
  local conf="$conf_dir/containers.conf"
  local missing=() cmd sudo=""

  for cmd in podman runc mmdebstrap; do
    command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
  done
  if ((${#missing[@]} > 0)); then
    if [[ "$(id -u)" != 0 ]]; then sudo="sudo"; fi
    echo "podman-env: installing podman runc mmdebstrap with apt-get (missing: ${missing[*]})" >&2
    $sudo apt-get update -qq >&2 || return 1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq podman runc mmdebstrap >/dev/null ||
      return 1
  fi

  mkdir -p "$conf_dir" || return 1
  # Rewritten every time (cheap), so an edit here reaches every existing cache.
  cat >"$conf.tmp" <<EOF
# Written by hack/podman-env.sh; used through CONTAINERS_CONF. Do not edit: rerun the script.
[containers]
default_ulimits = []

[engine]
runtime = "runc"
EOF
  mv "$conf.tmp" "$conf" || return 1
  export CONTAINERS_CONF="$conf"
}

_pdmtp_podman_check() {
  # The smallest proof that containers run, with no base image: import a rootfs holding only
  # the host's /bin/true and its libc, and run it without a network.
  local dir
  dir="$(mktemp -d)" || return 1
  mkdir -p "$dir/root/bin" "$dir/root/lib64" "$dir/root/lib/x86_64-linux-gnu"
  cp /bin/true "$dir/root/bin/true"
  cp /lib64/ld-linux-x86-64.so.2 "$dir/root/lib64/"
  cp /lib/x86_64-linux-gnu/libc.so.6 "$dir/root/lib/x86_64-linux-gnu/"
  tar -C "$dir/root" -cf "$dir/rootfs.tar" . &&
    podman import --quiet "$dir/rootfs.tar" localhost/pdmtp-podman-check:latest >/dev/null &&
    podman run --rm --network none localhost/pdmtp-podman-check:latest /bin/true
  local rc=$?
  podman rmi --force localhost/pdmtp-podman-check:latest >/dev/null 2>&1
  rm -rf "$dir"
  if ((rc == 0)); then
    echo "podman-env: a container ran with $(podman --version) and $(runc --version | head -1)" >&2
  else
    echo "podman-env: podman could not run a container (exit $rc)" >&2
  fi
  return "$rc"
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  # Sourced: export into the caller's shell and leave its options alone.
  _pdmtp_podman_env
else
  set -euo pipefail
  _pdmtp_podman_env
  if [[ "${1:-}" == "--check" ]]; then
    _pdmtp_podman_check
  fi
  printf 'export CONTAINERS_CONF=%q\n' "$CONTAINERS_CONF"
fi
