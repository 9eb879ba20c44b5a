#!/usr/bin/env bash
# Build the pdmtp kind node image with podman, offline: a Debian bookworm base from Debian
# packages (mmdebstrap: systemd, containerd, runc, CNI plugins, iptables), the kubelet, kubeadm
# and kubectl of the local control plane's pin, and every image the cluster runs preloaded into
# the node's containerd, each built here from Go modules (hack/build-cluster-bins.sh,
# hack/kind/build-bins.sh): kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy,
# etcd, CoreDNS and pause (static binaries on scratch; kube-proxy on a small Debian base of its
# own, as it runs iptables and conntrack). The CNI is Debian's ptp + host-local plugins,
# configured statically for one node (images/kind-node/files/etc/cni/net.d); storage is the
# in-tree host-path provisioner. Use it with hack/kind/cluster.yaml, which points kubeadm at
# these images.
#
#   hack/kind/build-node-image.sh      prints the image reference on stdout; progress on stderr
#
# Cached: the image tag carries a hash of every input (pins, package list, files, this script),
# so a second run is a lookup, and any change builds a new image. The two Debian bases are cached
# on their own (keyed by their package lists).
set -euo pipefail
# shellcheck source=hack/lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lock.sh"
run_locked kind-node-image "$@"
cd "$(dirname "$0")/../.."
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# shellcheck source=hack/podman-env.sh
source hack/podman-env.sh >&2

# shellcheck source=hack/versions.sh
source hack/versions.sh
CACHE_DIR="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
CLUSTER_BIN="$CACHE_DIR/bin/$K8S_VERSION"
REPOSITORY=localhost/pdmtp-kind
NODE_REPO=localhost/pdmtp-kind-node

# Debian packages of the node: systemd as init; containerd (1.6) and runc as the runtime; the CNI
# plugins; what the kubelet, kube-proxy and kind call on the node (iptables via nft, conntrack,
# ip, mount, modprobe, ps).
SUITE=bookworm
MIRRORS=(
  "deb http://deb.debian.org/debian bookworm main"
  "deb http://deb.debian.org/debian bookworm-updates main"
  "deb http://deb.debian.org/debian-security bookworm-security main"
)
PACKAGES=(systemd systemd-sysv dbus containerd runc containernetworking-plugins iptables nftables
  conntrack iproute2 ethtool mount util-linux kmod procps ca-certificates libseccomp2 pigz)
# kube-proxy's image: what it execs in iptables mode (iptables-nft, as on the node, and conntrack).
PROXY_PACKAGES=(iptables conntrack)

hash_of() { sha256sum | cut -c1-12; }

# ---- binaries --------------------------------------------------------------------------------
hack/build-cluster-bins.sh >&2
KIND_BIN="$(hack/kind/build-bins.sh)"
images_listed="$("$KIND_BIN/kubeadm" config images list --kubernetes-version "$K8S_VERSION")"
tag_of() { sed -n "s|.*/$1:\(.*\)\$|\1|p" <<<"$images_listed"; }
COREDNS_TAG="$(tag_of coredns)"
PAUSE_TAG="$(tag_of pause)"
[[ -n $COREDNS_TAG && -n $PAUSE_TAG ]] || { echo "error: cannot read kubeadm's image list" >&2; exit 1; }
# The names other files spell out must be the ones built here.
expect() { # file fixed-string
  grep -qF -- "$2" "$1" || { echo "error: $1 must say: $2" >&2; exit 1; }
}
expect images/kind-node/files/etc/containerd/config.toml "sandbox_image = \"$REPOSITORY/pause:$PAUSE_TAG\""
expect hack/kind/coredns.yaml "image: $REPOSITORY/coredns:$COREDNS_TAG"
expect hack/kind/cluster.yaml "imageRepository: $REPOSITORY"
expect hack/kind/cluster.yaml "imageTag: $ETCD_VERSION"

