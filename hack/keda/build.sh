#!/usr/bin/env bash
# Build KEDA's operator and metrics adapter as host binaries for the cluster tier's autoscaling
# test (tests/support/keda.py runs them on 127.0.0.1 against the local control plane), from the
# Go module github.com/kedacore/keda/v2 and nothing else: no image, no release download.
#
# The module's go.mod has replace directives, so `go install ...@version` is refused; the build
# runs in a writable copy of the downloaded module instead. One change to upstream,
# adapter-metrics-loopback.patch: the adapter's own metrics listener binds 127.0.0.1 (upstream
# binds every interface and has no flag for it). The build fails if the patch stops applying.
#
#   hack/keda/build.sh    progress and timings on stderr; prints the binaries' directory on stdout
#   PDMTP_CACHE_DIR       cache root (default ~/.cache/pdmtp); the output lands in
#                         keda/v<version>/ (keda-operator, keda-adapter, crds/), stamped with the
#                         hash of the version, this script and the patch; a second run is a no-op
#   PDMTP_BUILD_PARALLEL  go build -p (2)
#   the version is versions.env's KEDA_VERSION
set -euo pipefail
# shellcheck source=hack/lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lock.sh"
run_locked keda "$@"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# shellcheck source=hack/versions.sh
source hack/versions.sh

VERSION=v$KEDA_VERSION
MODULE=github.com/kedacore/keda/v2
PATCH="$here/adapter-metrics-loopback.patch"
CACHE_DIR="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
OUT_DIR="$CACHE_DIR/keda/$VERSION"
PARALLEL="${PDMTP_BUILD_PARALLEL:-2}"
# tests/support/keda.py computes the same key to tell a stale build from a current one.
KEY="$( { echo "$VERSION"; cat "$here/build.sh" "$PATCH"; } | sha256sum | cut -c1-12)"

if [[ "$(cat "$OUT_DIR/.stamp" 2>/dev/null)" == "$KEY" && -x $OUT_DIR/keda-operator &&
  -x $OUT_DIR/keda-adapter && -f $OUT_DIR/crds/keda.sh_scaledobjects.yaml ]]; then
  log "KEDA $VERSION up to date in $OUT_DIR ($KEY)"
  echo "$OUT_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "error: go is not on PATH" >&2; exit 1; }
command -v patch >/dev/null || { echo "error: patch is not on PATH" >&2; exit 1; }
# Static binaries, the local toolchain only; the version string KEDA's own Makefile sets.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false"
ldflags="-s -w -X=$MODULE/version.Version=$KEDA_VERSION"
start=$SECONDS
step=$SECONDS
lap() { log "$1: $((SECONDS - step)) s"; step=$SECONDS; }

log "KEDA $VERSION: building into $OUT_DIR ($KEY)"
dir="$(go mod download -json "$MODULE@$VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
[[ -d $dir ]] || { echo "error: go mod download $MODULE@$VERSION gave no directory" >&2; exit 1; }
src="$CACHE_DIR/build/keda-$VERSION"
rm -rf "$src" && mkdir -p "$(dirname "$src")"
cp -r "$dir" "$src" && chmod -R u+w "$src"
trap 'rm -rf "$src"' EXIT
(cd "$src" && patch -p1 --forward --batch --no-backup-if-mismatch --quiet) <"$PATCH"
if grep -n 'Sprintf(":%v"' "$src/cmd/adapter/main.go" >&2; then
  echo "error: the adapter still binds a listener to every interface (above)" >&2
  exit 1
fi
lap "module source"
(cd "$src" && go mod download)
lap "dependencies (go mod download)"

staging="$OUT_DIR.new"
rm -rf "$staging" && mkdir -p "$staging/crds"
(cd "$src" && go build -p "$PARALLEL" -ldflags "$ldflags" -o "$staging/" ./cmd/operator ./cmd/adapter)
lap "go build ./cmd/operator ./cmd/adapter"
mv "$staging/operator" "$staging/keda-operator"
mv "$staging/adapter" "$staging/keda-adapter"
cp "$src"/config/crd/bases/*.yaml "$staging/crds/"
echo "$KEY" >"$staging/.stamp"
rm -rf "$OUT_DIR" && mv "$staging" "$OUT_DIR"
log "KEDA $VERSION built in $((SECONDS - start)) s: $OUT_DIR"
echo "$OUT_DIR"
