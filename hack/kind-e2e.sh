#!/usr/bin/env bash
# End-to-end on kind (`make kind-e2e`, part of `make test`): real pods on real nodes.
#
#   1. images: operator and router (hack/lib/build_images.py), the engine emulator
#      (images/engine-emulator); the kind node image (hack/kind/build-node-image.sh); the
#      previous release's operator image, built from its tree (versions.env PREVIOUS_RELEASE*,
#      `git archive` into ~/.cache/pdmtp/previous/<commit>/) for tests/e2e/test_upgrade.py,
#      helm (hack/helm/build.sh) and, for tests/e2e/test_alerts.py, prometheus
#      (hack/prometheus/build.sh). All cached: a warm run only hashes inputs.
#   2. a kind cluster of a control plane and three workers (hack/kind/cluster.yaml), its API
#      server published on 127.0.0.1, the Workload API on; pod routes between the nodes
#      (hack/kind/pod-network.sh; the docker runtime's kindnet routes on its own); CoreDNS without
#      an upstream (hack/kind/coredns.yaml); NetworkPolicy enforced by kube-network-policies
#      (hack/kind/network-policies.yaml, image from hack/kind/build-network-policies.sh; kindnet
#      enforces on its own); fake `nvidia.com/gpu` capacity on the workers, so engine pods
#      schedule there and really run.
#   3. the images loaded into the workers; pdmtp installed with `kubectl apply --server-side -k
#      deploy/` through an overlay that only points it at the local image and scrapes for
#      verdicts every 5 s. The ~10 GB engine image is not loaded: the images tier runs it as its
#      pod would (its launcher's refusal included), and here the emulator refuses as the
#      launcher does (PDMTP_EMULATOR_REFUSE).
#   4. the cluster tier's API-level tests (KIND_CLUSTER_TESTS) against the same API server: the
#      real nodes tainted, KWOK (host process, hack/kwok/ stages) driving fake GPU nodes; then
#      back to the real nodes.
#   5. tests/e2e (PDMTP_CLUSTER=kind): the install; the NetworkPolicy enforced (who reaches which
#      engine port, a paired rollout under it, a control run without it); one PDDeployment
#      through Available, a paired MTP rollout under a bounded request loop, engines refusing
#      their config as the launcher does (rolled back), and deletion; multi-node decode groups gang-scheduled
#      across the workers, rolled, broken and scaled under load; a worker drained and one lost
#      (its container frozen) under load; the leading operator deleted and frozen mid-rollout
#      under load (its standby takes over).
#
#   hack/kind-e2e.sh [--keep] [--no-cluster-tier] [-- PYTEST_ARGS...]   (PYTEST_ARGS: tests/e2e)
#     --keep             leave the cluster up afterwards (deleted otherwise)
#     --no-cluster-tier  skip step 4
#   env: KIND_E2E_RUNTIME  podman (default: local images, local node image, no registry) or
#                          docker (a machine with Docker and a registry: the Dockerfiles' upstream
#                          bases, the published kindest/node image, `kind load docker-image`)
#        KIND_CLUSTER (pdmtp-e2e), VENV (.venv), PDMTP_E2E_RESULT (rollout figures, JSON),
#        KIND_E2E_OPERATOR_IMAGE (podman: test this operator image, not the one `make images` built)
#        PDMTP_PREVIOUS_RELEASE_COMMIT (upgrade from this commit instead of versions.env's pin)
#        PDMTP_E2E_UPGRADE_RESULT (upgrade and uninstall figures, JSON)
#   With --keep, $WORK/e2e.env (printed at the end) exports what tests/e2e needs, so
#   `source` it and run pytest against the kept cluster. Each pytest session here keeps its
#   basetemp under $WORK: `make test` runs this beside the cluster tier, whose session rotates the
#   shared one (keeping three) and would delete these sessions' files while they run.
#
# Network rule: the test process talks to the API server on 127.0.0.1 only; requests run in pods
# inside the nodes; CoreDNS has no upstream; containerd's registries point at a closed loopback
# port (podman runtime), so nothing here reaches past the nodes.
set -Eeuo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

