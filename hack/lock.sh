# shellcheck shell=bash
# One build at a time per cache entry: `make test` warms the caches in the background
# (hack/prebuild.sh) while the tiers run, and a tier that needs a build still in progress waits
# for it instead of building the same thing beside it. Source this at the top of a build script,
# before any `cd`, then call `run_locked NAME "$@"`: the script re-runs itself under
# flock(1) on $PDMTP_CACHE_DIR/locks/NAME.lock (flock's own descriptor is close-on-exec, so no
# daemon a build starts can keep the lock). A nested call of the same build does not re-lock.
_pdmtp_locked_script="$(realpath "${BASH_SOURCE[1]}")"

run_locked() {
  local name=$1
  shift
  local held="PDMTP_LOCK_HELD_${name//[^A-Za-z0-9]/_}"
  [[ -n ${!held:-} ]] && return 0
  local dir="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}/locks"
  mkdir -p "$dir"
  export "$held=1"
  # A lock the background builds (niced) hold lifts them while this waits for it.
  flock -n "$dir/$name.lock" true ||
    "$(dirname "${BASH_SOURCE[0]}")/lift-prebuild.sh" "$dir/$name.lock" "$name" || true
  exec flock "$dir/$name.lock" bash "$_pdmtp_locked_script" "$@"
}
