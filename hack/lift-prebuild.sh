#!/usr/bin/env bash
# A tier about to wait for a build lock lifts the background builds (hack/prebuild.sh) to normal
# priority: they run niced so the tiers keep their timing, but a tier blocked on one of them is
# idle, and a niced build it waits for is the run's critical path (cold, the control plane's Go
# build took 23 min niced against ~6 min alone). prebuild.sh lowers itself again before its
# next build. hack/with-prebuild.sh exports PDMTP_PREBUILD_PID; without it (a tier run on its own)
# this does nothing.
#
#   hack/lift-prebuild.sh WHAT    (WHAT: the build waited for, for the message)
set -uo pipefail
pid=${PDMTP_PREBUILD_PID:-}
[[ -n $pid ]] || exit 0
# The PID must still be the prebuild's (a PID is reused once its process is gone).
tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q 'prebuild\.sh' || exit 0
# One autogroup per session: its nice weighs the whole prebuild against the tiers.
if echo 0 >"/proc/$pid/autogroup" 2>/dev/null; then
  echo "waiting for ${1:-a build} held by another build; the background builds now run at normal priority" >&2
fi
exit 0
