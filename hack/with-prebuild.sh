#!/usr/bin/env bash
# Run a command (`make test`'s tiers) with hack/prebuild.sh warming the build caches beside it,
# niced. Its per-build times go to the terminal at the end (its whole log when a build failed).
# No process of it outlives this script.
#
#   hack/with-prebuild.sh COMMAND...
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
# setsid gives the builds a session, hence (with sched_autogroup_enabled) a CPU autogroup of their
# own, which the scheduler weighs against the tiers' as an equal whatever the processes' nice:
# measured, `nice -n 19` alone left the builds half of the 2 cores and the engine and CPU P/D tiers
# took 3-5x as long. Niced as an autogroup, they get ~1% against a busy tier.
setsid nice -n 19 ionice -c 3 \
  sh -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec hack/prebuild.sh' >"$log" 2>&1 &
prebuild=$!
start=$SECONDS
# A tier that waits for one of these builds lifts them to normal priority (hack/lift-prebuild.sh).
export PDMTP_PREBUILD_PID=$prebuild

"$@"
rc=$?

if kill -0 "$prebuild" 2>/dev/null; then
  if ((rc == 0)); then
    wait "$prebuild"
  else
    kill -- "-$prebuild" 2>/dev/null
    wait "$prebuild" 2>/dev/null
  fi
fi
# A line per build; the whole log only when a build failed. The tiers' own summary comes before
# this, and a CI record that keeps only the tail must still reach it.
echo "---- background builds (hack/prebuild.sh) ----"
if grep -q 'FAILED' "$log"; then cat "$log"; else grep '^prebuild: ' "$log"; fi
rm -f "$log"
echo "---- $* : exit $rc after $((SECONDS - start)) s ----"
exit "$rc"
