#!/usr/bin/env bash
# Build the NetworkPolicy enforcer of the kind tier, offline: sigs.k8s.io/kube-network-policies
# from its Go module, as a static binary on scratch (images/network-policies), for the DaemonSet
# in hack/kind/network-policies.yaml. The kind node's CNI (ptp + host-local) enforces nothing on
# its own.
#
# One change to upstream, compiled in from images/network-policies/xtqueue.go: the packets to
# judge reach userspace through the xtables NFQUEUE target (nft_compat) instead of nftables'
# `queue` expression, which these hosts' kernels lack (CONFIG_NFT_QUEUE unset, no modules:
# `nft add rule ... queue num 100` fails with "No such file or directory"). The build fails if
# upstream builds a queue expression anywhere the substitution does not reach.
#
#   hack/kind/build-network-policies.sh    prints the image reference on stdout; progress on stderr
#   PDMTP_CACHE_DIR   cache root (default ~/.cache/pdmtp); the binary lands in
#                     kube-network-policies/<version>/, keyed by version and the inputs' hash
#   the module version is versions.env's KUBE_NETWORK_POLICIES_VERSION
set -euo pipefail
# shellcheck source=hack/lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lock.sh"
run_locked network-policies "$@"
cd "$(dirname "$0")/../.."
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# shellcheck source=hack/podman-env.sh
source hack/podman-env.sh >&2
# shellcheck source=hack/versions.sh
source hack/versions.sh

VERSION=$KUBE_NETWORK_POLICIES_VERSION
MODULE=sigs.k8s.io/kube-network-policies
CACHE_DIR="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
OUT_DIR="$CACHE_DIR/kube-network-policies/$VERSION"
BIN="$OUT_DIR/kube-network-policies"
KEY="$( { echo "$VERSION"; cat "$0" images/network-policies/*; } | sha256sum | cut -c1-12)"
IMAGE=localhost/pdmtp-kind/kube-network-policies:$VERSION-$KEY

if podman image exists "$IMAGE"; then
  log "kube-network-policies image up to date: $IMAGE"
  echo "$IMAGE"
  exit 0
fi

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false"
if [[ ! -x $BIN || "$(cat "$OUT_DIR/.stamp" 2>/dev/null)" != "$KEY" ]]; then
  command -v go >/dev/null || { echo "error: go is not on PATH" >&2; exit 1; }
  src="$CACHE_DIR/build/kube-network-policies-$VERSION"
  log "kube-network-policies $VERSION: building"
  dir="$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [[ -d $dir ]] || { echo "error: go mod download $MODULE@$VERSION gave no directory" >&2; exit 1; }
  rm -rf "$src" && mkdir -p "$(dirname "$src")"
  cp -r "$dir" "$src" && chmod -R u+w "$src"
  pkg="$src/pkg/networkpolicy"
  cp images/network-policies/xtqueue.go "$pkg/zz_pdmtp_xtqueue.go"
  sed -i \
    -e 's/&expr\.Queue{Num: uint16(c\.config\.QueueID)}/xtQueue(c.config.QueueID)/' \
    -e 's/queue\.Flag = expr\.QueueFlagBypass/xtQueueBypass(queue)/' \
    -e 's/&expr\.Queue{Num: uint16(n\.nfQueueID), Flag: expr\.QueueFlagBypass}/xtQueueBypass(xtQueue(n.nfQueueID))/' \
    "$pkg"/*.go
  if left="$(grep -rn --include='*.go' --exclude='*_test.go' --exclude='zz_pdmtp_*' 'expr\.Queue' "$src/pkg" "$src/cmd")"; then
    echo "error: $MODULE $VERSION builds nftables queue expressions the substitution missed:" >&2
    echo "$left" >&2
    exit 1
  fi
  mkdir -p "$OUT_DIR"
  (cd "$src" && go build -ldflags "-s -w" -o "$BIN" ./cmd)
  echo "$KEY" >"$OUT_DIR/.stamp"
  rm -rf "$src"
fi

log "image $IMAGE"
ctx="$(mktemp -d)"
trap 'rm -rf "$ctx"' EXIT
cp "$BIN" "$ctx/kube-network-policies"
podman build --quiet --network none -f images/network-policies/Containerfile -t "$IMAGE" "$ctx" >/dev/null
# Earlier builds are superseded.
podman images --format '{{.Repository}}:{{.Tag}}' localhost/pdmtp-kind/kube-network-policies |
  grep -vx -e "$IMAGE" | xargs -r podman rmi >/dev/null 2>&1 || true
echo "$IMAGE"
