#!/usr/bin/env bash
# The local demo: a control plane with fake GPU nodes, the operator, a PDDeployment reconciled to
# Available, then an MTP change rolled out as a paired rollout. Leaves everything running.
set -euo pipefail
cd "$(dirname "$0")/.."

STATE=.cluster
VENV=${VENV:-.venv}
BIN_DIR="$("$VENV/bin/python" -c 'import sys; sys.path.insert(0, "tests/support"); import localcluster; print(localcluster.default_bin_dir())')"
KUBECTL="$BIN_DIR/kubectl"
export KUBECONFIG="$PWD/$STATE/kubeconfig"

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }

step "Local control plane (etcd, kube-apiserver, controller-manager, scheduler, KWOK) on 127.0.0.1"
if "$VENV/bin/python" tests/support/localcluster.py status --dir "$STATE" >/dev/null 2>&1; then
  echo "already running"
else
  "$VENV/bin/python" tests/support/localcluster.py up --dir "$STATE"
fi
"$KUBECTL" get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.allocatable.nvidia\.com/gpu,READY:.status.conditions[?(@.type=="Ready")].status'

step "CRD"
"$KUBECTL" apply -f crds/pdmtp.io_pddeployments.yaml -f crds/pdmtp.io_pdrolescales.yaml
"$KUBECTL" wait --for=condition=Established crd/pddeployments.pdmtp.io crd/pdrolescales.pdmtp.io \
  --timeout=60s

step "Operator (log: $STATE/operator.log)"
if [ -f "$STATE/operator.pid" ] && kill -0 "$(cat "$STATE/operator.pid")" 2>/dev/null; then
  echo "already running (pid $(cat "$STATE/operator.pid"))"
else
  nohup "$VENV/bin/pdmtp" run --namespace default --kubeconfig "$KUBECONFIG" \
    --resync-seconds 5 --metrics-address 127.0.0.1 --metrics-port 19090 \
    --health-listen 127.0.0.1:18081 >"$STATE/operator.log" 2>&1 &
  echo $! >"$STATE/operator.pid"
  echo "pid $(cat "$STATE/operator.pid"); metrics on http://127.0.0.1:19090/metrics"
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
[ "$current" = "$target" ] || { echo "rollout did not complete; see $STATE/operator.log" >&2; exit 1; }

step "Rolled out"
"$KUBECTL" get pdd,deploy,pods -o wide
"$KUBECTL" describe pdd demo | sed -n '/Events:/,$p'

cat <<MSG

Everything is still running:
  export KUBECONFIG=$KUBECONFIG
  $KUBECTL get pdd -w
Stop it all with:  make demo-down
MSG
