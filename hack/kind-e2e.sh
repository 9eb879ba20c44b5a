#!/usr/bin/env bash
# End-to-end on kind (opt-in; needs Docker, kind v0.33.x, kubectl, and `make venv`):
#   1. build the operator, router and engine images and load them into a fresh kind cluster;
#   2. install KWOK in-cluster with this repo's stages (hack/kwok/) and fake GPU nodes;
#   3. install pdmtp with `kubectl apply -k deploy/` (through an overlay that points at the
#      loaded image) and check the real operator image reconciles samples/demo.yaml to Available;
#   4. run the cluster test tier against the kind cluster (PDMTP_CLUSTER=kind).
#
#   hack/kind-e2e.sh [--skip-engine] [--keep] [-- PYTEST_ARGS...]
#     --skip-engine  do not build/load images/engine (tens of GB; no test pod runs it: engine
#                    pods land on fake KWOK nodes, which never pull images)
#     --keep         leave the cluster up afterwards (it is deleted otherwise)
#   env: KIND_CLUSTER (pdmtp-e2e), IMAGE_TAG (e2e-<git sha>), FAKE_NODES (4), VENV (.venv),
#        KIND_NODE_IMAGE (default: the pinned image below, for kind v0.33.x only)
#
# The real kind node is tainted so that only infrastructure (KWOK, the operator under test) runs
# there; every test pod lands on a fake node, exactly as in the local tier where all nodes are
# fake. Router and engine images are loaded for runs that put them on real nodes; fake nodes
# never pull an image.
#
# Written where no Docker daemon and no kind exist: checked with bash -n and shellcheck, and its
# overlay and node generation were rendered offline, but it has not been run end to end.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

# kind node images are built per kind release and must be pinned by digest (kind v0.33.0 notes).
KIND_RELEASE=v0.33
DEFAULT_NODE_IMAGE=kindest/node:v1.36.4@sha256:099e049362a1526b2db71494e1947aae99bd16290d7c895f2b7ea312e3cbfaed
NODE_IMAGE=${KIND_NODE_IMAGE:-$DEFAULT_NODE_IMAGE}
CLUSTER=${KIND_CLUSTER:-pdmtp-e2e}
VENV=${VENV:-.venv}
FAKE_NODES=${FAKE_NODES:-4}
# Fake pod IPs KWOK hands out: private, disjoint from kind's pod (10.244/16) and Service
# (10.96/16) ranges, and large enough for the scale test (its default /24 is not).
FAKE_POD_CIDR=10.200.0.0/16
INFRA_TAINT=pdmtp.io/e2e-infra
SMOKE_NS=pdmtp-e2e-smoke

SKIP_ENGINE=0
KEEP=0
PYTEST_ARGS=()
while (($#)); do
  case $1 in
    --skip-engine) SKIP_ENGINE=1 ;;
    --keep) KEEP=1 ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    *) echo "usage: $0 [--skip-engine] [--keep] [-- PYTEST_ARGS...]" >&2; exit 2 ;;
  esac
  shift
done

step() { printf '\n\033[1m==> %s\033[0m\n' "$*"; }
die() { echo "error: $*" >&2; exit 1; }

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || die "$tool is not on PATH"
done
[[ -x $VENV/bin/python ]] || die "no $VENV; run \`make venv\`"

# ---- versions, each read from its one source ---------------------------------------------------
# The local tier's pins (hack/build-cluster-bins.sh): kind must run the same Kubernetes minor and
# the same KWOK release.
pin() { sed -n "s/^$1=\"\${PDMTP_$1:-\(v[0-9.]*\)}\"\$/\1/p" hack/build-cluster-bins.sh; }
K8S_VERSION=$(pin K8S_VERSION)
KWOK_VERSION=$(pin KWOK_VERSION)
[[ -n $K8S_VERSION && -n $KWOK_VERSION ]] || die "cannot read the pins in hack/build-cluster-bins.sh"
node_minor=$(sed -n 's/^kindest\/node:v\([0-9]*\.[0-9]*\)\..*/\1/p' <<<"$NODE_IMAGE")
local_minor=$(cut -d. -f1,2 <<<"${K8S_VERSION#v}")
[[ $node_minor == "$local_minor" ]] ||
  die "node image $NODE_IMAGE is Kubernetes $node_minor, the local tier $K8S_VERSION: bump the pin here"
