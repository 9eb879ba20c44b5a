#!/usr/bin/env bash
# Wait until the API server serves each named CRD's resources: the CRD is Established and a list
# of each served version answers. Use it after applying CRDs and before creating their objects.
#
#   hack/wait-crds.sh [--timeout SECONDS] CRD_NAME...      (KUBECTL: the kubectl to run)
#
# Why not `kubectl wait`: right after the apply of a large CRD (ours is ~350 KB) the API server
# has not yet written status.conditions (it is null), and kubectl 1.36 fails at once instead of
# waiting, with --for=condition=Established ("accessor error: <nil> is of the type <nil>, expected
# []interface{}") and with --for=jsonpath='{.status.conditions[?(...)]...}' ("<nil> is not array or
# slice and cannot be filtered") alike: 2 and 2 of 4 tries each on the local control plane. And
# Established alone is not enough: the handler of the new resource and discovery can lag a moment
# behind it, and a create in that window fails with 404 ("no matches for kind").
set -euo pipefail

KUBECTL=${KUBECTL:-kubectl}
timeout=60
if [[ ${1:-} == --timeout ]]; then
  timeout=$2
  shift 2
fi
(($# > 0)) || {
  echo "usage: $0 [--timeout SECONDS] CRD_NAME..." >&2
  exit 2
}

deadline=$((SECONDS + timeout))
for crd in "$@"; do
  state="not created"
  while :; do
    # Every probe reads the API server: jsonpath and --raw bypass kubectl's discovery cache.
    if established=$("$KUBECTL" get crd "$crd" --request-timeout=10s \
      -o jsonpath='{.status.conditions[?(@.type=="Established")].status}' 2>/dev/null); then
      if [[ $established == True ]]; then
        read -r group plural versions < <("$KUBECTL" get crd "$crd" --request-timeout=10s -o \
          jsonpath='{.spec.group} {.spec.names.plural} {.spec.versions[?(@.served==true)].name}{"\n"}') || true
        served=0
        for version in $versions; do
          served=1
          "$KUBECTL" get --raw "/apis/$group/$version/$plural?limit=1" --request-timeout=10s \
            >/dev/null 2>&1 || { served=0 && break; }
        done
        if ((served)); then
          echo "customresourcedefinition/$crd served ($group: $versions)"
          break
        fi
        state="Established, not yet served"
      else
        state="not Established yet"
      fi
    fi
    if ((SECONDS >= deadline)); then
      echo "error: customresourcedefinition/$crd: $state after ${timeout}s" >&2
      exit 1
    fi
    sleep 0.5
  done
done
