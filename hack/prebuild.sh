#!/usr/bin/env bash
# Warm the build caches while `make test` runs its first tiers (hack/with-prebuild.sh starts this
# in the background): the Go builds (control plane, helm, prometheus, KEDA, kind,
# kube-network-policies) and the images (the local bases, operator, router, engine; the kind
# node image). Every build here is one the tiers run themselves when they need it; each holds a
# lock (hack/lock.sh, build_images.py), so a tier that gets there first waits for this build
# rather than doing it twice. On a warm machine each is a lookup (seconds). Best effort: a
# failure is logged and the tier that needs the build runs it again, in the foreground, where its
# failure counts.
#
# Niced: the builds take the CPU the tiers leave idle (the cluster tier and kind wait on pods much
# of the time). The I/O class is idle too, but the mq-deadline scheduler ignores it: the image
# builds (gigabytes written) slow whatever reads the disk beside them, so they go while the
# cluster tier runs, before the engine and CPU P/D tiers load vLLM. Order: what the kind lane
# needs first (it is the longest, and starts at once); KEDA (the longest cold build, CPU only)
# last, for the cluster lane's last tier.
#
#   hack/prebuild.sh    progress and a per-build time on stdout
set -uo pipefail
cd "$(dirname "$0")/.."

failed=0
build() { # name command...
  local name=$1 start=$SECONDS
  shift
  # Niced again, should a tier that waited for the last build have lifted this
  # (hack/lift-prebuild.sh).
  echo 19 >/proc/self/autogroup 2>/dev/null
  if "$@" >/dev/null; then
    printf 'prebuild: %-22s %4d s\n' "$name" $((SECONDS - start))
  else
    failed=$((failed + 1))
    printf 'prebuild: %-22s FAILED after %d s (the tier that needs it builds it again)\n' \
      "$name" $((SECONDS - start))
  fi
}

# kind's lane starts at once and is the longest: what it needs before its cluster comes first
# (it builds those itself, in the foreground, when it gets there first). The engine image, which
# only the images tier runs, is built before kind's tests begin: a podman build holds podman's
# storage, and the node freezes and execs of kind's tests would wait on it (hack/kind-e2e.sh
# waits for the image builds before its tests).
build cluster-bins hack/build-cluster-bins.sh
build kind-images python3 hack/lib/build_images.py build base-python operator router
build engine-image python3 hack/lib/build_images.py build engine
build kind-bins hack/kind/build-bins.sh
build network-policies hack/kind/build-network-policies.sh
build kind-node-image hack/kind/build-node-image.sh
build helm hack/helm/build.sh
build prometheus hack/prometheus/build.sh
build keda hack/keda/build.sh

# Every Go build is done and its binaries cached by version, so Go's build cache (~8 GB after a
# cold run) only speeds the rebuild a pin change brings. The disk is shared, and kind needs 25 GB
# free for the engine image (hack/kind-e2e.sh): give it back, unless a build failed (the tier
# that needs it builds it again, and the cache helps).
if ((failed == 0)) && command -v go >/dev/null; then
  cache=$(go env GOCACHE)
  size=$(du -sm "$cache" 2>/dev/null | cut -f1)
  go clean -cache && printf 'prebuild: %-22s %4d MB freed\n' "go build cache" "${size:-0}"
fi
