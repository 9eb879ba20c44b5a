#!/usr/bin/env bash
# Run two lanes of tiers side by side on a machine of few cores: the first argument (a command
# line) in the background, niced, and the rest of the arguments in the foreground.
#
#   hack/beside.sh 'make test-engine test-pd-cpu' make test-cluster test-images
#
# `make test` runs the tiers that compute (vLLM on CPU) beside the tiers that mostly wait (on
# controllers, on podman): niced in an autogroup of their own, the computing ones take only the
# CPU the waiting ones leave idle, so the waiting ones keep their timing. The background lane's
# output streams as it comes, each line prefixed `[beside] `, so that nothing is lost if a CI
# timeout kills the run. When the foreground is done, this waits for the background, then exits
# non-zero if either lane failed, and says which.
set -uo pipefail
cd "$(dirname "$0")/.."

if (($# < 2)); then
  echo "usage: $0 'BACKGROUND COMMAND' FOREGROUND COMMAND..." >&2
  exit 2
fi
background=$1
shift

start=$SECONDS
session=$(mktemp)
(
  # setsid: a session, hence an autogroup, of its own (the kernel shares CPU between autogroups
  # before it looks at a process's nice value); -w: its exit status is the command's.
  setsid -w nice -n 19 sh -c 'echo $$ >"$1"; echo 19 >/proc/self/autogroup 2>/dev/null; exec sh -c "$0"' \
    "$background" "$session" 2>&1 | sed -u 's/^/[beside] /'
  exit "${PIPESTATUS[0]}"
) &
lane=$!
# An interrupt reaches the foreground's process group only; the background lane is a session.
trap 'pkill -TERM -s "$(cat "$session")" 2>/dev/null; rm -f "$session"; exit 130' INT TERM

"$@"
foreground_rc=$?
foreground_seconds=$((SECONDS - start))

wait "$lane"
background_rc=$?
rm -f "$session"
echo "---- beside: '$*' exit $foreground_rc after $foreground_seconds s;" \
  "'$background' (niced) exit $background_rc after $((SECONDS - start)) s ----"
if ((foreground_rc != 0)); then exit "$foreground_rc"; fi
exit "$background_rc"