RUNTIME=${KIND_E2E_RUNTIME:-podman}
CLUSTER=${KIND_CLUSTER:-pdmtp-e2e}
VENV=${VENV:-.venv}
KEEP=0
CLUSTER_TIER=1
PYTEST_ARGS=()
while (($#)); do
  case $1 in
    --keep) KEEP=1 ;;
    --no-cluster-tier) CLUSTER_TIER=0 ;;
    --) shift; PYTEST_ARGS=("$@"); break ;;
    *) echo "usage: $0 [--keep] [--no-cluster-tier] [-- PYTEST_ARGS...]" >&2; exit 2 ;;
  esac
  shift
done

KIND_CLUSTER_TESTS=(
  tests/cluster/test_crd_admission.py
  tests/cluster/test_install.py
)
T0=$SECONDS
TIMES=()
step() {
  TIMES+=("$(printf '%4d s  %s' $((SECONDS - T0)) "$*")")
  printf '\n\033[1m==> [%d s] %s\033[0m\n' $((SECONDS - T0)) "$*"
}
# Why the script stopped, repeated as its last line (after the diagnostics and the timeline), where
# a CI record that keeps only the tail shows it: die's message, or the command errexit stopped on.
STOPPED_BY=
die() { STOPPED_BY=$*; echo "error: $*" >&2; exit 1; }
trap 'STOPPED_BY="line $LINENO: \`$BASH_COMMAND\` exited $?"' ERR
[[ -x $VENV/bin/python ]] || die "no $VENV; run \`make venv\`"
PY=$VENV/bin/python

# ---- pins (versions.env) and binaries -----------------------------------------------------------
# shellcheck source=hack/versions.sh
source hack/versions.sh
CACHE_DIR=${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}
CLUSTER_BIN=$CACHE_DIR/bin/$K8S_VERSION
step "Binaries: control plane and KWOK (hack/build-cluster-bins.sh), kind and node (hack/kind/build-bins.sh)"
hack/build-cluster-bins.sh
KIND_BIN_DIR=$(hack/kind/build-bins.sh)
KIND=$KIND_BIN_DIR/kind
KUBECTL=$CLUSTER_BIN/kubectl
PDMTP_VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')

WORK=$(mktemp -d)
export KUBECONFIG=$WORK/kubeconfig
KWOK_PID=
CLUSTER_TIER_RC=0
cleanup() {
  local rc=$?
  # `|| true`: errexit holds in this trap too, and a process already gone must not end it before
  # the cluster is deleted.
  if [[ -n $KWOK_PID ]]; then kill "$KWOK_PID" 2>/dev/null || true; wait "$KWOK_PID" 2>/dev/null || true; fi
  rm -rf "$WORK/podman-tmp"
  if ((rc != 0)) && [[ -s $KUBECONFIG ]]; then
    echo "---- diagnostics (exit $rc) ----" >&2
    "$KUBECTL" get nodes -o wide >&2 || true
    "$KUBECTL" get pods -A -o wide >&2 || true
    [[ -s $WORK/kwok.log ]] && tail -n 20 "$WORK/kwok.log" >&2
  fi
  if ((KEEP)); then
    echo "cluster kept: export KUBECONFIG=$KUBECONFIG   ($KIND delete cluster --name $CLUSTER)"
    [[ -s $WORK/e2e.env ]] && echo "tests/e2e against it: source $WORK/e2e.env && $PY -m pytest tests/e2e/..."
  else
    "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
    rm -rf "$WORK"
  fi
  printf '%s\n' "---- kind-e2e timeline ----" "${TIMES[@]}" "$(printf '%4d s  end (exit %d)' $((SECONDS - T0)) "$rc")"
  if ((rc != 0)); then echo "kind-e2e stopped: ${STOPPED_BY:-exit $rc}"; fi
}
trap cleanup EXIT

# ---- the previous release: its tree, for tests/e2e/test_upgrade.py -------------------------------
# versions.env pins the commit of PREVIOUS_RELEASE, so a clone without tags still finds it; the
# tag, when this clone has it, must point there. PDMTP_PREVIOUS_RELEASE_COMMIT overrides the pin
# (any commit-ish: upgrade from that tree instead).
step "Previous release $PREVIOUS_RELEASE: its tree"
if [[ -z ${PDMTP_PREVIOUS_RELEASE_COMMIT:-} ]] &&
  tagged=$(git rev-parse -q --verify "refs/tags/$PREVIOUS_RELEASE^{commit}"); then
  [[ $tagged == "$PREVIOUS_RELEASE_COMMIT" ]] ||
    die "tag $PREVIOUS_RELEASE is commit $tagged, but versions.env pins PREVIOUS_RELEASE_COMMIT=$PREVIOUS_RELEASE_COMMIT"
