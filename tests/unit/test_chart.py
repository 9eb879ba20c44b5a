"""The Helm chart (charts/pdmtp). Pure checks first: the values file against its schema, a
closed schema (a typo in --set fails), the chart's copy of the CRDs. Then what helm renders for
each option; those need the helm binary (PDMTP_HELM, which `make test-unit` sets; without it they
skip, and fail under PDMTP_REQUIRE_ALL=1). make chart-check holds the default rendering to
deploy/."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart import (
    ALLOW_DELETE,
    CHART,
    KEEP,
    REPO,
    HelmError,
    Obj,
    by_key,
    drift,
    helm_binary,
    render,
)

SCHEMA = json.loads((CHART / "values.schema.json").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())
KNOWN_KEYWORDS = {
    "$schema",
    "title",
    "description",
    "type",
    "enum",
    "properties",
    "additionalProperties",
    "items",
    "minLength",
    "maxLength",
    "pattern",
    "uniqueItems",
    "minimum",
    "maximum",
    "$ref",
    "definitions",
}


def schema_problems(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """The subset of JSON Schema the values schema uses (held by a test below): enough to check
    values.yaml without a jsonschema dependency; helm itself checks the rest in the tests below."""
    if "$ref" in schema:
        schema = SCHEMA["definitions"][schema["$ref"].rsplit("/", 1)[1]]
    kinds = {"object": dict, "array": list, "string": str, "boolean": bool, "integer": int}
    kinds["number"] = (int, float)  # type: ignore[assignment]
    wanted = schema.get("type")
    if wanted is not None:
        types = [wanted] if isinstance(wanted, str) else wanted
        if not any(isinstance(value, kinds[t]) for t in types) or (
            isinstance(value, bool) and "boolean" not in types
        ):
            return [f"{where or '.'}: {value!r} is not {wanted}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} not in {schema['enum']}"]
    problems: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, schema.get("additionalProperties", {}))
            if sub is False:
                problems.append(f"{where}.{key}: not allowed")
            elif isinstance(sub, dict):
                problems += schema_problems(item, sub, f"{where}.{key}")
    if isinstance(value, list):
        for i, item in enumerate(value):
            problems += schema_problems(item, schema.get("items", {}), f"{where}[{i}]")
    return problems


def object_schemas(schema: Any, where: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(schema, dict):
        if "properties" in schema:
            yield where, schema
        for key, sub in schema.items():
            yield from object_schemas(sub, f"{where}/{key}")


def test_the_default_values_satisfy_the_schema() -> None:
    assert schema_problems(VALUES, SCHEMA) == []


def test_the_schema_uses_only_keywords_the_check_above_knows() -> None:
    used: set[str] = set()

    def walk(node: Any, in_properties: bool = False) -> None:
        if isinstance(node, dict):
            for key, sub in node.items():
                if not in_properties:
                    used.add(key)
                walk(sub, key in ("properties", "definitions") and not in_properties)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(SCHEMA)
    assert used - KNOWN_KEYWORDS == set()


def test_every_level_of_the_schema_is_closed() -> None:
    """A typo at any level (`--set image.tg=x`) is refused, not ignored."""
    open_levels = [
        w for w, s in object_schemas(SCHEMA) if s.get("additionalProperties") is not False
    ]
    assert open_levels == []
    assert {"image", "metrics", "webhook", "crds", "health", "resources"} <= SCHEMA[
        "properties"
    ].keys()
    assert schema_problems({**VALUES, "imagee": {}}, SCHEMA) == [".imagee: not allowed"]
    typo = {**VALUES, "crds": {"keep": True, "instal": False}}
    assert schema_problems(typo, SCHEMA) == [".crds.instal: not allowed"]


def test_every_value_has_a_schema_and_every_schema_property_a_default() -> None:
    def paths(node: Any, schema: dict[str, Any], where: str) -> Iterator[str]:
        yield where
        props = schema.get("properties")
        if isinstance(node, dict) and props:
            for key in props:
                assert key == "global" or key in node, f"{where}.{key} has no default"
                if key in node:
                    yield from paths(node[key], props[key], f"{where}.{key}")

    assert len(list(paths(VALUES, SCHEMA, ""))) > 15


def test_the_chart_carries_the_generated_crds_unchanged() -> None:
    """`make generate` copies crds/ into the chart (it cannot read outside its directory)."""
    ours = {p.name: p.read_text() for p in (CHART / "files" / "crds").glob("*.yaml")}
    generated = {p.name: p.read_text() for p in (REPO / "crds").glob("pdmtp.io_*.yaml")}
    assert ours == generated, "charts/pdmtp/files/crds drifted: run `make generate` and commit"


def test_drift_names_each_differing_object_and_ignores_only_helms_own_metadata() -> None:
    def sa(**labels: str) -> Obj:
        return {"kind": "ServiceAccount", "metadata": {"name": "a", "labels": labels}}

    helm = {"helm.sh/chart": "pdmtp-0.1.0", "app.kubernetes.io/managed-by": "Helm"}
    namespace: Obj = {"kind": "Namespace", "metadata": {"name": "pdmtp-system"}}
    assert drift([sa(**helm, x="1")], [sa(x="1"), namespace]) == []
    differing = drift([sa(x="2")], [sa(x="1")])
    assert len(differing) == 1 and differing[0].startswith("ServiceAccount/a differs")
    assert "-    x: '1'" in differing[0] and "+    x: '2'" in differing[0]
    assert drift([], [sa()]) == ["only in deploy/: ServiceAccount/a"]


# ---- rendered by helm -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def helm() -> Path:
    found = helm_binary()
    if found is None or not os.access(found, os.X_OK):
        why = f"no helm binary (PDMTP_HELM={os.environ.get('PDMTP_HELM')!r}); run `make helm-bin`"
        if os.environ.get("PDMTP_REQUIRE_ALL") == "1":
            pytest.fail(f"helm required (PDMTP_REQUIRE_ALL=1): {why}", pytrace=False)
        pytest.skip(why)
    return found


def objects(helm: Path, *sets: str, api: str | None = None) -> dict[tuple[str, str], Obj]:
    extra = ["--api-versions", api] if api else []
    return by_key(render(helm, *extra, sets=sets))


def container(rendered: dict[tuple[str, str], Obj]) -> Obj:
    pod = rendered["Deployment", "pdmtp-operator"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == ["operator"]
    return dict(pod["containers"][0])


def grants(rules: list[Obj]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in rules
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


CLUSTER_SCOPED = {
    ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "watch"),
    ("", "namespaces", "list"),
    ("", "namespaces", "watch"),
    ("", "nodes", "list"),
    ("", "nodes", "watch"),
}
WEBHOOK_RULES = {
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations", verb)
    for verb in ("list", "watch", "create", "patch")
}


def test_defaults_watch_every_namespace_with_one_cluster_binding(helm: Path) -> None:
    rendered = objects(helm)
    op = container(rendered)
    assert (
        op["image"]
        == "pdmtp-operator:" + yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    )
    assert "imagePullPolicy" not in op
    assert op["args"] == [
        "--all-namespaces",
        "--metrics-port=9090",
        "--health-listen=0.0.0.0:8081",
        "--leader-elect",
    ]
    role = grants(rendered["ClusterRole", "pdmtp-operator"]["rules"])
    assert role >= CLUSTER_SCOPED and not role & WEBHOOK_RULES
    binding = rendered["ClusterRoleBinding", "pdmtp-operator"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "pdmtp-operator", "namespace": "pdmtp-system"}
    ]
    # The one RoleBinding is leader election's, in the release namespace.
    bindings = [k for k in rendered if k[0] in ("RoleBinding", "ServiceMonitor")]
    assert bindings == [("RoleBinding", "pdmtp-operator-leader-election")]
    assert ("Service", "pdmtp-operator-webhook") not in rendered


def test_listed_namespaces_get_a_rolebinding_each_and_only_cluster_scoped_rules_stay_cluster_wide(
    helm: Path,
) -> None:
    listed = render(helm, sets=["watchNamespaces={serving,batch}"])
    bindings = [
        o
        for o in listed
        if o["kind"] == "RoleBinding" and o["metadata"]["name"] != "pdmtp-operator-leader-election"
    ]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["batch", "serving"]
    for b in bindings:
        assert b["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "pdmtp-operator",
        }
        assert b["subjects"][0]["namespace"] == "pdmtp-system"
    rendered = by_key(o for o in listed if o["kind"] != "RoleBinding")
    default = grants(objects(helm)["ClusterRole", "pdmtp-operator"]["rules"])
    namespaced = grants(rendered["ClusterRole", "pdmtp-operator"]["rules"])
    assert namespaced == default - CLUSTER_SCOPED
    assert grants(rendered["ClusterRole", "pdmtp-operator-cluster"]["rules"]) == CLUSTER_SCOPED
    assert rendered["ClusterRoleBinding", "pdmtp-operator-cluster"]["roleRef"]["name"] == (
        "pdmtp-operator-cluster"
    )
    assert ("ClusterRoleBinding", "pdmtp-operator") not in rendered
    args = container(rendered)["args"]
    assert args[:2] == ["--namespace=serving", "--namespace=batch"]
    assert "--all-namespaces" not in args


@pytest.mark.parametrize("namespaces", [False, True])
def test_the_webhook_adds_its_flags_service_and_rbac_only_when_enabled(
    helm: Path, namespaces: bool
) -> None:
    scope = ["watchNamespaces={serving}"] if namespaces else []
    cluster_role = "pdmtp-operator-cluster" if namespaces else "pdmtp-operator"
    off = objects(helm, *scope)
    on = objects(helm, *scope, "webhook.enabled=true")
    assert not [a for a in container(off)["args"] if a.startswith("--webhook")]
    # Elected (the default): only the leader serves reviews, so the configuration names the
    # leader's own pod address, not a Service that would also send reviews to the standby.
    assert container(on)["args"][-3:] == [
        "--webhook-listen=0.0.0.0:9443",
        "--webhook-host=$(POD_IP)",
        "--webhook-manage",
    ]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container(on)["env"]}
    assert env["POD_IP"] == "status.podIP"
    assert {"name": "webhook", "containerPort": 9443} in container(on)["ports"]
    assert ("Service", "pdmtp-operator-webhook") not in on
    # One replica without election: the Service's name, as before.
    alone = objects(
        helm, *scope, "webhook.enabled=true", "leaderElection.enabled=false", "replicaCount=1"
    )
    assert container(alone)["args"][-2] == "--webhook-host=pdmtp-operator-webhook.pdmtp-system.svc"
    service = alone["Service", "pdmtp-operator-webhook"]
    assert service["spec"]["ports"] == [{"name": "webhook", "port": 9443, "targetPort": "webhook"}]
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "pdmtp-operator"}
    assert ("Service", "pdmtp-operator-webhook") not in off
    assert not grants(off["ClusterRole", cluster_role]["rules"]) & WEBHOOK_RULES
    assert grants(on["ClusterRole", cluster_role]["rules"]) >= WEBHOOK_RULES
    if namespaces:  # the namespaced rules, bound per namespace, never hold a cluster-scoped one
        assert not grants(on["ClusterRole", "pdmtp-operator"]["rules"]) & WEBHOOK_RULES


def test_the_servicemonitor_needs_both_the_value_and_the_api(helm: Path) -> None:
    api = "monitoring.coreos.com/v1/ServiceMonitor"
    key = ("ServiceMonitor", "pdmtp-operator")
    assert key not in objects(helm, "metrics.serviceMonitor.enabled=true")
    assert key not in objects(helm, api=api)
    monitor = objects(
        helm,
        "metrics.serviceMonitor.enabled=true",
        "metrics.serviceMonitor.labels.release=prom",
        api=api,
    )[key]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"] == {
        "matchLabels": {"app.kubernetes.io/name": "pdmtp-operator"}
    }
    # honorLabels: the operator's own namespace label (the PDDeployment's) is what the alert
    # rules select on, not the operator pod's.
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "honorLabels": True}
    ]


MONITORING = (
    ("PodMonitor", "pdmtp-engines"),
    ("PrometheusRule", "pdmtp"),
    ("ConfigMap", "pdmtp-dashboard"),
)


def test_monitoring_objects_are_opt_in(helm: Path) -> None:
    apis = [f"monitoring.coreos.com/v1/{kind}" for kind in ("PodMonitor", "PrometheusRule")]
    rendered = by_key(render(helm, *[f for a in apis for f in ("--api-versions", a)]))
    assert not set(MONITORING) & rendered.keys()


def test_the_prometheusrule_is_the_rules_file_and_needs_both_the_value_and_the_api(
    helm: Path,
) -> None:
    api = "monitoring.coreos.com/v1/PrometheusRule"
    key = ("PrometheusRule", "pdmtp")
    assert key not in objects(helm, "metrics.prometheusRule.enabled=true")
    assert key not in objects(helm, api=api)
    rule = objects(
        helm,
        "metrics.prometheusRule.enabled=true",
        "metrics.prometheusRule.labels.release=prom",
        api=api,
    )[key]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "prom"
    assert rule["metadata"]["namespace"] == "pdmtp-system"
    # One source: the object's spec is the file promtool checks, annotations' templates intact.
    assert rule["spec"] == yaml.safe_load((CHART / "files" / "alerts.yaml").read_text())
    assert "{{ $labels.namespace }}" in json.dumps(rule["spec"])


def test_the_podmonitor_labels_engine_series_as_the_operators_are(helm: Path) -> None:
    api = "monitoring.coreos.com/v1/PodMonitor"
    key = ("PodMonitor", "pdmtp-engines")
    assert key not in objects(helm, "metrics.podMonitor.enabled=true")
    assert key not in objects(helm, api=api)
    monitor = objects(helm, "metrics.podMonitor.enabled=true", api=api)[key]["spec"]
    assert monitor["namespaceSelector"] == {"any": True}
    assert monitor["selector"] == {
        "matchLabels": {"app.kubernetes.io/managed-by": "pdmtp"},
        "matchExpressions": [
            {"key": "pdmtp.io/role", "operator": "In", "values": ["prefill", "decode"]}
        ],
    }
    (endpoint,) = monitor["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics"
    relabeled = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
    assert relabeled == {
        "name": ["__meta_kubernetes_pod_label_pdmtp_io_name"],
        "role": ["__meta_kubernetes_pod_label_pdmtp_io_role"],
        "revision": ["__meta_kubernetes_pod_label_pdmtp_io_revision"],
    }


def test_the_dashboard_configmap_carries_the_sidecar_label_and_the_json(helm: Path) -> None:
    key = ("ConfigMap", "pdmtp-dashboard")
    assert key not in objects(helm)
    config = objects(helm, "metrics.dashboard.enabled=true")[key]
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "annotations" not in config["metadata"]
    dashboard = (CHART / "files" / "dashboard.json").read_text()
    assert json.loads(config["data"]["pdmtp.json"]) == json.loads(dashboard)
    other = objects(
        helm,
        "metrics.dashboard.enabled=true",
        "metrics.dashboard.labels.grafana_dashboard=null",
        "metrics.dashboard.labels.dashboards=pdmtp",
        "metrics.dashboard.annotations.grafana_folder=serving",
    )[key]["metadata"]
    assert "grafana_dashboard" not in other["labels"] and other["labels"]["dashboards"] == "pdmtp"
    assert other["annotations"] == {"grafana_folder": "serving"}


GUARD = [
    ("ValidatingAdmissionPolicy", "pdmtp-crd-deletion-guard"),
    ("ValidatingAdmissionPolicyBinding", "pdmtp-crd-deletion-guard"),
]
CRDS = [
    ("CustomResourceDefinition", "pddeployments.pdmtp.io"),
    ("CustomResourceDefinition", "pdrolescales.pdmtp.io"),
]


def annotations_of(obj: Obj) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def test_crds_and_their_guard_are_kept_by_default_and_consent_to_deletion_when_not(
    helm: Path,
) -> None:
    kept = objects(helm)
    for key in CRDS + GUARD:
        assert annotations_of(kept[key]) == {KEEP: "keep"}, key
    purged = objects(helm, "crds.keep=false")
    for key in CRDS:
        assert annotations_of(purged[key]) == {ALLOW_DELETE: "true"}, key
    for key in GUARD:
        assert annotations_of(purged[key]) == {}, key
    # The CRDs are the generated ones, Helm's labels added, with part-of kept.
    crd = kept[CRDS[0]]
    assert crd["metadata"]["labels"]["app.kubernetes.io/part-of"] == "pdmtp"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    generated = yaml.safe_load((REPO / "crds" / "pdmtp.io_pddeployments.yaml").read_text())
    assert crd["spec"] == generated["spec"]


def test_crds_install_false_renders_neither_the_crds_nor_their_guard(helm: Path) -> None:
    rendered = objects(helm, "crds.install=false")
    assert not set(CRDS + GUARD) & rendered.keys()
    assert ("Deployment", "pdmtp-operator") in rendered


def test_values_reach_the_pod(helm: Path) -> None:
    rendered = objects(
        helm,
        "image.repository=registry.example.com/pdmtp-operator",
        "image.tag=1.2.3",
        "image.pullPolicy=Always",
        "logLevel=debug",
        "metrics.port=9100",
        "health.port=8082",
        "nodeSelector.pool=system",
        "tolerations[0].key=dedicated",
        "tolerations[0].operator=Exists",
        "podAnnotations.example\\.com/team=serving",
        "resources.limits.memory=2Gi",
    )
    pod = rendered["Deployment", "pdmtp-operator"]["spec"]["template"]
    op = container(rendered)
    assert op["image"] == "registry.example.com/pdmtp-operator:1.2.3"
    assert op["imagePullPolicy"] == "Always"
    assert op["args"] == [
        "--all-namespaces",
        "--metrics-port=9100",
        "--health-listen=0.0.0.0:8082",
        "--leader-elect",
        "-v",
    ]
    assert {"name": "metrics", "containerPort": 9100} in op["ports"]
    assert {"name": "health", "containerPort": 8082} in op["ports"]
    assert op["resources"]["limits"] == {"memory": "2Gi"}
    assert pod["spec"]["nodeSelector"] == {"pool": "system"}
    assert pod["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert pod["metadata"]["annotations"] == {"example.com/team": "serving"}
    assert pod["metadata"]["labels"] == {
        "app.kubernetes.io/name": "pdmtp-operator",
        "pdmtp.io/metrics-scraper": "true",
    }
    assert rendered["Service", "pdmtp-operator-metrics"]["spec"]["ports"][0]["port"] == 9100


@pytest.mark.parametrize(
    "bad",
    [
        "imag.tag=x",
        "image.tg=x",
        "crds.kep=false",
        "metrics.serviceMonitor.enable=true",
        "metrics.dashboard.label.x=y",
        "metrics.prometheusRule.enabled=yes",
        "webhook.port=1",
        "logLevel=trace",
        "metrics.port=0",
        "watchNamespaces={Bad_NS}",
    ],
)
def test_the_schema_refuses_unknown_keys_and_bad_values(helm: Path, bad: str) -> None:
    with pytest.raises(HelmError, match=re.escape("values don't meet the specifications")):
        render(helm, sets=[bad])


def test_every_object_carries_the_release_labels(helm: Path) -> None:
    for (kind, name), obj in objects(helm, "webhook.enabled=true").items():
        labels = obj["metadata"]["labels"]
        for key in (
            "app.kubernetes.io/part-of",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "helm.sh/chart",
        ):
            assert key in labels, f"{kind}/{name}: no {key}"


# ---- leader election ------------------------------------------------------------------------

LEASE_RULE = {("coordination.k8s.io", "leases", verb) for verb in ("get", "create", "update")}


def test_two_replicas_elect_a_leader_by_default(helm: Path) -> None:
    rendered = objects(helm)
    deployment = rendered["Deployment", "pdmtp-operator"]["spec"]
    assert deployment["replicas"] == 2
    assert deployment["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    op = container(rendered)
    assert "--leader-elect" in op["args"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in op["env"]}
    assert env == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    role = rendered["Role", "pdmtp-operator-leader-election"]
    assert role["metadata"]["namespace"] == "pdmtp-system"
    assert grants(role["rules"]) == LEASE_RULE
    binding = rendered["RoleBinding", "pdmtp-operator-leader-election"]
    assert binding["roleRef"]["name"] == "pdmtp-operator-leader-election"
    assert binding["subjects"][0] == {
        "kind": "ServiceAccount",
        "name": "pdmtp-operator",
        "namespace": "pdmtp-system",
    }
    budget = rendered["PodDisruptionBudget", "pdmtp-operator"]["spec"]
    assert budget == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": {"app.kubernetes.io/name": "pdmtp-operator"}},
    }
    # The ClusterRole grants no Lease: it is needed in the release namespace only.
    assert not grants(rendered["ClusterRole", "pdmtp-operator"]["rules"]) & LEASE_RULE


def test_without_election_one_replica_is_replaced_not_overlapped(helm: Path) -> None:
    rendered = objects(helm, "leaderElection.enabled=false", "replicaCount=1")
    deployment = rendered["Deployment", "pdmtp-operator"]["spec"]
    assert deployment["replicas"] == 1
    assert deployment["strategy"] == {"type": "Recreate"}
    op = container(rendered)
    assert "--leader-elect" not in op["args"] and "env" not in op
    assert ("Role", "pdmtp-operator-leader-election") not in rendered
    assert ("PodDisruptionBudget", "pdmtp-operator") not in rendered


def test_two_replicas_without_election_are_refused(helm: Path) -> None:
    with pytest.raises(HelmError, match=re.escape("replicaCount > 1 needs leaderElection.enabled")):
        render(helm, sets=["leaderElection.enabled=false"])
