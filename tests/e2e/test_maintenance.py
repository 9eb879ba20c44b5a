"""kind e2e: cluster maintenance under load (issue 31). A 2P/2D revision (maxSurge 1,
maxUnavailable 0: the floor is the target) serves the in-cluster load client through the real
router; a watcher feeds every pod and Deployment event to the rollout invariants' checker, whose
floor counts only what a client can reach.

1. a worker lost (its node container frozen, as a hung host: the kubelet stops reporting): the
   failed requests are counted, the seconds until the routers no longer list its pods are
   reported, 0 fail after that, and the status is read for what names the loss; then the node
   comes back (first: the drain below leaves every engine on one worker);
2. `kubectl drain` of a worker holding serving engine pods: the revision's PodDisruptionBudgets
   refuse the evictions, and the operator moves the cordoned node's engines itself, replacement
   first, out of their routers before they stop (`core.rollout.evacuation`); the drain completes, 0
   failed, 0 cross-revision, every invariant (the floor, the surge ceiling, leave-routing-first)
   held at every event;
3. one prefill and then one decode pod force-deleted (no grace: a crash cannot be drained): the
   failed requests are counted (the router stops picking a dead engine after one failed probe,
   and does not retry), and 0 fail once the routers have rolled.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
from builders import PDDBuilder, pdd
from cluster.operator_harness import RolloutWatcher
from e2e.kindkit import Figures, Kind, LoadRun, serving, wait_for
from kubernetes import config as kube_config
from pdmtp.api.vocabulary import LABEL_NAME, LABEL_ROLE
from pdmtp.core.agreement import check
from pdmtp.core.objects import engine_url
from pdmtp.core.render.membership import router_urls
from pdmtp.core.rollout.steering import target_and_policy

NAME = "maint"
record = Figures("PDMTP_E2E_MAINTENANCE_RESULT").record


def builder(kind: Kind) -> PDDBuilder:
    return (
        pdd(NAME)
        .set(image=kind.images.emulator, model={"name": kind.images.engine_model})
        .mtp(3, modules=3, method="deepseek_mtp")
        .prefill(replicas=2)
        .decode(replicas=2)
        .router(replicas=2, image=kind.images.router, resources={"requests": {"cpu": "100m"}})
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
        # A stopped engine keeps answering through its preStop (grace less vLLM's 30 s
        # shutdown: 15 s here, 60 s by default).
        .set(
            pod={
                "terminationGracePeriodSeconds": 45,
                # Each role spread over the workers (matchLabelKeys: counted per role),
                # so a lost one takes half of each, not every decode: spread over the pods as a
                # whole, one kind run put both decodes on the worker test_1 froze, and nothing
                # served until the node controller's eviction. Required: as a preference
                # (ScheduleAnyway) the scheduler once put all four engines on one of the three
                # workers. nodeTaintsPolicy Honor leaves a cordoned or unreachable worker out of
                # the count, so a drain can still place the pod it evicts.
                "topologySpreadConstraints": [
                    {
                        "maxSkew": 1,
                        "topologyKey": "kubernetes.io/hostname",
                        "whenUnsatisfiable": "DoNotSchedule",
                        "nodeTaintsPolicy": "Honor",
                        "labelSelector": {"matchLabels": {LABEL_NAME: NAME}},
                        "matchLabelKeys": [LABEL_ROLE],
                    }
                ],
            }
        )
    )


@pytest.fixture(scope="module")
def api(kind: Kind) -> Iterator[Any]:
    client = kube_config.new_client_from_config(config_file=str(kind.kubeconfig))  # type: ignore[no-untyped-call]
    yield client
    client.close()


def engines(kind: Kind, namespace: str) -> list[dict[str, Any]]:
    pods = kind.pods(namespace, f"{LABEL_NAME}={NAME}")
    return [p for p in pods if p["metadata"]["labels"].get(LABEL_ROLE) in ("prefill", "decode")]


def settled(kind: Kind, namespace: str) -> bool:
    pods = engines(kind, namespace)
    return len(pods) == 4 and all(serving(p) for p in pods) and kind.settled(namespace, NAME)


def busiest_worker(kind: Kind, namespace: str, spared: str = "") -> tuple[str, list[str]]:
    """The worker with the most engine pods of both roles, and the roles of its pods; never
    `spared` (the load client's)."""
    spare = {
        n["metadata"]["name"]
        for n in kind.get("nodes")["items"]
        if "node-role.kubernetes.io/control-plane" not in n["metadata"]["labels"]
        and n["metadata"]["name"] != spared
    }
    by_node: dict[str, list[str]] = {}
    for p in engines(kind, namespace):
        node = p["spec"].get("nodeName")
        if node in spare:
            by_node.setdefault(node, []).append(p["metadata"]["labels"][LABEL_ROLE])
    assert by_node, "no engine pod on a spare worker"
    node = max(by_node, key=lambda n: (len(set(by_node[n])), len(by_node[n])))
    return node, sorted(by_node[node])


def where_requests_go(kind: Kind, namespace: str, frozen: str) -> str:
    """What a request of the load client meets, for a failure message: the cluster's DNS, the
    router Service's endpoints and the PDDeployment's pods, each with its node."""

    def place(p: dict[str, Any]) -> str:
        node = p["spec"].get("nodeName", "-")
        ready = any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
        leaving = " deleting" if p["metadata"].get("deletionTimestamp") else ""
        mark = " (frozen)" if node == frozen else ""
        return f"{p['metadata']['name']}@{node}{mark} ready={ready}{leaving}"

    dns = [place(p) for p in kind.pods("kube-system", "k8s-app=kube-dns")]
    pods = [place(p) for p in kind.pods(namespace, f"{LABEL_NAME}={NAME}")]
    slices = kind.get("endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={NAME}")
    endpoints = [
        f"{e['addresses'][0]} ready={e.get('conditions', {}).get('ready')}"
        for s in slices["items"]
        for e in s.get("endpoints") or []
    ]
    return f"DNS {dns}; Service {NAME} endpoints {endpoints}; pods {pods}"


def watch(api: Any, kind: Kind, namespace: str) -> RolloutWatcher:
    spec = builder(kind).build().spec
    watcher = RolloutWatcher(api, namespace, NAME, target_and_policy(check(spec))[1])
    watcher.start(spec)
    return watcher


def test_1_a_lost_node_is_counted_and_served_around(kind: Kind, api: Any, namespace: str) -> None:
    runtime = os.environ.get("PDMTP_E2E_NODE_RUNTIME", "podman")
    kind.apply(builder(kind).dict(), namespace)
    wait_for(lambda: settled(kind, namespace), "2P/2D serving", 300)
    run = LoadRun.start(kind, namespace, NAME, max_requests=40_000, max_seconds=400)
    run.wait_sending()
    client_node = kind.get("pod", "-n", namespace, run.name)["spec"]["nodeName"]
    node, roles = busiest_worker(kind, namespace, spared=client_node)
    lost = {
        p["metadata"]["name"] for p in engines(kind, namespace) if p["spec"]["nodeName"] == node
    }
    # Served around only if a pod of each role lives elsewhere: a placement that puts all of one
    # role on the frozen worker fails here, named, rather than as an outage later.
    assert sorted(set(roles)) == roles, f"{node} holds every pod of a role: {roles}"
    # The cluster's DNS must outlive the node (hack/kind/coredns.yaml keeps it on the control
    # plane): the load client finds the router Service by name.
    dns = {p["spec"].get("nodeName") for p in kind.pods("kube-system", "k8s-app=kube-dns")}
    assert node not in dns, f"{node} holds the cluster's DNS: freezing it would test DNS"

    def routed() -> set[str]:
        """Engine pods that some router of the PDDeployment still lists, by name."""
        by_url = {
            engine_url(p["status"]["podIP"]): p["metadata"]["name"]
            for p in engines(kind, namespace)
            if p["status"].get("podIP")
        }
        listed: set[str] = set()
        for d in kind.get("deploy", "-n", namespace, "-l", f"{LABEL_NAME}={NAME}")["items"]:
            urls = router_urls(d["spec"]["template"]["spec"]["containers"][0].get("args") or [])
            listed |= {by_url[u] for u in urls if u in by_url}
        return listed

    subprocess.run([runtime, "pause", node], check=True, capture_output=True, timeout=60)
    paused = time.monotonic()
    try:
        wait_for(lambda: not routed() & lost, "the routers to drop the lost pods", 240, 1.0)
        unrouted = time.monotonic() - paused
        # The rolled routers' old pods (which still listed the lost pods) drained and gone, bar
        # any on the frozen node (its kubelet cannot finish them), then traffic through the rest.
        wait_for(
            lambda: (
                not any(
                    p["metadata"].get("deletionTimestamp") and p["spec"].get("nodeName") != node
                    for p in kind.pods(namespace, f"{LABEL_NAME}={NAME},{LABEL_ROLE}=router")
                )
            ),
            "the rolled routers' old pods gone",
            120,
        )
        try:
            run.wait_answers()
        except TimeoutError as exc:
            seen = f"client (seconds, answers) {run.answered()}"
            met = where_requests_go(kind, namespace, node)
            raise TimeoutError(f"{exc}; {seen}; {met}") from exc
        run.stop()
        summary = run.summary()
        after = LoadRun.start(kind, namespace, NAME, max_requests=300, max_seconds=60).summary()
        status = kind.pdd(namespace, NAME)["status"]
    finally:
        subprocess.run([runtime, "unpause", node], check=True, capture_output=True, timeout=60)
    wait_for(
        lambda: all(
            c["status"] == "True"
            for c in kind.get("node", node)["status"]["conditions"]
            if c["type"] == "Ready"
        ),
        f"{node} Ready again",
        180,
    )
    wait_for(lambda: settled(kind, namespace), "2P/2D serving after the node returned", 300)
    conditions = {
        c["type"]: f"{c['status']} {c['reason']}: {c['message']}" for c in status["conditions"]
    }
    named = [t for t, text in conditions.items() if any(p in text for p in lost)]
    record(
        "a worker lost (node container frozen) under load",
        {
            "node_roles": roles,
            "routers_dropped_lost_pods_after_s": round(unrouted, 1),
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "errors": summary["errors"][:5],
            "cross_revision": summary["cross_revision"],
            "after_recovery_sent": after["sent"],
            "after_recovery_failed": after["failed"],
            "conditions_naming_the_lost_pods": named,
            "conditions": conditions,
        },
    )
    assert after["failed"] == 0, after["errors"]
    assert summary["cross_revision"] == 0
    assert "Progressing" in named, conditions


def test_2_a_drain_goes_through_the_budgets_and_loses_nothing(
    kind: Kind, api: Any, namespace: str
) -> None:
    kind.apply(builder(kind).dict(), namespace)  # stands alone; after test_1, unchanged
    wait_for(lambda: settled(kind, namespace), "2P/2D serving", 300)
    node, roles = busiest_worker(kind, namespace)
    budgets = kind.get("pdb", "-n", namespace)["items"]
    assert {b["metadata"]["name"].rsplit("-", 1)[-1] for b in budgets} == {"prefill", "decode"}

    watcher = watch(api, kind, namespace)
    run = LoadRun.start(kind, namespace, NAME, max_requests=40_000, max_seconds=400)
    run.wait_sending()
    started = time.monotonic()
    try:
        # Only this PDDeployment's pods: the load client is a bare pod (drain refuses those),
        # and other tests' pods are not this test's to move.
        drained = kind.kubectl(
            "drain",
            node,
            f"--pod-selector={LABEL_NAME}={NAME}",
            "--delete-emptydir-data",
            "--ignore-daemonsets",
            "--timeout=240s",
            timeout=300,
        )
        drain_seconds = time.monotonic() - started
        wait_for(lambda: settled(kind, namespace), "2P/2D serving again", 300)
        settle_seconds = time.monotonic() - started
        run.wait_answers()  # served by the pods that replaced the evicted ones
    finally:
        kind.kubectl("uncordon", node)
    run.stop()
    summary = run.summary()
    watcher.stop()
    evicted = [
        line.split()[0].removeprefix("pod/")
        for line in drained.splitlines()
        if line.endswith("evicted") and ("-prefill-" in line or "-decode-" in line)
    ]
    left_on_node = [p for p in engines(kind, namespace) if p["spec"].get("nodeName") == node]
    record(
        "kubectl drain of a worker under load",
        {
            "node_roles": roles,
            "engine_pods_evicted": evicted,
            "drain_seconds": round(drain_seconds, 1),
            "serving_again_seconds": round(settle_seconds, 1),
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "cross_revision": summary["cross_revision"],
            "errors": summary["errors"],
            "watch_events": watcher.events_seen,
            "invariant_violations": len(watcher.violations),
            "violations": watcher.violations[:3],
        },
    )
    assert not left_on_node
    assert summary["failed"] == 0, summary["errors"]
    assert summary["cross_revision"] == 0
    assert watcher.violations == [], watcher.views


def test_3_a_crashed_prefill_then_decode_cost_only_what_they_held(
    kind: Kind, namespace: str
) -> None:
    kind.apply(builder(kind).dict(), namespace)  # stands alone; after test_1, unchanged
    wait_for(lambda: settled(kind, namespace), "2P/2D serving", 300)
    run = LoadRun.start(kind, namespace, NAME, max_requests=40_000, max_seconds=400)
    run.wait_sending()
    recovered = []
    for role in ("prefill", "decode"):
        victim = next(
            p for p in engines(kind, namespace) if p["metadata"]["labels"][LABEL_ROLE] == role
        )
        started = time.monotonic()
        kind.kubectl(
            "-n",
            namespace,
            "delete",
            "pod",
            victim["metadata"]["name"],
            "--grace-period=0",
            "--force",
        )
        wait_for(lambda: settled(kind, namespace), f"2P/2D serving after the {role} crash", 240)
        recovered.append(round(time.monotonic() - started, 1))
        run.wait_answers()  # by the replacement, before the next crash
    run.stop()
    summary = run.summary()
    after = LoadRun.start(kind, namespace, NAME, max_requests=300, max_seconds=60).summary()
    record(
        "one prefill then one decode pod force-deleted under load",
        {
            "requests_sent": summary["sent"],
            "requests_failed": summary["failed"],
            "errors": summary["errors"][:5],
            "cross_revision": summary["cross_revision"],
            "serving_again_after_s": recovered,
            "after_recovery_sent": after["sent"],
            "after_recovery_failed": after["failed"],
        },
    )
    assert after["failed"] == 0, after["errors"]
    assert summary["cross_revision"] == 0
    # Issue 31 measured 30 of 1,660 (15 a crash) before the router's health checks; what
    # remains is what the dead pod held and what reached it before the first failed probe
    # (the router does not retry): 5-8 a crash at the load client's concurrency of 4 (10 of
    # 632, 13 of 1,088, 16 of 722). The bound leaves room for a slower machine.
    assert summary["failed"] <= 24, summary["errors"]
    kind.kubectl("-n", namespace, "delete", "pddeployment", NAME, "--wait=true", timeout=180)
