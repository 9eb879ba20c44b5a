#!/usr/bin/env python3
"""Refresh operator/pdmtp/api/corev1.json: the core/v1 schemas the PDDeployment CRD embeds.

`pdmtp crd` inlines Kubernetes' own schemas for the free-form pod fields (affinity, spread
constraints, the pod security context, volumes, mounts), as kubebuilder does. Generation must be
offline and reproducible, so the schemas come from this committed snapshot, taken from the
OpenAPI v3 document (`/openapi/v3/api/v1`) of the local control plane at the pinned Kubernetes
version (versions.env K8S_VERSION):

    make cluster-bins && .venv/bin/python hack/corev1-snapshot.py     # then: make generate

The snapshot keeps the named PodSpec/Container fields (with their list-map markers) and every
definition they reach, without descriptions; ObjectMeta (inside ephemeral volume claim templates)
is kept free-form, as kubebuilder does for embedded object metadata. `--kubeconfig` reads a
running API server instead (loopback only) of starting one.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack" / "lib"))

from localcluster import K8S_VERSION, LocalCluster  # noqa: E402

OUTPUT = REPO / "operator" / "pdmtp" / "api" / "corev1.json"
PREFIX = "io.k8s.api.core.v1."
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
# The fields the CRD embeds (pdmtp.api.corev1 names them the same way).
FIELDS = {
    "PodSpec": ("affinity", "securityContext", "topologySpreadConstraints", "volumes"),
    "Container": ("env", "volumeMounts"),
}
# Schema keys that say nothing a validator or the CRD uses. Defaults go too: the API server fills
# them in for its own types after decoding (`maxSkew: 0`, `whenUnsatisfiable: ""`), but in a CRD a
# default would turn "required" into "defaulted" and is checked against the enum.
DROPPED = frozenset(
    {
        "description",
        "default",
        "discriminator",
        "x-kubernetes-patch-strategy",
        "x-kubernetes-patch-merge-key",
        "x-kubernetes-unions",
    }
)


def short(ref: str) -> str:
    name = ref.rsplit("/", 1)[-1]
    return name.removeprefix(PREFIX) if name.startswith(PREFIX) else name


def strip(node: Any, reached: set[str]) -> Any:
    """`node` without descriptions; $refs shortened and collected in `reached`."""
    if isinstance(node, list):
        return [strip(item, reached) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in DROPPED:
            continue
        if key == "$ref":
            reached.add(value.rsplit("/", 1)[-1])
            out[key] = short(value)
        elif key == "properties":
            out[key] = {name: strip(sub, reached) for name, sub in value.items()}
        else:
            out[key] = strip(value, reached)
    return out


def snapshot(document: dict[str, Any], version: str) -> dict[str, Any]:
    schemas: dict[str, Any] = document["components"]["schemas"]
    reached: set[str] = set()
    fields: dict[str, Any] = {}
    for owner, names in FIELDS.items():
        props = schemas[PREFIX + owner]["properties"]
        for name in names:
            fields[f"{owner}.{name}"] = strip(props[name], reached)
    definitions: dict[str, Any] = {}
    done: set[str] = set()
    while reached - done:
        full = sorted(reached - done)[0]
        done.add(full)
        if full == OBJECT_META:
            definitions[short(full)] = {
                "type": "object",
                "x-kubernetes-preserve-unknown-fields": True,
            }
            continue
        definitions[short(full)] = strip(schemas[full], reached)
    return {
        "kubernetes": version,
        "source": "/openapi/v3/api/v1",
        "generatedBy": "hack/corev1-snapshot.py",
        "fields": fields,
        "definitions": dict(sorted(definitions.items())),
    }


def fetch(kubeconfig: Path | None) -> tuple[dict[str, Any], str]:
    if kubeconfig is not None:
        from kubernetes import config  # the venv's client; only for an existing cluster
        from loopback import is_loopback_url

        api = config.new_client_from_config(config_file=str(kubeconfig))
        if not is_loopback_url(api.configuration.host):
            raise SystemExit(f"{kubeconfig}: {api.configuration.host} is not loopback")

        def get(path: str) -> Any:
            method, url, headers, _, _ = api.param_serialize(
                "GET", path, auth_settings=["BearerToken"]
            )
            return json.loads(api.call_api(method, url, header_params=headers).read())

        return get("/openapi/v3/api/v1"), get("/version")["gitVersion"]
    with tempfile.TemporaryDirectory(prefix="pdmtp-openapi-") as tmp:
        cluster = LocalCluster(Path(tmp), nodes=0, die_with_parent=True)
        cluster.start()
        try:
            document = cluster.api("GET", "/openapi/v3/api/v1", timeout=60)
            version = cluster.api("GET", "/version")["gitVersion"]
        finally:
            cluster.stop()
    return document, version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kubeconfig", type=Path, help="read this (loopback) cluster instead")
    parser.add_argument("--output", type=Path, default=OUTPUT)
    args = parser.parse_args()
    document, version = fetch(args.kubeconfig)
    if version != K8S_VERSION:
        print(
            f"warning: the API server runs {version}, versions.env pins {K8S_VERSION}",
            file=sys.stderr,
        )
    args.output.write_text(
        json.dumps(snapshot(document, version), indent=1, sort_keys=False) + "\n"
    )
    output = args.output.resolve()
    print(
        f"wrote {output.relative_to(REPO) if output.is_relative_to(REPO) else output} ({version})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
