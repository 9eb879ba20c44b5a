"""Kubernetes' core/v1 schemas in the CRD and in the offline check (pdmtp.api.corev1)."""

from __future__ import annotations

import json
from typing import Any

from builders import pdd
from pdmtp.admission import children
from pdmtp.api import corev1
from pdmtp.api.crd import crd, openapi_schema
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.core.validation import validate
from versions import read_versions


def test_the_snapshot_is_of_the_pinned_kubernetes() -> None:
    assert corev1.snapshot()["kubernetes"] == read_versions(environ={})["K8S_VERSION"]


def test_the_crd_embeds_the_core_schemas_with_their_list_map_keys() -> None:
    pod = openapi_schema()["properties"]["spec"]["properties"]["pod"]["properties"]
    volumes, mounts = pod["volumes"], pod["volumeMounts"]
    assert volumes["x-kubernetes-list-map-keys"] == ["name"]
    assert mounts["x-kubernetes-list-map-keys"] == ["mountPath"]
    assert "persistentVolumeClaim" in volumes["items"]["properties"]
    assert volumes["items"]["properties"]["name"]["maxLength"] == 63  # ours, over Kubernetes'
    spread = pod["topologySpreadConstraints"]
    assert spread["x-kubernetes-list-map-keys"] == ["topologyKey", "whenUnsatisfiable"]
    assert spread["maxItems"] == 16
    assert set(spread["items"]["required"]) == {"maxSkew", "topologyKey", "whenUnsatisfiable"}
    sizes = volumes["items"]["properties"]["emptyDir"]["properties"]["sizeLimit"]
    assert sizes["x-kubernetes-int-or-string"] is True and "pattern" in sizes
    env = openapi_schema()["properties"]["spec"]["properties"]["prefill"]["properties"]["env"]
    core_env = corev1.snapshot()["fields"]["Container.env"]
    assert env["x-kubernetes-list-map-keys"] == core_env["x-kubernetes-list-map-keys"]


def test_no_defaults_inside_the_embedded_schemas() -> None:
    # A default would turn "required" into "defaulted" (maxSkew: 0) and must pass the enum.
    def walk(node: Any) -> None:
        if isinstance(node, dict):
            assert "default" not in node
            for sub in node.values():
                walk(sub)
        elif isinstance(node, list):
            for sub in node:
                walk(sub)

    walk(openapi_schema()["properties"]["spec"]["properties"]["pod"])


def test_the_crd_fits_a_client_side_apply() -> None:
    # kubectl apply (client side) stores the object in an annotation of at most 256 KiB.
    size = len(json.dumps(crd(), separators=(",", ":")))
    assert size < 256 * 1024 * 0.75, size


def test_problems_in_the_api_servers_words() -> None:
    spread = corev1.schema("PodSpec.topologySpreadConstraints")
    found = corev1.problems(
        [
            {"topologyKey": "z", "whenUnsatisfiable": "Sometimes", "maxSkew": "1"},
            {"topologyKey": "z", "whenUnsatisfiable": "Sometimes", "maxSkew": 1, "skew": 1},
        ],
        spread,
    )
    assert sorted(found) == sorted([
        ("[0].maxSkew", 'Invalid value: "1": must be an integer'),
        ("[0].whenUnsatisfiable", 'Unsupported value: "Sometimes": supported values: '
         '"DoNotSchedule", "ScheduleAnyway"'),
        ("[1].whenUnsatisfiable", 'Unsupported value: "Sometimes": supported values: '
         '"DoNotSchedule", "ScheduleAnyway"'),
        ("[1].skew", "unknown field"),
        ("[1]", 'Duplicate value: {"topologyKey":"z","whenUnsatisfiable":"Sometimes"}'),
    ])  # fmt: skip
    volumes = corev1.schema("PodSpec.volumes")
    ok = [{"name": "a", "emptyDir": {"sizeLimit": "1Gi"}}, {"name": "b", "secret": {}}]
    assert corev1.problems(ok, volumes) == []
    bad = [{"name": "a", "emptyDir": {"sizeLimit": "lots"}}]
    assert corev1.problems(bad, volumes)[0][0] == "[0].emptyDir.sizeLimit"


def test_a_full_pod_section_passes_and_renders() -> None:
    pod = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "podSecurityContext": {"runAsUser": 1000, "fsGroup": 1000, "runAsNonRoot": True},
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
            {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
        ],
        "volumeMounts": [
            {"name": "data", "mountPath": "/data", "readOnly": True},
            {"name": "scratch", "mountPath": "/scratch", "mountPropagation": "None"},
        ],
    }
    body = pdd("full").mtp(3, modules=3).dict()
    body["spec"]["pod"] = pod
    verdict = validate(body)
    assert verdict.compatible, verdict.message()
    kids = children(
        PDDeployment.model_validate({**body, "metadata": {"name": "full", "namespace": "ns"}})
    )
    assert {k["kind"] for k in kids} >= {"Deployment", "Service"}
    assert all("ownerReferences" not in k["metadata"] for k in kids)
    prefill = next(k for k in kids if k["metadata"]["name"].endswith("-prefill"))
    spec = prefill["spec"]["template"]["spec"]
    assert {"name": "data", "persistentVolumeClaim": {"claimName": "data"}} in spec["volumes"]
    assert spec["securityContext"]["runAsUser"] == 1000


def test_mounts_resolve_against_the_roles_effective_volumes() -> None:
    body = pdd("m").mtp(3, modules=3).dict()
    body["spec"]["pod"] = {"volumes": [{"name": "data", "emptyDir": {}}]}
    body["spec"]["prefill"]["pod"] = {"volumeMounts": [{"name": "data", "mountPath": "/d"}]}
    assert validate(body).compatible  # the role's mounts use spec.pod's volumes
    body["spec"]["decode"]["pod"] = {
        "volumes": [{"name": "other", "emptyDir": {}}],
        "volumeMounts": [{"name": "data", "mountPath": "/d"}],
    }
    assert "must name a volume" in validate(body).message()  # the role's volumes replace them