# ---- cache key ---------------------------------------------------------------------------------
BASE_KEY="$(printf '%s\n' "$SUITE" "${MIRRORS[@]}" "${PACKAGES[@]}" | hash_of)"
BASE_IMAGE="$REPOSITORY/node-base:$SUITE-$BASE_KEY"
PROXY_KEY="$(printf '%s\n' "$SUITE" "${MIRRORS[@]}" "${PROXY_PACKAGES[@]}" | hash_of)"
PROXY_BASE_IMAGE="$REPOSITORY/proxy-base:$SUITE-$PROXY_KEY"
NODE_KEY="$( {
  echo "$BASE_KEY $PROXY_KEY $K8S_VERSION $ETCD_VERSION $COREDNS_TAG $PAUSE_TAG $KIND_VERSION"
  cat "$0" hack/kind/build-bins.sh
  find images/kind-node -type f | LC_ALL=C sort | xargs sha256sum
} | hash_of)"
NODE_IMAGE="$NODE_REPO:$K8S_VERSION-$NODE_KEY"
if podman image exists "$NODE_IMAGE"; then
  log "node image up to date: $NODE_IMAGE"
  echo "$NODE_IMAGE"
  exit 0
fi
started=$SECONDS

WORK="$(mktemp -d)"
ctr_name="pdmtp-kind-node-build-$$"
cleanup() {
  podman rm -f "$ctr_name" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- Debian bases (both at once: mostly downloads) ---------------------------------------------
debian_base() { # image variant package...
  local image=$1 variant=$2 tar
  shift 2
  podman image exists "$image" && return 0
  tar="$WORK/$(basename "${image%%:*}").tar"
  log "Debian $SUITE $variant + $* (mmdebstrap) -> $image"
  # shellcheck disable=SC2016  # the hook's $1 is the rootfs, expanded by mmdebstrap
  mmdebstrap --quiet --variant="$variant" --include="$(IFS=,; echo "$*")" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
    "$SUITE" "$tar" "${MIRRORS[@]}" >&2
  podman import --quiet "$tar" "$image" >/dev/null
  rm -f "$tar"
}
debian_base "$BASE_IMAGE" minbase "${PACKAGES[@]}" &
node_base=$!
# essential: no apt in an image nothing installs into.
debian_base "$PROXY_BASE_IMAGE" essential "${PROXY_PACKAGES[@]}" &
proxy_base=$!
wait "$node_base"
wait "$proxy_base"

# ---- component images --------------------------------------------------------------------------
# name:tag:binary-dir; kubeadm looks them up under $REPOSITORY (hack/kind/cluster.yaml).
COMPONENTS=(
  "kube-apiserver:$K8S_VERSION:$CLUSTER_BIN"
  "kube-controller-manager:$K8S_VERSION:$CLUSTER_BIN"
  "kube-scheduler:$K8S_VERSION:$CLUSTER_BIN"
  "etcd:$ETCD_VERSION:$CLUSTER_BIN"
  "kube-proxy:$K8S_VERSION:$KIND_BIN"
  "coredns:$COREDNS_TAG:$KIND_BIN"
)
refs=()
for entry in "${COMPONENTS[@]}"; do
  IFS=: read -r name tag dir <<<"$entry"
  ref="$REPOSITORY/$name:$tag"
  base=scratch
  [[ $name == kube-proxy ]] && base="$PROXY_BASE_IMAGE"
  log "image $ref (from $base)"
  mkdir -p "$WORK/ctx-$name"
  cp "$dir/$name" "$WORK/ctx-$name/"
  podman build --quiet --network none -f images/kind-node/components/Containerfile \
    --build-arg BASE="$base" --build-arg NAME="$name" -t "$ref" "$WORK/ctx-$name" >/dev/null
  refs+=("$ref")
done
mkdir -p "$WORK/ctx-pause" && cp "$KIND_BIN/pause" "$WORK/ctx-pause/"
podman build --quiet --network none -f images/kind-node/components/Containerfile.pause \
  -t "$REPOSITORY/pause:$PAUSE_TAG" "$WORK/ctx-pause" >/dev/null
refs+=("$REPOSITORY/pause:$PAUSE_TAG")

# ---- node: files, binaries, preloaded images ---------------------------------------------------
log "node image $NODE_IMAGE"
podman run -d --name "$ctr_name" --privileged --network none --entrypoint sleep "$BASE_IMAGE" infinity >/dev/null
podman cp images/kind-node/files/. "$ctr_name:/"
for b in "$KIND_BIN/kubelet" "$KIND_BIN/kubeadm" "$CLUSTER_BIN/kubectl"; do
  podman cp "$b" "$ctr_name:/usr/bin/"
done
podman exec "$ctr_name" bash -euc "
  chown -R root:root /etc/containerd /etc/cni /etc/systemd /etc/sysctl.d /kind /usr/local/bin /usr/bin/kube*
  echo '$K8S_VERSION' >/kind/version
  mkdir -p /etc/kubernetes/manifests
  systemctl enable containerd.service kubelet.service
  # Units that touch the host's kernel state or consoles, which a node container must not own.
  systemctl mask systemd-binfmt.service getty@tty1.service serial-getty@.service \
    systemd-udevd.service sys-kernel-debug.mount sys-kernel-tracing.mount 2>/dev/null
  update-alternatives --query iptables | grep -q '^Value: /usr/sbin/iptables-nft'
"
# containerd's default OCI spec without process.rlimits (see files/etc/containerd/config.toml).
podman exec "$ctr_name" ctr oci spec |
  python3 -c 'import json,sys; s=json.load(sys.stdin); s["process"].pop("rlimits",None); print(json.dumps(s,indent=2))' \
    >"$WORK/cri-base.json"
podman cp "$WORK/cri-base.json" "$ctr_name:/etc/containerd/cri-base.json"

# Preload: a containerd of the node's own, only long enough to import (content only; the node
# unpacks on first use). Pinned images are never garbage-collected by the kubelet.
podman exec "$ctr_name" bash -c 'nohup containerd >/tmp/containerd.log 2>&1 &'
for _ in $(seq 50); do podman exec "$ctr_name" ctr version >/dev/null 2>&1 && break; sleep 0.2; done
podman save --quiet --multi-image-archive --format docker-archive "${refs[@]}" |
  podman exec -i "$ctr_name" ctr --namespace=k8s.io images import \
    --label=io.cri-containerd.pinned=pinned --all-platforms --no-unpack --digests - >&2
have="$(podman exec "$ctr_name" ctr --namespace=k8s.io images list -q)"
for ref in "${refs[@]}"; do
  grep -qx "$ref" <<<"$have" || { echo "error: $ref missing after import" >&2; exit 1; }
done
# PID 1 here is `sleep`, which reaps nobody: wait for containerd to be a zombie, not gone.
podman exec "$ctr_name" bash -c 'pkill -x containerd
  while ps -C containerd -o stat= | grep -qv "^Z"; do sleep 0.2; done
  rm -rf /tmp/* /run/containerd /var/log/*.log'
podman commit --quiet \
  --change 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' --change 'CMD []' \
  --change 'STOPSIGNAL SIGRTMIN+3' --change "LABEL io.pdmtp.kind-node.inputs=$NODE_KEY" \
  "$ctr_name" "$NODE_IMAGE" >/dev/null
podman tag "$NODE_IMAGE" "$NODE_REPO:$K8S_VERSION"
# Earlier builds are superseded (about 1 GB each); one still used by a cluster stays.
podman images --format '{{.Repository}}:{{.Tag}}' "$NODE_REPO" |
  grep -vx -e "$NODE_IMAGE" -e "$NODE_REPO:$K8S_VERSION" |
  xargs -r podman rmi >/dev/null 2>&1 || true
log "built $NODE_IMAGE in $((SECONDS - started)) s ($(podman image inspect --format '{{.Size}}' "$NODE_IMAGE" | awk '{printf "%.0f MiB", $1/1048576}'))"
echo "$NODE_IMAGE"
