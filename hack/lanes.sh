#!/usr/bin/env bash
# Run lanes of tiers side by side on a machine of few cores. Each lane is a name and a command
# line; a lane after --niced runs niced, in a CPU autogroup of its own.
#
#   hack/lanes.sh cluster 'make test-cluster test-images' kind 'make kind-e2e' \
#     --niced engines 'make test-engine test-pd-cpu'
#
# `make test` runs the tiers that mostly wait (on controllers, on kind's nodes, on podman) side by
# side at normal priority, and the tiers that compute (vLLM on CPU) niced: in an autogroup of
# their own (the kernel shares CPU between autogroups before it looks at a process's nice value)
# they take only the CPU the waiting lanes leave idle, so those keep their timing. Every lane's
# output streams as it comes, each line prefixed `[name] `, so nothing is lost if a CI timeout
# kills the run. Once every lane is done, a line per lane gives its exit status and time, and the
# script exits non-zero if any lane failed. An interrupt stops every lane.
set -uo pipefail
cd "$(dirname "$0")/.."

names=() commands=() niced=()
nice_next=0
while (($#)); do
  if [[ $1 == --niced ]]; then
    nice_next=1
    shift
    continue
  fi
  (($# >= 2)) || { echo "usage: $0 [--niced] NAME 'COMMAND' ..." >&2; exit 2; }
  names+=("$1") commands+=("$2") niced+=("$nice_next")
  nice_next=0
  shift 2
done
((${#names[@]})) || { echo "usage: $0 [--niced] NAME 'COMMAND' ..." >&2; exit 2; }

start=$SECONDS
sessions=$(mktemp -d)
pids=()
for i in "${!names[@]}"; do
  (
    # setsid: a session, hence an autogroup, per lane (its processes can be stopped together);
    # -w: its exit status is the command's. A niced lane lowers its autogroup as well.
    if ((niced[i])); then
      setsid -w nice -n 19 sh -c 'echo $$ >"$1"; echo 19 >/proc/self/autogroup 2>/dev/null; exec sh -c "$0"' \
        "${commands[i]}" "$sessions/$i" 2>&1 | tee "$sessions/$i.log" | sed -u "s/^/[${names[i]}] /"
    else
      setsid -w sh -c 'echo $$ >"$1"; exec sh -c "$0"' \
        "${commands[i]}" "$sessions/$i" 2>&1 | tee "$sessions/$i.log" | sed -u "s/^/[${names[i]}] /"
    fi
    rc=${PIPESTATUS[0]}
    echo "$rc $((SECONDS - start))" >"$sessions/$i.done"
    exit "$rc"
  ) &
  pids+=($!)
done
stop() {
  for f in "$sessions"/[0-9]*; do
    [[ $f == *.done || $f == *.log ]] || pkill -TERM -s "$(cat "$f")" 2>/dev/null
  done
  rm -rf "$sessions"
  exit 130
}
trap stop INT TERM

failed=()
for i in "${!names[@]}"; do
  wait "${pids[i]}" || failed+=("${names[i]}")
done
# A failed lane's test failures, repeated last: what a CI record that keeps only the tail shows.
# A lane that failed before or outside its tests (a build, a cluster that would not come up) has
# none, so its last lines stand in for them: its own words on why it stopped.
for i in "${!names[@]}"; do
  read -r rc _ <"$sessions/$i.done" || rc=?
  if [[ $rc != 0 ]]; then
    if grep -qE '^(FAILED|ERROR) ' "$sessions/$i.log"; then
      echo "---- lane ${names[i]}: failed tests ----"
      grep -E '^(FAILED|ERROR) ' "$sessions/$i.log" | cut -c1-240 | head -20
    else
      echo "---- lane ${names[i]}: no test failed; its last lines ----"
      grep -v '^\s*$' "$sessions/$i.log" | tail -n 25 | cut -c1-240
    fi
  fi
done
for i in "${!names[@]}"; do
  read -r rc seconds <"$sessions/$i.done" || { rc=?; seconds=?; }
  echo "---- lane ${names[i]}$( ((niced[i])) && echo ' (niced)'): '${commands[i]}' exit $rc after $seconds s ----"
done
rm -rf "$sessions"
if ((${#failed[@]})); then
  echo "---- lanes failed: ${failed[*]} ----"
  exit 1
fi
