#!/usr/bin/env bash
# The local demo: a control plane with fake GPU nodes, the operator, a PDDeployment reconciled to
# Available, then an MTP change rolled out as a paired rollout. Leaves everything running.
#
#   hack/demo.sh          run it (`make demo`)
#   hack/demo.sh down     stop the operator and the control plane, and wait until they are gone
#                         (`make demo-down`)
#
# PDMTP_DEMO_DIR (default .cluster) holds its state: the control plane's, the kubeconfig, the
# operator's pid, ports and log. The test tier runs this same script against a directory of its
# own (tests/cluster/test_demo.py).
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=$(realpath -m "${PDMTP_DEMO_DIR:-.cluster}")
VENV=${VENV:-.venv}
BIN_DIR="$("$VENV/bin/python" -c 'import sys; sys.path.insert(0, "hack/lib"); import localcluster; print(localcluster.default_bin_dir())')"
KUBECTL="$BIN_DIR/kubectl"
export KUBECONFIG="$STATE/kubeconfig"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

operator_pid() { # the demo's operator, if it is still running
  local pid
  pid=$(cat "$STATE/operator.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

if [[ ${1:-} == down ]]; then
  if pid=$(operator_pid); then
    kill "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    echo "operator (pid $pid) stopped"
  fi
  rm -f "$STATE/operator.pid" "$STATE/operator.ports"
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
if pid=$(operator_pid); then
  echo "already running (pid $pid)"
else
  # Ports of its own on loopback, so that a second demo (the test tier's) does not collide.
  read -r metrics_port health_port < <("$VENV/bin/python" -c 'import sys; sys.path.insert(0, "hack/lib"); from loopback import free_ports; print(*free_ports(2))')
  nohup "$VENV/bin/pdmtp" run --namespace default --kubeconfig "$KUBECONFIG" \
    --resync-seconds 5 --metrics-address 127.0.0.1 --metrics-port "$metrics_port" \
    --health-listen "127.0.0.1:$health_port" \
    --metrics-source "dir:$STATE/metrics" >"$STATE/operator.log" 2>&1 &
  echo $! >"$STATE/operator.pid"
  echo "$metrics_port $health_port" >"$STATE/operator.ports"
  echo "pid $(cat "$STATE/operator.pid"); metrics on http://127.0.0.1:$metrics_port/metrics"
fi

step "Validate and apply samples/demo.yaml"
"$VENV/bin/pdmtp" validate samples/demo.yaml
"$KUBECTL" apply -f samples/demo.yaml
"$KUBECTL" wait --for=condition=Available pdd/demo --timeout=180s
"$KUBECTL" get pdd,deploy,pods -o wide

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
"$KUBECTL" describe pdd demo | sed -n '/Events:/,$p'

cat <<MSG

Everything is still running:
  export KUBECONFIG=$KUBECONFIG
  $KUBECTL get pdd -w
Stop it all with:  make demo-down$([[ $STATE == "$PWD/.cluster" ]] || echo " DEMO_DIR=$STATE")
MSG
