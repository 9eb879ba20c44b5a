#!/usr/bin/env bash
# Run a command (`make test`'s tiers) with hack/prebuild.sh warming the build caches beside it,
# niced. Its log goes to the terminal at the end (and when the command fails). No process of it
# outlives this script.
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
echo "---- background builds (hack/prebuild.sh) ----"
cat "$log"
rm -f "$log"
echo "---- $* : exit $rc after $((SECONDS - start)) s ----"
exit "$rc"
