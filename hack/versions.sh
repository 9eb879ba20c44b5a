# shellcheck shell=bash disable=SC2034 # sets the pins for its caller
# Sourced by the scripts in hack/: sets each pin of versions.env (the repository's one pins file)
# as a shell variable, e.g. K8S_VERSION. PDMTP_<KEY> in the environment overrides <KEY>. The
# rules are those of hack/lib/versions.py, which reads the file for the Python code.

versions_file="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/versions.env"

load_versions() {
  local line key override number=0
  local -A seen=()
  while IFS= read -r line || [[ -n $line ]]; do
    number=$((number + 1))
    [[ $line =~ ^[[:space:]]*(#|$) ]] && continue
    if [[ ! $line =~ ^([A-Z][A-Z0-9_]*)=([A-Za-z0-9._+-]+)$ ||
      -n ${seen[${BASH_REMATCH[1]}]:-} ]]; then
      echo "error: $versions_file:$number: expected a new KEY=value, got: $line" >&2
      return 1
    fi
    key=${BASH_REMATCH[1]}
    seen[$key]=1
    override=PDMTP_$key
    printf -v "$key" '%s' "${!override:-${BASH_REMATCH[2]}}"
  done <"$versions_file"
}

load_versions
