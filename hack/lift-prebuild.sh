#!/usr/bin/env bash
# A tier about to wait for a build lock the background builds (hack/prebuild.sh) hold lifts them
# to normal priority: they run niced so the tiers keep their timing, but a tier blocked on one of
# them is idle, and a niced build it waits for is the run's critical path (cold, the control
# plane's Go build took 23 min niced against ~6 min alone). prebuild.sh lowers itself again
# before its next build. A lock another tier holds lifts nothing: the background builds would then
# run at normal priority beside tiers that are not waiting. hack/with-prebuild.sh exports
# PDMTP_PREBUILD_PID; without it (a tier run on its own) this does nothing. Always exits 0.
#
#   hack/lift-prebuild.sh LOCKFILE WHAT    (WHAT: the build waited for, for the message)
set -uo pipefail
lock=${1:-} what=${2:-a build}
pid=${PDMTP_PREBUILD_PID:-}
[[ -n $pid && -e $lock ]] || exit 0
# The PID must still be the prebuild's (a PID is reused once its process is gone).
tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'prebuild\.sh' || exit 0

session_of() { # pid: its session ID (stat's 6th field; the command name may hold spaces)
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  read -r _ _ _ session _ <<<"${stat##*) }"
  echo "$session"
}

# Held (or about to be) by the prebuild: a process of its session has the lock file open.
lock=$(realpath "$lock")
holds=0
while read -r fd; do
  proc=${fd#/proc/}
  proc=${proc%%/*}
  if [[ $(session_of "$proc") == "$pid" ]]; then
    holds=1
    break
  fi
done < <(find /proc/[0-9]*/fd -maxdepth 1 -lname "$lock" 2>/dev/null)
((holds)) || exit 0

# One autogroup per session: its nice weighs the whole prebuild against the tiers.
if echo 0 >"/proc/$pid/autogroup" 2>/dev/null; then
  echo "waiting for $what, which the background builds hold; they now run at normal priority" >&2
fi
exit 0
