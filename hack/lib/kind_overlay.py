"""The kustomize overlay the kind tier installs pdmtp through: `deploy/` as users install it, with
the operator image pointed at the local build and the operator's args for the tier
(hack/kind-e2e.sh's install_pdmtp, and tests/e2e/test_upgrade.py's installs)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

OPERATOR_ARGS = ("--verification-interval-seconds=5",)
"""What the kind install adds to the operator's args: the verdict's scrapes every 5 s, not 15 (a
verdict needs several windows on each side; the verdict tests would mostly wait for them)."""


def write_overlay(
    directory: Path, base: Path, image: str, args: Sequence[str] = OPERATOR_ARGS
) -> Path:
    """A kustomization that takes `base` as it is, points its operator image at `image` and adds
    `args` to the operator's (what hack/kind-e2e.sh's install_pdmtp applies; a previous release,
    which may not know them, takes none)."""
    directory.mkdir(parents=True, exist_ok=True)
    name, _, tag = image.rpartition(":")
    adds = "".join(
        f"      - op: add\n        path: /spec/template/spec/containers/0/args/-\n"
        f"        value: {arg}\n"
        for arg in args
    )
    (directory / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\n"
        "kind: Kustomization\n"
        f"resources:\n  - {os.path.relpath(base, directory)}\n"
        f'images:\n  - name: pdmtp-operator\n    newName: {name}\n    newTag: "{tag}"\n'
        + ("patches:\n  - target: {kind: Deployment, name: pdmtp-operator}\n    patch: |-\n" + adds
           if adds else "")
    )  # fmt: skip
    return directory


if __name__ == "__main__":
    import sys

    write_overlay(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
