#!/usr/bin/env bash
# Build the helm CLI for the chart checks (make chart-check) and the cluster tier's chart test,
# from the Go module helm.sh/helm/v4 and nothing else: no release download. The module has no
# replace directives, so a plain `go install module@version` builds it.
#
#   hack/helm/build.sh    progress on stderr; prints the binary's path on stdout
#   PDMTP_CACHE_DIR       cache root (default ~/.cache/pdmtp); the binary lands in
#                         helm/<version>/helm, stamped with the hash of the version and this
#                         script; a second run is a no-op
#   the version is versions.env's HELM_VERSION
set -euo pipefail
# Concurrent callers (parallel make targets, two test sessions, the background builds) wait for
# one build.
# shellcheck source=hack/lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lock.sh"
run_locked helm "$@"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# shellcheck source=hack/versions.sh
source hack/versions.sh

VERSION=$HELM_VERSION
MODULE=helm.sh/helm/v4
CACHE_DIR="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
OUT_DIR="$CACHE_DIR/helm/$VERSION"
KEY="$( { echo "$VERSION"; cat "$here/build.sh"; } | sha256sum | cut -c1-12)"

up_to_date() { [[ "$(cat "$OUT_DIR/.stamp" 2>/dev/null)" == "$KEY" && -x $OUT_DIR/helm ]]; }

if up_to_date; then
  log "helm $VERSION up to date in $OUT_DIR ($KEY)"
  echo "$OUT_DIR/helm"
  exit 0
fi

command -v go >/dev/null || { echo "error: go is not on PATH" >&2; exit 1; }
# Static binary, the local toolchain only. Without the -X, `helm version` prints the module's
# placeholder (v4.3) instead of the release (internal/version's `version` variable).
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false"
ldflags="-s -w -X $MODULE/internal/version.version=$VERSION"
start=$SECONDS

log "helm $VERSION: building into $OUT_DIR ($KEY)"
staging="$OUT_DIR.new"
rm -rf "$staging" && mkdir -p "$staging"
GOBIN="$staging" go install -ldflags "$ldflags" "$MODULE/cmd/helm@$VERSION"
got="$("$staging/helm" version --template '{{.Version}}')"
[[ $got == "$VERSION" ]] || { echo "error: the build says it is helm $got, not $VERSION" >&2; exit 1; }
echo "$KEY" >"$staging/.stamp"
rm -rf "$OUT_DIR" && mv "$staging" "$OUT_DIR"
log "helm $VERSION built in $((SECONDS - start)) s: $OUT_DIR/helm"
echo "$OUT_DIR/helm"
