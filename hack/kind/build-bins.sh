#!/usr/bin/env bash
# Build what a kind node needs beyond the local control plane, from pinned Go modules, into a
# cache outside the repo (a second run is a fast no-op):
#   kind                               sigs.k8s.io/kind (the CLI that creates the cluster)
#   kubelet, kubeadm, kube-proxy       k8s.io/kubernetes at the SAME pin as the local control plane
#   coredns                            github.com/coredns/coredns, only the plugins our Corefile uses
#   pause                              images/kind-node/pause (our own, a few lines of Go)
# kube-apiserver, -controller-manager, -scheduler, kubectl and etcd come from
# hack/build-cluster-bins.sh (run first: its Go build cache makes the Kubernetes builds here
# incremental). Every pin comes from versions.env (hack/versions.sh).
#
#   PDMTP_CACHE_DIR   cache root (default ~/.cache/pdmtp); binaries land in kind/bin/
#   prints the bin directory on stdout; progress goes to stderr
set -euo pipefail
# shellcheck source=hack/lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lock.sh"
run_locked kind-bins "$@"
cd "$(dirname "$0")/../.."
REPO=$PWD

# shellcheck source=hack/versions.sh
source hack/versions.sh

CACHE_DIR="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
BIN_DIR="$CACHE_DIR/kind/bin"
WORK_DIR="$CACHE_DIR/build"
PARALLEL="${PDMTP_BUILD_PARALLEL:-2}"
mkdir -p "$BIN_DIR" "$WORK_DIR"
# The same flags as hack/build-cluster-bins.sh, so the shared Go build cache is hit.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false"
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
# A component is current when its binaries exist and its stamp names the same inputs.
current() { # stamp-name want bin...
  local stamp="$BIN_DIR/.$1" want=$2 b
  shift 2
  [[ -f $stamp && "$(cat "$stamp")" == "$want" ]] || return 1
  for b in "$@"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
}

build_kind() {
  current kind "$KIND_VERSION" kind && return 0
  command -v go >/dev/null || { echo "error: go is not on PATH" >&2; exit 1; }
  log "kind $KIND_VERSION: building"
  GOBIN="$BIN_DIR" go install -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION" >&2
  echo "$KIND_VERSION" >"$BIN_DIR/.kind"
}

# k8s.io/kubernetes requires its staging modules at v0.0.0 with local replaces; a consumer
# repeats each replace with the published v0.<minor>.<patch> (as hack/build-cluster-bins.sh does).
build_kube() {
  local names=(kubelet kubeadm kube-proxy) n
  current kube "$K8S_VERSION" "${names[@]}" && return 0
  local mod="$WORK_DIR/kind-kubernetes-$K8S_VERSION" gomod minor patch
  log "kubernetes $K8S_VERSION: ${names[*]}"
  gomod="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  minor="$(cut -d. -f2 <<<"${K8S_VERSION#v}")"
  patch="$(cut -d. -f3 <<<"${K8S_VERSION#v}")"
  rm -rf "$mod" && mkdir -p "$mod"
  {
    printf 'module pdmtp.local/kindkube\n\ngo 1.26.0\n\nrequire k8s.io/kubernetes %s\n\n' "$K8S_VERSION"
    awk -v v="v0.$minor.$patch" '$2 == "=>" && $3 ~ /^\.\/staging\// {
      printf "replace %s => %s %s\n", $1, $1, v }' "$gomod"
  } >"$mod/go.mod"
  local pkgs=()
  for n in "${names[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$n@$K8S_VERSION"); done
  (cd "$mod" && go get "${pkgs[@]}" 2>&1 | tail -n 2 >&2)
  local date commit ld="" pkg
  date="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  commit="$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"Hash": "\(.*\)",\{0,1\}$/\1/p' | head -n1)"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld+=" -X $pkg.gitCommit=${commit:-unknown} -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  for n in "${names[@]}"; do
    log "kubernetes: building $n"
    (cd "$mod" && go build -p "$PARALLEL" -ldflags "-s -w$ld" -o "$BIN_DIR/$n" "k8s.io/kubernetes/cmd/$n")
  done
  echo "$K8S_VERSION" >"$BIN_DIR/.kube"
}

# CoreDNS from its published module through a wrapper main that links only the plugins in
# images/kind-node/coredns/Corefile (no forward: nothing in the cluster may resolve names
# outside it), which also keeps the build small.
build_coredns() {
  local src="$REPO/images/kind-node/coredns/main.go" want
  want="$COREDNS_VERSION $(sha256sum "$src" | cut -c1-16)"
  current coredns "$want" coredns && return 0
  local mod="$WORK_DIR/coredns-$COREDNS_VERSION"
  log "coredns $COREDNS_VERSION: building"
  rm -rf "$mod" && mkdir -p "$mod"
  printf 'module pdmtp.local/coredns\n\ngo 1.26.0\n' >"$mod/go.mod"
  cp "$src" "$mod/main.go"
  (cd "$mod" && go get "github.com/coredns/coredns@$COREDNS_VERSION" 2>&1 | tail -n 2 >&2 &&
    go mod tidy 2>&1 | tail -n 2 >&2)
  (cd "$mod" && go build -p "$PARALLEL" -ldflags "-s -w" -o "$BIN_DIR/coredns" .)
  echo "$want" >"$BIN_DIR/.coredns"
}

# The tag kubeadm lists for pause is the version our pause reports (and the image's tag).
build_pause() {
  local dir="$REPO/images/kind-node/pause" want tag
  tag="$(sed -n 's|.*/pause:\(.*\)$|\1|p' <<<"$IMAGES_LISTED")"
  want="$tag $(cat "$dir/go.mod" "$dir/main.go" | sha256sum | cut -c1-16)"
  current pause "$want" pause && return 0
  log "pause $tag: building"
  (cd "$dir" && go build -ldflags "-s -w -X main.version=$tag" -o "$BIN_DIR/pause" .)
  echo "$want" >"$BIN_DIR/.pause"
}

build_kind
build_kube
IMAGES_LISTED="$("$BIN_DIR/kubeadm" config images list --kubernetes-version "$K8S_VERSION" 2>/dev/null)"
grep -q "coredns:$COREDNS_VERSION\$" <<<"$IMAGES_LISTED" || {
  echo "error: kubeadm $K8S_VERSION wants $(grep coredns <<<"$IMAGES_LISTED"); bump COREDNS_VERSION in versions.env" >&2
  exit 1
}
build_pause
build_coredns
log "kind node binaries ready in $BIN_DIR"
echo "$BIN_DIR"
