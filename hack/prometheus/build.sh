#!/usr/bin/env bash
# Build prometheus and promtool for the chart's alert checks (promtool check/test rules) and the
# kind tier's alert test (tests/e2e/promkit.py runs prometheus on 127.0.0.1), from the Go module
# github.com/prometheus/prometheus and nothing else: no release download. The module has no
# replace directives, so a plain `go install module/cmd/...@version` builds it.
#
# Tags: netgo as upstream's release (.promu.yml); no builtinassets, because the tests read the
# HTTP API and the web UI's assets are an npm build; remove_all_sd + enable_kubernetes_sd keep the
# one service discovery the kind test uses and drop the cloud SDKs (most of a cold build).
#
#   hack/prometheus/build.sh   progress on stderr; prints the binaries' directory on stdout
#   PDMTP_CACHE_DIR            cache root (default ~/.cache/pdmtp); the binaries land in
#                              prometheus/<version>/ (prometheus, promtool), stamped with the hash
#                              of the version and this script; a second run is a no-op
#   PDMTP_BUILD_PARALLEL       go build -p (2)
#   the version is versions.env's PROMETHEUS_VERSION (the Go module's tag: v0.3XX.0 is 3.XX.0)
set -euo pipefail
# shellcheck source=hack/lock.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lock.sh"
run_locked prometheus "$@"
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
log() { printf '[%s] %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }

# shellcheck source=hack/versions.sh
source hack/versions.sh

VERSION=$PROMETHEUS_VERSION
MODULE=github.com/prometheus/prometheus
CACHE_DIR="${PDMTP_CACHE_DIR:-$HOME/.cache/pdmtp}"
OUT_DIR="$CACHE_DIR/prometheus/$VERSION"
PARALLEL="${PDMTP_BUILD_PARALLEL:-2}"
KEY="$( { echo "$VERSION"; cat "$here/build.sh"; } | sha256sum | cut -c1-12)"

if [[ "$(cat "$OUT_DIR/.stamp" 2>/dev/null)" == "$KEY" && -x $OUT_DIR/prometheus &&
  -x $OUT_DIR/promtool ]]; then
  log "prometheus $VERSION up to date in $OUT_DIR ($KEY)"
  echo "$OUT_DIR"
  exit 0
fi

command -v go >/dev/null || { echo "error: go is not on PATH" >&2; exit 1; }
# Static binaries, the local toolchain only. The module's version is v0.3XX.0; the release it
# reports (`prometheus --version`, build_info) is 3.XX.0, as upstream's own build stamps it.
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-trimpath -buildvcs=false"
[[ $VERSION =~ ^v0\.([0-9]+)([0-9]{2})\.([0-9]+)$ ]] ||
  { echo "error: PROMETHEUS_VERSION $VERSION is not a v0.3XX.Y module tag" >&2; exit 1; }
release="${BASH_REMATCH[1]}.$((10#${BASH_REMATCH[2]})).${BASH_REMATCH[3]}"
ldflags="-s -w -X github.com/prometheus/common/version.Version=$release"
tags="netgo,remove_all_sd,enable_kubernetes_sd"
start=$SECONDS

log "prometheus $VERSION ($release): building into $OUT_DIR ($KEY)"
staging="$OUT_DIR.new"
rm -rf "$staging" && mkdir -p "$staging"
GOBIN="$staging" go install -p "$PARALLEL" -tags "$tags" -ldflags "$ldflags" \
  "$MODULE/cmd/prometheus@$VERSION" "$MODULE/cmd/promtool@$VERSION"
for binary in prometheus promtool; do
  got="$("$staging/$binary" --version 2>&1 | sed -n 's/^[a-z]*, version \([^ ]*\).*/\1/p')"
  [[ $got == "$release" ]] || {
    echo "error: the build says it is $binary $got, not $release" >&2
    exit 1
  }
done
echo "$KEY" >"$staging/.stamp"
rm -rf "$OUT_DIR" && mv "$staging" "$OUT_DIR"
log "prometheus $VERSION built in $((SECONDS - start)) s: $OUT_DIR"
echo "$OUT_DIR"
