#!/usr/bin/env python3
"""Check the Helm chart (charts/pdmtp) against deploy/, the install it must equal.

    make chart-check        (make lint runs it; it builds helm and kubectl first)

1. `helm template pdmtp charts/pdmtp -n pdmtp-system --set image.tag=dev` and
   `kubectl kustomize deploy/` give the same objects, kind and name for kind and name, equal in
   every field once Helm's own labels (helm.sh/chart, app.kubernetes.io/managed-by, instance,
   version) and the crds.keep annotation are dropped, and deploy/'s Namespace (Helm's to make)
   is left out: RBAC rules, args, probes, security contexts, resources, CRD schemas, the
   deletion guard. A difference is printed as a diff per object.
2. `helm lint --strict` (at versions.env's K8S_VERSION) passes with the default values and with
   values that turn every option on (watchNamespaces, webhook, the monitors, the alert rules and
   the dashboard, crds.keep=false, debug logging).

PDMTP_HELM and PDMTP_KUBECTL name the binaries (default: the cached builds of the pins).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack" / "lib"))

from chart import CHART, HelmError, documents, drift, helm_binary, render, run_helm  # noqa: E402
from versions import read_versions  # noqa: E402

EVERY_OPTION = [
    "watchNamespaces={serving,batch}",
    "webhook.enabled=true",
    "metrics.serviceMonitor.enabled=true",
    "metrics.podMonitor.enabled=true",
    "metrics.prometheusRule.enabled=true",
    "metrics.dashboard.enabled=true",
    "crds.keep=false",
    "logLevel=debug",
    "podAnnotations.example\\.com/team=serving",
]


def kubectl_binary() -> Path:
    named = os.environ.get("PDMTP_KUBECTL")
    if named:
        return Path(named)
    cache = Path(os.environ.get("PDMTP_CACHE_DIR") or Path.home() / ".cache" / "pdmtp")
    return cache / "bin" / read_versions()["K8S_VERSION"] / "kubectl"


def main() -> int:
    helm = helm_binary()
    kubectl = kubectl_binary()
    missing = [str(p) for p in (helm, kubectl) if p is None or not os.access(p, os.X_OK)]
    if helm is None or missing:
        print(f"error: missing {missing}; run `make helm-bin cluster-bins`", file=sys.stderr)
        return 2
    kustomized = subprocess.run(
        [str(kubectl), "kustomize", str(REPO / "deploy")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    problems = drift(render(helm, sets=["image.tag=dev"]), documents(kustomized))
    for problem in problems:
        print(problem, file=sys.stderr)
    if problems:
        print(f"error: charts/pdmtp and deploy/ differ ({len(problems)} objects)", file=sys.stderr)
        return 1
    # Deprecation checks at the Kubernetes version the repository pins.
    lint = ["lint", "--strict", "--kube-version", read_versions()["K8S_VERSION"], str(CHART)]
    try:
        run_helm(helm, *lint)
        run_helm(helm, *lint, *[f for s in EVERY_OPTION for f in ("--set", s)])
    except HelmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("charts/pdmtp renders what deploy/ installs; helm lint --strict passes", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
