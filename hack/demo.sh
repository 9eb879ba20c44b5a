#!/usr/bin/env bash
# The local demo: a control plane with fake GPU nodes, the operator, a PDDeployment reconciled to
# Available and Verified, an MTP change rolled out as a paired rollout, then a release whose
# decodes draft worse, rolled back on its verdict. Leaves everything running.
#
#   hack/demo.sh          run it (`make demo`)
#   hack/demo.sh down     stop the operator and the control plane, and wait until they are gone
#                         (`make demo-down`)
#
# PDMTP_DEMO_DIR (default .cluster) holds its state: the control plane's, the kubeconfig, the
# operator's pid, ports and log, and the engine metrics (KWOK's pods run nothing: a writer,
# hack/lib/demo_engines.py, publishes what each decode would). The test tier runs this same script against a directory of its
# own (tests/cluster/test_demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=$(realpath -m "${PDMTP_DEMO_DIR:-.cluster}")
VENV=${VENV:-.venv}
BIN_DIR="$("$VENV/bin/python" -c 'import sys; sys.path.insert(0, "hack/lib"); import localcluster; print(localcluster.default_bin_dir())')"
KUBECTL="$BIN_DIR/kubectl"
export KUBECONFIG="$STATE/kubeconfig"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

running() { # the demo's process recorded in $STATE/$1.pid, if it is still running
  local pid
  pid=$(cat "$STATE/$1.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

if [[ ${1:-} == down ]]; then
  for process in engines operator; do
    if pid=$(running $process); then
      kill "$pid"
      for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      echo "$process (pid $pid) stopped"
    fi
  done
  rm -f "$STATE/operator.pid" "$STATE/operator.ports" "$STATE/engines.pid"
  "$VENV/bin/python" hack/lib/localcluster.py down --dir "$STATE"
  exit 0
fi

step "Local control plane (etcd, kube-apiserver, controller-manager, scheduler, KWOK) on 127.0.0.1"
if "$VENV/bin/python" hack/lib/localcluster.py status --dir "$STATE" >/dev/null 2>&1; then
  echo "already running"
else
  "$VENV/bin/python" hack/lib/localcluster.py up --dir "$STATE"
fi
"$KUBECTL" get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu,READY:.status.conditions[?(@.type=="Ready")].status'

step "CRDs"
"$KUBECTL" apply -f crds/pdmtp.io_pddeployments.yaml -f crds/pdmtp.io_pdrolescales.yaml
KUBECTL=$KUBECTL hack/wait-crds.sh --timeout 60 pddeployments.pdmtp.io pdrolescales.pdmtp.io

step "Operator (log: $STATE/operator.log)"
if pid=$(running operator); then
  echo "already running (pid $pid)"
else
  # Ports of its own on loopback, so that a second demo (the test tier's) does not collide.
  read -r metrics_port health_port < <("$VENV/bin/python" -c 'import sys; sys.path.insert(0, "hack/lib"); from loopback import free_ports; print(*free_ports(2))')
  nohup "$VENV/bin/pdmtp" run --namespace default --kubeconfig "$KUBECONFIG" \
    --resync-seconds 5 --metrics-address 127.0.0.1 --metrics-port "$metrics_port" \
    --health-listen "127.0.0.1:$health_port" --verification-interval-seconds 2 \
    --metrics-source "dir:$STATE/metrics" >"$STATE/operator.log" 2>&1 &
  echo $! >"$STATE/operator.pid"
  echo "$metrics_port $health_port" >"$STATE/operator.ports"
  echo "pid $(cat "$STATE/operator.pid"); metrics on http://127.0.0.1:$metrics_port/metrics"
fi

step "Engine metrics: each decode pod's counters, written where the operator reads them"
if pid=$(running engines); then
  echo "already running (pid $pid)"
else
  nohup "$VENV/bin/python" hack/lib/demo_engines.py --kubeconfig "$KUBECONFIG" \
    --namespace default --dir "$STATE/metrics" >"$STATE/engines.log" 2>&1 &
  echo $! >"$STATE/engines.pid"
  echo "pid $(cat "$STATE/engines.pid") (log: $STATE/engines.log)"
fi

step "Validate and apply samples/demo.yaml"
"$VENV/bin/pdmtp" validate samples/demo.yaml
"$KUBECTL" apply -f samples/demo.yaml
"$KUBECTL" wait --for=condition=Available pdd/demo --timeout=180s
"$KUBECTL" get pdd,deploy,pods -o wide

step "The verdict: the decodes pull the prefill's KV with the right backoff"
"$VENV/bin/pdmtp" verify demo --timeout 60

step "Change the MTP config: numSpeculativeTokens 3 -> 2 (a paired rollout of both roles)"
"$VENV/bin/pdmtp" plan --from samples/demo.yaml --to <(sed 's/numSpeculativeTokens: 3/numSpeculativeTokens: 2/' samples/demo.yaml) | tail -4
"$KUBECTL" patch pdd demo --type merge -p '{"spec":{"speculative":{"numSpeculativeTokens":2}}}'
target=$(sed 's/numSpeculativeTokens: 3/numSpeculativeTokens: 2/' samples/demo.yaml | "$VENV/bin/pdmtp" validate -o json - | "$VENV/bin/python" -c 'import json,sys; print(json.load(sys.stdin)["revision"])')
echo "rolling to revision $target"
for _ in $(seq 1 120); do
  "$KUBECTL" get pdd demo --no-headers -o custom-columns='REVISIONS:.status.revisions[*].revision,PHASES:.status.revisions[*].phase,PREFILL:.status.prefill,DECODE:.status.decode,PROGRESSING:.status.conditions[?(@.type=="Progressing")].reason'
  reason=$("$KUBECTL" get pdd demo -o jsonpath='{.status.conditions[?(@.type=="Progressing")].reason}')
  current=$("$KUBECTL" get pdd demo -o jsonpath='{.status.currentRevision}')
  [ "$reason" = RolloutComplete ] && [ "$current" = "$target" ] && break
  sleep 2
done
[ "$reason" = RolloutComplete ] && [ "$current" = "$target" ] ||
  { echo "rollout did not complete; see $STATE/operator.log" >&2; exit 1; }

step "Rolled out"
"$KUBECTL" get pdd,deploy,pods -o wide

step "A release whose decodes draft worse (acceptance 0.7 -> 0.35 per draft token), rolled out"
good=$target
"$KUBECTL" patch pdd demo --type merge -p '{"spec":{"model":{"revision":"worse-drafter"},"decode":{"env":[{"name":"PDMTP_EMULATOR_ACCEPTANCE_RATE","value":"0.35"}]}}}'
started=$(date +%s)
for _ in $(seq 1 60); do
  phase=$("$KUBECTL" get pdd demo -o jsonpath='{.status.rollout.phase}')
  revisions=$("$KUBECTL" get pods -l pdmtp.io/name=demo -o jsonpath='{range .items[*]}{.metadata.labels.pdmtp\.io/revision}{"\n"}{end}' | sort -u | xargs)
  echo "rollout $phase; pods of revisions: $revisions"
  [ "$phase" = RolledBack ] && [ "$revisions" = "$good" ] && break
  sleep 2
done
[ "$phase" = RolledBack ] && [ "$revisions" = "$good" ] ||
  { echo "the worse release was not rolled back; see $STATE/operator.log" >&2; exit 1; }
failed=$("$KUBECTL" get pdd demo -o jsonpath='{.status.rollout.failedRevision}')
verdict=$("$KUBECTL" get pdd demo -o jsonpath='{.status.rollout.failedVerdict}')
cat <<MSG
Rolled back in $(($(date +%s) - started)) s: revision $failed was judged $verdict (its decodes
accepted fewer draft tokens than revision $good's over the same span), so the operator took it
out and put $good back at full size. Until the verdict came, $good kept its last prefill and decode
serving (the roll may replace the others first, never those), so the worse release never served
alone. The spec still asks for it: the operator stays on $good until the spec changes.
\`pdmtp verify\` says so (exit 1):
MSG
set +e
"$VENV/bin/pdmtp" verify demo
code=$?
set -e
[ "$code" = 1 ] || { echo "pdmtp verify exited $code, not 1" >&2; exit 1; }

step "Back to the verified release: the spec without the change"
"$KUBECTL" patch pdd demo --type merge -p '{"spec":{"model":{"revision":null},"decode":{"env":null}}}'
"$VENV/bin/pdmtp" verify demo --timeout 60
"$KUBECTL" describe pdd demo | sed -n '/Events:/,$p'

cat <<MSG

Everything is still running:
  export KUBECONFIG=$KUBECONFIG
  $KUBECTL get pdd -w
Stop it all with:  make demo-down$([[ $STATE == "$PWD/.cluster" ]] || echo " DEMO_DIR=$STATE")
MSG