if [[ -z ${KIND_NODE_IMAGE:-} && $(kind version) != "kind $KIND_RELEASE."* ]]; then
  die "$(kind version): the pinned node image is for kind $KIND_RELEASE.x; install it or set KIND_NODE_IMAGE"
fi

TAG=${IMAGE_TAG:-e2e-$(git rev-parse --short HEAD)}
OPERATOR_IMAGE=pdmtp-operator:$TAG
# The router image the operator renders by default, and the engine image at the pinned vLLM.
ROUTER_IMAGE=$("$VENV/bin/python" -c 'from pdmtp.api.v1alpha1 import RouterSpec; print(RouterSpec().image)')
VLLM_VERSION=$(sed -n 's/^ARG VLLM_VERSION=//p' images/engine/Dockerfile)
ENGINE_IMAGE=pdmtp-engine:$VLLM_VERSION

WORK=$(mktemp -d)
export KUBECONFIG=$WORK/kubeconfig

cleanup() {
  local rc=$?
  if ((rc != 0)) && [[ -s $KUBECONFIG ]]; then
    echo "---- diagnostics (exit $rc) ----" >&2
    kubectl get nodes -o wide >&2 || true
    kubectl get pods -A -o wide >&2 || true
    kubectl -n pdmtp-system logs deploy/pdmtp-operator --tail=100 >&2 || true
  fi
  if ((KEEP)); then
    echo "cluster kept: export KUBECONFIG=$KUBECONFIG   (kind delete cluster --name $CLUSTER)"
  else
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT

# ---- images (before the cluster: a broken build fails fast) -----------------------------------
step "Images: $OPERATOR_IMAGE, $ROUTER_IMAGE$( ((SKIP_ENGINE)) || echo ", $ENGINE_IMAGE")"
export DOCKER_BUILDKIT=1  # images/operator/Dockerfile uses RUN --mount
docker build -f images/operator/Dockerfile -t "$OPERATOR_IMAGE" .
# Its requirements.txt pins amd64 wheel hashes.
docker build --platform linux/amd64 -t "$ROUTER_IMAGE" images/router
images=("$OPERATOR_IMAGE" "$ROUTER_IMAGE")
if ((!SKIP_ENGINE)); then
  docker build -t "$ENGINE_IMAGE" images/engine
  images+=("$ENGINE_IMAGE")
fi

# ---- cluster -----------------------------------------------------------------------------------
step "kind cluster $CLUSTER ($NODE_IMAGE)"
kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
kind create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --kubeconfig "$KUBECONFIG" --wait 180s
kind load docker-image --name "$CLUSTER" "${images[@]}"
# Let the cluster's own add-ons land before the taint keeps new pods off the real node(s).
kubectl -n kube-system rollout status deploy/coredns --timeout=120s
kubectl -n local-path-storage rollout status deploy/local-path-provisioner --timeout=120s || true
kubectl label nodes --all "$INFRA_TAINT=true"
kubectl taint nodes --all "$INFRA_TAINT=true:NoSchedule"

# Runs a Deployment on the real (tainted) node only.
pin_to_infra() {
  kubectl -n "$1" patch deployment "$2" --type strategic -p "{\"spec\":{\"template\":{\"spec\":{
    \"nodeSelector\":{\"$INFRA_TAINT\":\"true\"},
    \"tolerations\":[{\"key\":\"$INFRA_TAINT\",\"operator\":\"Exists\",\"effect\":\"NoSchedule\"}]}}}}"
}

# ---- KWOK --------------------------------------------------------------------------------------
step "KWOK $KWOK_VERSION in-cluster with hack/kwok/ stages"
# The release's controller Deployment and CRDs (kube-system/kwok-controller); it reads Stage
# objects (--enable-crd=Stage), and only ours are applied, none of the stock ones.
kubectl apply -f "https://github.com/kubernetes-sigs/kwok/releases/download/$KWOK_VERSION/kwok.yaml"
kubectl wait --for=condition=Established crd/stages.kwok.x-k8s.io --timeout=60s
kubectl apply -f hack/kwok/
# A repeated flag's last value wins, so appending --cidr overrides the manifest's.
kubectl -n kube-system patch deployment kwok-controller --type json \
  -p "[{\"op\":\"add\",\"path\":\"/spec/template/spec/containers/0/args/-\",\"value\":\"--cidr=$FAKE_POD_CIDR\"}]"
pin_to_infra kube-system kwok-controller
kubectl -n kube-system rollout status deploy/kwok-controller --timeout=180s

step "$FAKE_NODES fake GPU nodes (hack/localcluster.py fake_gpu_node)"
# The same node objects as the local tier, minus the loopback address: KWOK fills in its own pod
# IP, where its fake kubelet endpoint listens.
"$VENV/bin/python" - "$FAKE_NODES" >"$WORK/nodes.json" <<'PY'
import json
import sys

sys.path.insert(0, "hack")
from localcluster import fake_gpu_node

items = []
for i in range(int(sys.argv[1])):
    node = fake_gpu_node(f"kwok-gpu-{i}")
    node["status"].pop("addresses", None)
    items.append(node)
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
PY
# create, not apply: a Node keeps the status it is created with (capacity, GPUs).
kubectl create -f "$WORK/nodes.json"
kubectl wait --for=condition=Ready node -l type=kwok --timeout=120s

# ---- pdmtp -------------------------------------------------------------------------------------
step "pdmtp: kubectl apply -k deploy/ with image $OPERATOR_IMAGE"
# An overlay outside the repo, so deploy/ is never edited: the loaded image, and the real node.
overlay=$WORK/overlay
mkdir -p "$overlay"
cat >"$overlay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - $(realpath --relative-to="$overlay" "$REPO/deploy")
images:
  - name: pdmtp-operator
    newName: ${OPERATOR_IMAGE%:*}
    newTag: $TAG
patches:
  - target: {kind: Deployment, name: pdmtp-operator}
    patch: |-
      - op: add
        path: /spec/template/spec/nodeSelector
        value: {$INFRA_TAINT: "true"}
      - op: add
        path: /spec/template/spec/tolerations
        value: [{key: $INFRA_TAINT, operator: Exists, effect: NoSchedule}]
EOF
kubectl apply -k "$overlay"
kubectl wait --for=condition=Established crd/pddeployments.pdmtp.io --timeout=60s
kubectl -n pdmtp-system rollout status deploy/pdmtp-operator --timeout=180s

step "Smoke: the in-cluster operator reconciles samples/demo.yaml to Available"
kubectl create namespace "$SMOKE_NS"
kubectl -n "$SMOKE_NS" apply -f samples/demo.yaml
kubectl -n "$SMOKE_NS" wait --for=condition=Available pdd/demo --timeout=300s
kubectl -n "$SMOKE_NS" get pdd,deploy,pods -o wide
kubectl delete namespace "$SMOKE_NS" --wait=true --timeout=120s
# The cluster tier starts its own `pdmtp run` per test namespace; an --all-namespaces operator
# would reconcile the same objects. (tests/cluster/test_install.py re-applies deploy/ itself; that
# Deployment has no toleration, so its pod lands on a fake node and never runs.)
kubectl -n pdmtp-system scale deployment pdmtp-operator --replicas=0

# ---- tests -------------------------------------------------------------------------------------
step "Cluster tier against kind"
PDMTP_CLUSTER=kind PDMTP_REQUIRE_ALL=1 \
  "$VENV/bin/python" -m pytest tests/cluster -m cluster "${PYTEST_ARGS[@]}"