fi
PREV_COMMIT=$(git rev-parse -q --verify "$PREVIOUS_RELEASE_COMMIT^{commit}") ||
  die "the previous release $PREVIOUS_RELEASE, commit $PREVIOUS_RELEASE_COMMIT (versions.env PREVIOUS_RELEASE_COMMIT), is not in this clone: \`git fetch origin $PREVIOUS_RELEASE_COMMIT\` (or the tag $PREVIOUS_RELEASE)"
PREV_TREE=$CACHE_DIR/previous/$PREV_COMMIT
if [[ ! -f $PREV_TREE/pyproject.toml ]]; then
  rm -rf "$PREV_TREE.new" && mkdir -p "$PREV_TREE.new"
  git archive "$PREV_COMMIT" | tar -x -C "$PREV_TREE.new"
  rm -rf "$PREV_TREE" && mv "$PREV_TREE.new" "$PREV_TREE"
fi
PREV_VERSION=$("$PY" -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' "$PREV_TREE/pyproject.toml")
echo "$PREVIOUS_RELEASE: commit $PREV_COMMIT, version $PREV_VERSION, tree $PREV_TREE"
step "helm (hack/helm/build.sh), prometheus (hack/prometheus/build.sh)"
HELM=$(hack/helm/build.sh)
PROMETHEUS_DIR=$(hack/prometheus/build.sh)

# ---- images -------------------------------------------------------------------------------------
EMULATED_MODEL=pdmtp-e2e/emulated-mtp   # the emulator loads nothing; a name for the specs
inputs_of() { # a hash of files and extra words, for image cache labels
  local extra=$1
  shift
  { echo "$extra"; find "$@" -type f ! -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum; } |
    sha256sum | cut -c1-16
}

if [[ $RUNTIME == podman ]]; then
  # shellcheck source=hack/podman-env.sh
  source hack/podman-env.sh
  export KIND_EXPERIMENTAL_PROVIDER=podman
  step "Images: hack/lib/build_images.py (operator, router and their local base)"
  python3 hack/lib/build_images.py build base-python operator router
  name_of() { python3 hack/lib/build_images.py names | sed -n "s/^$1=//p"; }
  OPERATOR_IMAGE=${KIND_E2E_OPERATOR_IMAGE:-$(name_of operator)}
  ROUTER_IMAGE=$(name_of router)
  BASE_PYTHON=$(name_of base-python)
  step "Images: the previous release's operator, from its tree (build_images.py build-tree)"
  PREV_OPERATOR_IMAGE=$(python3 hack/lib/build_images.py build-tree "$PREV_TREE" --revision "${PREV_COMMIT:0:7}")

  # Rebuilt only when its inputs (files, base image) change; the label is build_images.py's.
  local_build() { # image context containerfile base-arg=base-image
    local image=$1 context=$2 file=$3 arg=$4 inputs ca=()
    inputs=$(inputs_of "$(podman image inspect --format '{{.Id}}' "${arg#*=}")" "$context")
    if [[ "$(podman image inspect --format '{{index .Labels "io.pdmtp.inputs"}}' "$image" 2>/dev/null)" == "$inputs" ]]; then
      echo "$image up to date"
      return
    fi
    # A TLS-intercepting egress proxy's CA, when the host has one (as build_images.py).
    [[ -f /etc/ssl/certs/ca-certificates.crt ]] &&
      ca=(--volume /etc/ssl/certs/ca-certificates.crt:/etc/ssl/certs/ca-certificates.crt:ro)
    podman build --pull=never --network=host "${ca[@]}" --label "io.pdmtp.inputs=$inputs" \
      --build-arg "$arg" -f "$file" -t "$image" "$context"
  }
  EMULATOR_IMAGE=localhost/pdmtp-engine-emulator:$PDMTP_VERSION
  step "Images: $EMULATOR_IMAGE"
  local_build "$EMULATOR_IMAGE" images/engine-emulator images/engine-emulator/Dockerfile \
    "PYTHON_IMAGE=$BASE_PYTHON"

  step "Node image (hack/kind/build-node-image.sh), kube-network-policies (hack/kind/build-network-policies.sh)"
  NODE_IMAGE=$(hack/kind/build-node-image.sh)
  NETPOL_IMAGE=$(hack/kind/build-network-policies.sh)
  # kind mounts the host's /lib/modules into the node; these sandboxes have none (no modules
  # can be loaded here anyway). An empty directory satisfies the mount.
  [[ -d /lib/modules ]] || mkdir -p /lib/modules
  KIND_CONFIG=hack/kind/cluster.yaml
elif [[ $RUNTIME == docker ]]; then
  NETPOL_IMAGE= # kindnet, the published node image's CNI, enforces NetworkPolicy itself
  command -v docker >/dev/null || die "KIND_E2E_RUNTIME=docker but docker is not on PATH"
  TAG=e2e-$(git rev-parse --short HEAD)
  OPERATOR_IMAGE=pdmtp-operator:$TAG
  ROUTER_IMAGE=pdmtp-router:$VLLM_ROUTER_VERSION
  EMULATOR_IMAGE=pdmtp-engine-emulator:$TAG
  step "Images (docker build, the Dockerfiles' upstream bases)"
  export DOCKER_BUILDKIT=1 # images/operator/Dockerfile uses RUN --mount
  docker build -f images/operator/Dockerfile --build-arg "PDMTP_VERSION=$PDMTP_VERSION" -t "$OPERATOR_IMAGE" .
  PREV_OPERATOR_IMAGE=pdmtp-operator:$PREV_VERSION-${PREV_COMMIT:0:7}
  docker build -f "$PREV_TREE/images/operator/Dockerfile" --build-arg "PDMTP_VERSION=$PREV_VERSION" \
    -t "$PREV_OPERATOR_IMAGE" "$PREV_TREE"
  docker build --platform linux/amd64 -t "$ROUTER_IMAGE" images/router
  docker build -t "$EMULATOR_IMAGE" images/engine-emulator
  # The published node image for kind v0.33, by digest. It is Kubernetes 1.36 (kind v0.33
  # publishes no image of the pinned 1.37): hack/kind/cluster-docker.yaml turns on 1.36's
  # Workload API (v1alpha2), which the operator serves as it serves 1.37's v1beta1.
  NODE_IMAGE=${KIND_NODE_IMAGE:-kindest/node:v1.36.4@sha256:099e049362a1526b2db71494e1947aae99bd16290d7c895f2b7ea312e3cbfaed}
  [[ $NODE_IMAGE == *":v1.36."* ]] ||
    die "node image $NODE_IMAGE is not Kubernetes 1.36, which hack/kind/cluster-docker.yaml configures"
  KIND_CONFIG=hack/kind/cluster-docker.yaml
else
  die "KIND_E2E_RUNTIME=$RUNTIME: expected podman or docker"
fi

# ---- cluster ------------------------------------------------------------------------------------
step "kind cluster $CLUSTER ($NODE_IMAGE)"
"$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
# Four node containers, each a copy-on-write of the node image, and the images loaded into the
# workers' containerd (each, twice over: its layers and their snapshot), beside podman save's
# staging file: a disk that fills up mid-run fails more than this lane (`make test` runs the
# cluster tier beside it, its etcd on the same disk), so stop here, saying why.
# KIND_E2E_MIN_FREE_GB=0 skips the check. First the volumes a kind cluster killed rather than
# deleted leaves behind (~8 GB seen), which nothing else uses: podman removes only volumes no
# container holds, so a cluster that is up keeps its own.
MIN_FREE_GB=${KIND_E2E_MIN_FREE_GB:-10}
disks=("$WORK")
if [[ $RUNTIME == podman ]]; then
  disks+=("$(podman info --format '{{.Store.GraphRoot}}')")
  podman volume prune --force >/dev/null
fi
for dir in "${disks[@]}"; do
  free_gb=$(($(df -Pk "$dir" | awk 'NR==2 {print $4}') / 1048576))
  echo "$dir: $free_gb GB free (kind e2e needs $MIN_FREE_GB GB)"
  ((free_gb >= MIN_FREE_GB)) || die "$dir has $free_gb GB free, kind e2e needs $MIN_FREE_GB GB \
(old images: podman image prune; the Go build cache: go clean -cache)"
done
# A second try when the first fails: the nodes' containers boot systemd and kubeadm under
# whatever else the machine runs, and one that misses kind's deadline fails the whole lane. The
# first failure stays in the log.
create_cluster() {
  "$KIND" create cluster --name "$CLUSTER" --image "$NODE_IMAGE" --config "$KIND_CONFIG" \
    --kubeconfig "$KUBECONFIG" --wait 180s
}
if ! create_cluster; then
  echo "kind create cluster failed; deleting what it left and trying once more" >&2
  "$KIND" delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  create_cluster
fi
mapfile -t NODES < <("$KUBECTL" get nodes -o name | sed 's|^node/||')
mapfile -t WORKERS < <("$KUBECTL" get nodes -l '!node-role.kubernetes.io/control-plane' -o name | sed 's|^node/||')
((${#WORKERS[@]} == 3)) || die "expected three workers, found: ${WORKERS[*]}"
if [[ $RUNTIME == podman ]]; then
  hack/kind/pod-network.sh "$KUBECTL"
  "$KUBECTL" apply -f hack/kind/coredns.yaml
fi
"$KUBECTL" -n kube-system rollout status deploy/coredns --timeout=120s

load_image() { # image node...
  local image=$1
  shift
  if [[ $RUNTIME == podman ]]; then
    # What `kind load image-archive` does: one archive, imported by each node's containerd
    # (streamed when there is one node). The archive and podman save's own temporary file (which
    # it leaves behind when killed: ~10 GB for the engine image) live in $WORK, which cleanup
    # removes.
    mkdir -p "$WORK/podman-tmp"
    if (($# == 1)); then
      TMPDIR=$WORK/podman-tmp podman save --quiet --format docker-archive "$image" |
        podman exec -i "$1" ctr --namespace=k8s.io images import --digests --snapshotter=overlayfs - >/dev/null
      return
    fi
    local archive
    archive=$(mktemp -u -p "$WORK/podman-tmp" image.XXXXXX.tar)
    TMPDIR=$WORK/podman-tmp podman save --quiet --format docker-archive -o "$archive" "$image"
    local node pids=()
    for node in "$@"; do
      podman exec -i "$node" ctr --namespace=k8s.io images import --digests --snapshotter=overlayfs - \
        <"$archive" >/dev/null &
      pids+=($!)
    done
    local pid rc=0
    for pid in "${pids[@]}"; do wait "$pid" || rc=1; done
    rm -f "$archive"
    return $rc
  else
    "$KIND" load docker-image --name "$CLUSTER" --nodes "$(IFS=,; echo "$*")" "$image"
  fi
}
# Only the workers run them: the control plane keeps kubeadm's NoSchedule taint.
step "Load images into the workers: $OPERATOR_IMAGE $PREV_OPERATOR_IMAGE $ROUTER_IMAGE $EMULATOR_IMAGE"
for image in "$OPERATOR_IMAGE" "$PREV_OPERATOR_IMAGE" "$ROUTER_IMAGE" "$EMULATOR_IMAGE"; do
  load_image "$image" "${WORKERS[@]}"
done
if [[ -n $NETPOL_IMAGE ]]; then
  step "NetworkPolicy enforcement: kube-network-policies ($NETPOL_IMAGE)"
  load_image "$NETPOL_IMAGE" "${NODES[@]}"
  sed "s|image: KUBE_NETWORK_POLICIES_IMAGE|image: $NETPOL_IMAGE|" hack/kind/network-policies.yaml |
    "$KUBECTL" apply -f -
  "$KUBECTL" -n kube-system rollout status daemonset/kube-network-policies --timeout=120s
fi

# ---- pdmtp as users install it -----------------------------------------------------------------
overlay=$WORK/overlay
# hack/lib/kind_overlay.py, which test_upgrade.py installs the same way.
"$PY" hack/lib/kind_overlay.py "$overlay" "$REPO/deploy" "$OPERATOR_IMAGE"
install_pdmtp() {
  # As deploy/kustomization.yaml says to install (the cluster tier applies deploy/ the same way,
  # under the same field manager, so neither apply conflicts with the other).
  "$KUBECTL" apply --server-side -k "$overlay"
  KUBECTL=$KUBECTL hack/wait-crds.sh --timeout 60 pddeployments.pdmtp.io pdrolescales.pdmtp.io
  "$KUBECTL" -n pdmtp-system rollout status deploy/pdmtp-operator --timeout=180s
}
step "pdmtp: kubectl apply -k deploy/ with $OPERATOR_IMAGE"
install_pdmtp
# Both test tiers below run against this cluster (tests/cluster/conftest.py's kind backend and
# tests/e2e/conftest.py read these), and fail rather than skip when something is missing.
export PDMTP_CLUSTER=kind PDMTP_KUBECTL=$KUBECTL PDMTP_REQUIRE_ALL=${PDMTP_REQUIRE_ALL:-1}

# ---- the cluster tier: fake GPU nodes; the real node only runs infrastructure ------------------
if ((CLUSTER_TIER)); then
  step "Cluster tier against kind: real nodes tainted, KWOK fake GPU nodes"
  # The tier starts its own operator per test; the in-cluster one would reconcile the same objects.
  "$KUBECTL" -n pdmtp-system scale deployment pdmtp-operator --replicas=0
  "$KUBECTL" taint nodes "${NODES[@]}" pdmtp.io/e2e-infra=true:NoSchedule
  kwok_port=$("$PY" -c 'import sys; sys.path.insert(0, "hack/lib"); from loopback import free_ports; print(free_ports(1)[0])')
  stages=()
  for f in hack/kwok/*.yaml; do stages+=("--config=$f"); done
  mkdir -p "$WORK/kwok-home"
  # As hack/lib/localcluster.py runs it: only annotated nodes, fake pod IPs that nothing dials
  # (disjoint from the node's pod, Service and podman ranges), its kubelet port on loopback.
  HOME=$WORK/kwok-home "$CLUSTER_BIN/kwok" --kubeconfig="$KUBECONFIG" "${stages[@]}" \
    --manage-all-nodes=false --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-ip=127.0.0.1 --node-port="$kwok_port" --server-address="127.0.0.1:$kwok_port" \
    --cidr=10.200.0.0/16 --node-lease-duration-seconds=40 >"$WORK/kwok.log" 2>&1 &
  KWOK_PID=$!
  "$PY" - >"$WORK/nodes.json" <<'PY'
import json
import sys

sys.path.insert(0, "hack/lib")
from localcluster import fake_gpu_node

nodes = [fake_gpu_node(f"pdmtp-gpu-{i}") for i in range(4)]
print(json.dumps({"apiVersion": "v1", "kind": "List", "items": nodes}))
PY
  # create, not apply: a Node keeps the status it is created with (capacity, GPUs).
  "$KUBECTL" create -f "$WORK/nodes.json"
  "$KUBECTL" wait --for=condition=Ready node -l type=kwok --timeout=120s
  # One pod alone first, so KWOK's first pods never share an IP (localcluster.ip_pool_primer).
  "$PY" -c 'import json, sys; sys.path.insert(0, "hack/lib"); from localcluster import ip_pool_primer; print(json.dumps(ip_pool_primer("pdmtp-gpu-0")))' |
    "$KUBECTL" create -f -
  "$KUBECTL" -n default wait --for=jsonpath='{.status.phase}'=Running pod/pdmtp-kwok-ip-primer --timeout=60s
  "$KUBECTL" -n default delete pod pdmtp-kwok-ip-primer --wait --timeout=60s
  # What this run must prove beyond `make test-cluster` (the same suite, against the same
  # Kubernetes version built locally): that a kubeadm-built distribution changes nothing the
  # operator relies on at the API: CRD admission with its defaults, install and RBAC under the
  # operator's own identity. Rollouts, scaling and the canary on this distribution are proven
  # by tests/e2e with real pods, the operator in-cluster and requests flowing, which is stronger
  # than the KWOK rollouts; the rest of the tier (rollouts under the invariant watcher, rollout
  # control, spec corpora, drift correction, recovery from the control plane, the 50-object
  # scale, the webhook) runs locally only.
  # A red cluster tier still lets tests/e2e run (the exit code reports both at the end).
  "$PY" -m pytest "${KIND_CLUSTER_TESTS[@]}" -q -m cluster -p no:cacheprovider --durations=8 \
    --basetemp "$WORK/pytest-cluster" \
    || CLUSTER_TIER_RC=$?

  step "Back to the real nodes: the tier's namespaces, fake nodes and KWOK gone"
  # KWOK completes the fake pods' deletion; only then can their namespaces go.
  if [[ -n $("$KUBECTL" get namespaces -l pdmtp.io/test=true -o name) ]]; then
    "$KUBECTL" wait --for=delete namespace -l pdmtp.io/test=true --timeout=300s
  fi
  "$KUBECTL" delete nodes -l type=kwok --wait=true
  kill "$KWOK_PID"
  wait "$KWOK_PID" || true
  KWOK_PID=
  "$KUBECTL" taint nodes "${NODES[@]}" pdmtp.io/e2e-infra=true:NoSchedule-
  # The tier applied deploy/ as it is (image pdmtp-operator:dev): put the overlay back, as a
  # user re-applying their install would.
  install_pdmtp
fi

# ---- tests/e2e: real pods on the real nodes -----------------------------------------------------
# Extended resources are advertised by patching node status (as a device plugin's kubelet would
# report them); the kubelet keeps them. Every engine pod of tests/e2e asks for one GPU.
for node in "${WORKERS[@]}"; do
  "$KUBECTL" patch node "$node" --subresource=status --type=json \
    -p '[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"16"}]'
done
export PDMTP_E2E_EMULATOR_IMAGE=$EMULATOR_IMAGE PDMTP_E2E_ROUTER_IMAGE=$ROUTER_IMAGE
export PDMTP_E2E_OPERATOR_IMAGE=$OPERATOR_IMAGE PDMTP_E2E_ENGINE_MODEL=$EMULATED_MODEL
export PDMTP_E2E_RESULT=${PDMTP_E2E_RESULT:-$WORK/rollout.json}
# tests/e2e/test_operator_failover.py freezes an operator container through its node's runtime.
export PDMTP_E2E_NODE_RUNTIME=$RUNTIME
# tests/e2e/test_upgrade.py: the previous release (tree, image) to upgrade from, helm, and the
# overlay install_pdmtp applies (the upgrade applies it, and the test leaves it installed).
export PDMTP_E2E_PREVIOUS_RELEASE=$PREVIOUS_RELEASE PDMTP_E2E_PREVIOUS_TREE=$PREV_TREE
export PDMTP_E2E_PREVIOUS_OPERATOR_IMAGE=$PREV_OPERATOR_IMAGE PDMTP_HELM=$HELM
export PDMTP_E2E_INSTALL_OVERLAY=$overlay
export PDMTP_E2E_UPGRADE_RESULT=${PDMTP_E2E_UPGRADE_RESULT:-$WORK/upgrade.json}
# tests/e2e/test_alerts.py runs this prometheus on the host against the chart's rules.
export PDMTP_PROMETHEUS_DIR=$PROMETHEUS_DIR
export -p | grep -E ' (KUBECONFIG|PDMTP_[A-Z0-9_]+)=' >"$WORK/e2e.env"
# A podman build (the background builds' engine image, on a cold run) holds podman's storage:
# the node freezes and execs of tests/e2e would stall behind it (`podman pause` timed out after
# 60 s once). Wait for the image builds, lifting them if they are the background ones.
images_lock=${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}/images/build.lock
if [[ $RUNTIME == podman && -e $images_lock ]] && ! flock -n "$images_lock" true; then
  step "Wait for the image builds (podman's storage)"
  hack/lift-prebuild.sh "$images_lock" "the image builds" || true
  flock "$images_lock" true
fi
E2E_RC=0
# PYTEST_ARGS that name files or directories (tests/...) select them; otherwise tests/e2e.
selected=(tests/e2e)
for arg in "${PYTEST_ARGS[@]}"; do
  if [[ $arg == tests/* ]]; then selected=() && break; fi
done
step "tests/e2e against kind"
"$PY" -m pytest "${selected[@]}" -q -p no:cacheprovider -rA --durations=12 \
  --basetemp "$WORK/pytest-e2e" "${PYTEST_ARGS[@]}" || E2E_RC=$?
if [[ -s $PDMTP_E2E_RESULT ]]; then echo "rollout figures: $(tr -d '\n ' <"$PDMTP_E2E_RESULT")"; fi
if [[ -s $PDMTP_E2E_UPGRADE_RESULT ]]; then echo "upgrade figures: $(tr -d '\n ' <"$PDMTP_E2E_UPGRADE_RESULT")"; fi
((CLUSTER_TIER_RC == 0)) || echo "error: the cluster tier failed against kind (exit $CLUSTER_TIER_RC)" >&2
((E2E_RC == 0)) || echo "error: tests/e2e failed (exit $E2E_RC)" >&2
((CLUSTER_TIER_RC == 0 && E2E_RC == 0)) || exit 1
step "done"
