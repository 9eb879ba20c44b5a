#!/usr/bin/env bash
# Run a command (`make test`'s tiers) with hack/prebuild.sh warming the build caches beside it,
# niced. Its log goes to the terminal at the end (and when the command fails). No process of it
# outlives this script.
#
#   hack/with-prebuild.sh COMMAND...
set -uo pipefail
cd "$(dirname "$0")/.."
log=$(mktemp)
setsid nice -n 19 ionice -c 3 hack/prebuild.sh >"$log" 2>&1 &
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
