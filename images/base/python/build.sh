#!/usr/bin/env bash
# The local stand-in for python:3.11-slim-bookworm, built from Debian packages because no
# registry is reachable here: `mmdebstrap` makes a bookworm rootfs and `podman import` turns it
# into an image.
#
#   images/base/python/build.sh IMAGE [LABEL=VALUE ...]     (run by hack/images.py)
#
# How it differs from the upstream image, and why that is enough for images/{operator,router}:
# - CPython is Debian's python3.11 (3.11.2 plus Debian's security fixes) in /usr/bin, not a
#   3.11.13 built from source in /usr/local; /usr/local/bin/python, python3, pip and pip3 are
#   symlinks so the Dockerfiles' `/usr/local/bin/python` and bare `pip` work unchanged. Both are
#   CPython 3.11 on glibc 2.36, so the router's hash-pinned cp311 manylinux wheels are the same.
# - pip is Debian's 23.0.1 (upstream ships a newer pip); `pip --python` and `--require-hashes`,
#   which the Dockerfiles use, both work with it. The PEP 668 EXTERNALLY-MANAGED marker is
#   removed, as upstream has none.
# - The packages are a minbase + python3, python3-venv, python3-pip, ca-certificates, netbase
#   and tzdata, close to upstream's runtime set; apt sources point at deb.debian.org (bookworm,
#   -updates, -security), so a Dockerfile's `apt-get install` works as on upstream.
set -euo pipefail

image="${1:?usage: build.sh IMAGE [LABEL=VALUE ...]}"
shift

mirror="http://deb.debian.org/debian"
security="http://deb.debian.org/debian-security"
packages="python3,python3-venv,python3-pip,ca-certificates,netbase,tzdata"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# merged-usr hook: bookworm's layout without installing the usrmerge converter (and its perl).
# No recommends, as upstream's slim images. The customize hook runs in the finished rootfs.
mmdebstrap --variant=minbase --quiet \
  --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
  --aptopt='APT::Install-Recommends "false"' \
  --include="$packages" \
  --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED' \
  --customize-hook='for n in python python3; do ln -sf /usr/bin/python3 "$1/usr/local/bin/$n"; done' \
  --customize-hook='for n in pip pip3; do ln -sf /usr/bin/pip3 "$1/usr/local/bin/$n"; done' \
  bookworm "$work/rootfs.tar" \
  "deb $mirror bookworm main" \
  "deb $mirror bookworm-updates main" \
  "deb $security bookworm-security main"

changes=(
  --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin'
  --change 'ENV LANG=C.UTF-8'
  --change 'CMD ["python3"]'
)
for label in "$@"; do
  changes+=(--change "LABEL $label")
done
podman import --quiet "${changes[@]}" "$work/rootfs.tar" "$image" >/dev/null
podman run --rm --network none "$image" python -c 'import ssl, venv, pip; print("python base ok")'
