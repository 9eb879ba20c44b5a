"""The operator corrects what it finds on a real API server: foreign edits and deletions of its
children (disruption budgets included) come back, refused writes are status and Warning events
(never a false Normal event) and recover by themselves, and a workload whose pods the server
refuses shows in status."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builders import compat_revision, pdd
from cluster.kubehelpers import Cluster, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_harness import (
    READY_DELAY,
    OperatorProcess,
    condition,
    create_pdd,
    get_pdd,
    wait_settled,
)

RESTORE_SECONDS = 15


def events(cluster: Cluster, namespace: str, name: str) -> list[client.CoreV1Event]:
    items = client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
    return [e for e in items if e.involved_object.name == name]


def requests(op: OperatorProcess, metric: str) -> dict[str, float]:
    return {k: v for k, v in op.metrics().items() if k.startswith(metric + "{")}


# ---- drift --------------------------------------------------------------------------------


def test_foreign_edits_and_deletions_come_back(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = pdd("drift").mtp(3, modules=3)
    create_pdd(cluster.api_client, namespace, b.dict())
    obj = wait_settled(cluster.api_client, namespace, "drift")
    rev = compat_revision(b.build().spec)
    apps = client.AppsV1Api(cluster.api_client)
    core = client.CoreV1Api(cluster.api_client)
    net = client.NetworkingV1Api(cluster.api_client)
    decode = f"drift-{rev}-decode"
    want = apps.read_namespaced_deployment(decode, namespace)
    want_container = want.spec.template.spec.containers[0]

    def container_of(name: str) -> client.V1Container:
        return apps.read_namespaced_deployment(name, namespace).spec.template.spec.containers[0]

    def restored(what: str, check: Callable[[], bool]) -> None:
        started = time.monotonic()
        wait_for(check, f"{what} restored", RESTORE_SECONDS, interval=0.2)
        print(f"{what}: restored in {time.monotonic() - started:.1f}s")

    # Edits as users make them, with kubectl (another field manager than the operator's).
    deployment = f"deployment/{decode}"
    kubectl(cluster, namespace, "set", "image", deployment, "engine=elsewhere.example.com/e:1")
    restored("image", lambda: container_of(decode).image == want_container.image)
    at = list(want_container.args).index("--speculative-config") + 1
    spec_patch = [
        {
            "op": "replace",
            "path": f"/spec/template/spec/containers/0/args/{at}",
            "value": json.dumps({"method": "mtp", "num_speculative_tokens": 1}),
        }
    ]
    kubectl(cluster, namespace, "patch", deployment, "--type=json", "-p", json.dumps(spec_patch))
    restored("args", lambda: container_of(decode).args == want_container.args)
    kubectl(cluster, namespace, "scale", deployment, "--replicas=5")
    restored(
        "replicas", lambda: apps.read_namespaced_deployment(decode, namespace).spec.replicas == 1
    )

    # Deletions.
    apps.delete_namespaced_deployment(decode, namespace)
    restored(
        "deleted Deployment",
        lambda: _exists(lambda: apps.read_namespaced_deployment(decode, namespace)),
    )
    core.delete_namespaced_service("drift", namespace)
    restored(
        "deleted Service", lambda: _exists(lambda: core.read_namespaced_service("drift", namespace))
    )
    net.delete_namespaced_network_policy("drift-pd", namespace)
    restored(
        "deleted NetworkPolicy",
        lambda: _exists(lambda: net.read_namespaced_network_policy("drift-pd", namespace)),
    )
    # The decode role's disruption budget: loosened, then deleted.
    budgets = client.PolicyV1Api(cluster.api_client)
    loosen = json.dumps({"spec": {"maxUnavailable": 5}})
    kubectl(cluster, namespace, "patch", f"pdb/{decode}", "--type=merge", "-p", loosen)
    restored(
        "budget",
        lambda: (
            budgets.read_namespaced_pod_disruption_budget(decode, namespace).spec.max_unavailable
            == 0  # maxSurge 1: the operator moves a drained node's pods (core.rollout.evacuation)
        ),
    )
    budgets.delete_namespaced_pod_disruption_budget(decode, namespace)
    restored(
        "deleted PodDisruptionBudget",
        lambda: _exists(lambda: budgets.read_namespaced_pod_disruption_budget(decode, namespace)),
    )
    wait_settled(cluster.api_client, namespace, "drift")
    # Each edit was seen and reverted (not merely never applied): the operator said so.
    updated = " ".join(
        e.message for e in events(cluster, namespace, "drift") if e.reason == "Updated"
    )
    for field in ("containers[engine].image", "containers[engine].args", "spec.replicas"):
        assert field in updated, updated
    assert f"Updated PodDisruptionBudget/{decode}: spec.maxUnavailable" in updated, updated
    created = [e.message for e in events(cluster, namespace, "drift") if e.reason == "Created"]
    for child in (
        f"Deployment/{decode}",
        "Service/drift",
        "NetworkPolicy/drift-pd",
        f"PodDisruptionBudget/{decode}",
    ):
        assert created.count(f"Created {child}") == 2, created
    assert obj["metadata"]["uid"]


def kubectl(cluster: Cluster, namespace: str, *args: str) -> None:
    binary = cluster.local.bin_dir / "kubectl" if cluster.local else Path("kubectl")
    done = subprocess.run(
        [str(binary), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def _exists(read: Callable[[], Any]) -> bool:
    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    return True


def test_idle_resyncs_make_no_api_requests(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    create_pdd(cluster.api_client, namespace, pdd("idle").dict())
    wait_settled(cluster.api_client, namespace, "idle")
    time.sleep(2 * operator.resync_seconds)  # the last status write lands in the cache

    def reconciles() -> float:
        return sum(v for k, v in requests(operator, "pdmtp_reconcile_total").items() if "idle" in k)

    before = requests(operator, "pdmtp_api_requests_total")
    watches = requests(operator, "pdmtp_watch_requests_total")
    passes_before = reconciles()
    time.sleep(4 * operator.resync_seconds + 0.5)
    passes = reconciles() - passes_before
    after = requests(operator, "pdmtp_api_requests_total")
    assert passes >= 3, "the resync did not run"
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert all(n == 0 for n in delta.values()), f"idle reconciles made requests: {delta}"
    assert requests(operator, "pdmtp_watch_requests_total") == watches
    print(f"idle: {passes:.0f} reconciles, 0 API requests")


# ---- refused writes -------------------------------------------------------------------------


def _policy(cluster: Cluster, namespace: str, message: str) -> Callable[[], None]:
    """A ValidatingAdmissionPolicy refusing decode Deployments in `namespace`; returns remover."""
    adm = client.AdmissionregistrationV1Api(cluster.api_client)
    name = f"no-decode-{namespace}"
    adm.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": ["apps"],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE", "UPDATE"],
                            "resources": ["deployments"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(object.metadata.labels) || "
                        "!('pdmtp.io/role' in object.metadata.labels) || "
                        "object.metadata.labels['pdmtp.io/role'] != 'decode'",
                        "message": message,
                    }
                ],
            },
        }
    )
    adm.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
                },
            },
        }
    )

    def remove() -> None:
        adm.delete_validating_admission_policy_binding(name)
        adm.delete_validating_admission_policy(name)

    # Policies load lazily: wait until one is enforced before the operator's first write.
    probe = {
        "metadata": {"name": "probe", "labels": {"pdmtp.io/role": "decode"}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"p": "p"}},
            "template": {
                "metadata": {"labels": {"p": "p"}},
                "spec": {"containers": [{"name": "c", "image": "x"}]},
            },
        },
    }

    def enforced() -> bool:
        try:
            client.AppsV1Api(cluster.api_client).create_namespaced_deployment(
                namespace, probe, dry_run="All"
            )
        except ApiException as e:
            return message in (e.body or "")
        return False

    wait_for(enforced, "policy enforced", 30, interval=0.5)
    return remove


def test_a_child_refused_by_admission_is_status_and_recovers(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    message = "decode workloads are frozen in this namespace"
    remove = _policy(cluster, namespace, message)
    try:
        b = pdd("refused").prefill(podAnnotations={READY_DELAY: "200"})
        create_pdd(cluster.api_client, namespace, b.dict())
        started = time.monotonic()
        refused = wait_for(
            lambda: (
                (c := condition(get_pdd(cluster.api_client, namespace, "refused"), "Progressing"))
                and c["reason"] == "ChildRejected"
                and c
            ),
            "Progressing=False ChildRejected",
            20,
            interval=0.2,
        )
        print(f"refusal in status after {time.monotonic() - started:.1f}s: {refused['message']}")
        assert refused["status"] == "False" and message in refused["message"]
        assert "-decode" in refused["message"]
        warnings = wait_for(
            lambda: [
                e
                for e in events(cluster, namespace, "refused")
                if e.type == "Warning" and e.reason == "ChildRejected"
            ],
            "a Warning event",
            10,
        )
        assert message in warnings[0].message
        time.sleep(3 * operator.resync_seconds)  # retries happen; none may claim success
        created = [
            e.message for e in events(cluster, namespace, "refused") if e.reason == "Created"
        ]
        assert created and not [m for m in created if "-decode" in m], created
    finally:
        remove()
    obj = wait_settled(cluster.api_client, namespace, "refused", timeout=90)
    assert condition(obj, "Progressing")["reason"] == "RolloutComplete"  # type: ignore[index]
    created = [e.message for e in events(cluster, namespace, "refused") if e.reason == "Created"]
    assert [m for m in created if "-decode" in m], "the decode Deployment was never created"


def test_pods_refused_by_a_quota_show_in_status(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    core = client.CoreV1Api(cluster.api_client)
    # Room for the prefill and decode pods, none for the router.
    core.create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "two-pods"}, "spec": {"hard": {"pods": "2"}}}
    )
    wait_for(
        lambda: core.read_namespaced_resource_quota("two-pods", namespace).status.hard or {},
        "quota observed",
        30,
    )
    create_pdd(cluster.api_client, namespace, pdd("quota").dict())
    rejected = wait_for(
        lambda: (
            (c := condition(get_pdd(cluster.api_client, namespace, "quota"), "Progressing"))
            and c["reason"] == "PodsRejected"
            and c
        ),
        "Progressing=False PodsRejected",
        60,
        interval=0.5,
    )
    print(f"quota refusal in status: {rejected['message']}")
    assert "-router" in rejected["message"] and "exceeded quota" in rejected["message"]
    core.delete_namespaced_resource_quota("two-pods", namespace)
    wait_settled(cluster.api_client, namespace, "quota", timeout=120)
