"""The Helm chart (charts/pdmtp) as data: rendering it with the helm CLI, and the comparison with
deploy/ that keeps the two installs the same (hack/chart-check.py, the unit and cluster tiers).

The helm binary is the one hack/helm/build.sh builds (`make helm-bin`): PDMTP_HELM names it;
without that, the cached build of versions.env's HELM_VERSION is used when present.
"""

from __future__ import annotations

import difflib
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import yaml
from versions import read_versions

REPO: Final = Path(__file__).resolve().parents[2]
CHART: Final = REPO / "charts" / "pdmtp"
RELEASE: Final = "pdmtp"
NAMESPACE: Final = "pdmtp-system"

Obj = dict[str, Any]
Key = tuple[str, str]
"""(kind, name): names are fixed and unique per kind across the install."""

HELM_LABELS: Final = frozenset(
    {
        "helm.sh/chart",
        "app.kubernetes.io/managed-by",
        "app.kubernetes.io/instance",
        "app.kubernetes.io/version",
    }
)
"""Labels the chart adds and deploy/ has no use for (it is not a release)."""
HELM_ANNOTATIONS: Final = frozenset({"helm.sh/resource-policy"})
"""crds.keep's annotation (default on): deploy/ has no uninstall that could keep anything."""
KEEP: Final = "helm.sh/resource-policy"
ALLOW_DELETE: Final = "pdmtp.io/allow-delete"


def helm_binary() -> Path | None:
    """PDMTP_HELM, else the cached build of the pinned version; None when neither exists."""
    named = os.environ.get("PDMTP_HELM")
    if named:
        return Path(named)
    cache = Path(os.environ.get("PDMTP_CACHE_DIR") or Path.home() / ".cache" / "pdmtp")
    cached = cache / "helm" / read_versions()["HELM_VERSION"] / "helm"
    return cached if os.access(cached, os.X_OK) else None


def run_helm(helm: Path, *args: str, env: Mapping[str, str] | None = None) -> str:
    """`helm args...`; its stdout. Raises HelmError with stderr on a non-zero exit."""
    done = subprocess.run(
        [str(helm), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    if done.returncode != 0:
        raise HelmError(f"helm {' '.join(args)}: exit {done.returncode}\n{done.stderr}")
    return done.stdout


class HelmError(RuntimeError):
    pass


class _Loader(yaml.SafeLoader):
    """YAML 1.2's floats as well: kustomize writes 1.0e-06 as 1e-06, which YAML 1.1 (PyYAML)
    reads as a string. (An int and an equal float already compare equal.)"""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][-+]?[0-9]+)$"),
    list("-+0123456789."),
)


def documents(text: str) -> list[Obj]:
    return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc]


def render(helm: Path, *args: str, sets: Iterable[str] = ()) -> list[Obj]:
    """`helm template pdmtp charts/pdmtp -n pdmtp-system` with --set each of `sets`."""
    flags = [f for s in sets for f in ("--set", s)]
    return documents(
        run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, *flags, *args)
    )


def by_key(objects: Iterable[Obj]) -> dict[Key, Obj]:
    keyed: dict[Key, Obj] = {}
    for obj in objects:
        key = (obj["kind"], obj["metadata"]["name"])
        if key in keyed:
            raise ValueError(f"{key[0]}/{key[1]} appears twice")
        keyed[key] = obj
    return keyed


def _strip_metadata(metadata: Obj) -> None:
    for field, dropped in (("labels", HELM_LABELS), ("annotations", HELM_ANNOTATIONS)):
        kept = {k: v for k, v in (metadata.get(field) or {}).items() if k not in dropped}
        if kept:
            metadata[field] = kept
        else:
            metadata.pop(field, None)


def without_helm(obj: Obj) -> Obj:
    """A copy without what only a Helm release carries (labels, the keep annotation), on the
    object and its pod template."""
    copy: Obj = yaml.safe_load(yaml.safe_dump(obj))
    _strip_metadata(copy["metadata"])
    template = (copy.get("spec") or {}).get("template")
    if isinstance(template, dict) and "metadata" in template:
        _strip_metadata(template["metadata"])
    return copy


def drift(chart: Iterable[Obj], kustomized: Iterable[Obj]) -> list[str]:
    """How the chart's objects differ from deploy/'s, object by object (kind and name), after
    dropping Helm's own labels and annotations and deploy/'s Namespace (the release's namespace
    is Helm's to make). Empty when they install the same thing."""
    ours = {k: without_helm(o) for k, o in by_key(chart).items()}
    theirs = {k: o for k, o in by_key(kustomized).items() if k[0] != "Namespace"}
    problems = [f"only in the chart: {k}/{n}" for k, n in sorted(ours.keys() - theirs.keys())]
    problems += [f"only in deploy/: {k}/{n}" for k, n in sorted(theirs.keys() - ours.keys())]
    for key in sorted(ours.keys() & theirs.keys()):
        if ours[key] != theirs[key]:
            a = yaml.safe_dump(theirs[key], sort_keys=True).splitlines()
            b = yaml.safe_dump(ours[key], sort_keys=True).splitlines()
            diff = difflib.unified_diff(a, b, "deploy/", "charts/pdmtp", lineterm="", n=3)
            problems.append(f"{key[0]}/{key[1]} differs:\n" + "\n".join(diff))
    return problems
