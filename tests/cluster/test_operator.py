"""The operator against a real API server: create, paired and role-local rollouts, rejected specs,
superseded rollouts, restarts mid-roll, deletion and idle cost (issue: the operator)."""

from __future__ import annotations

import random
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from builders import PDDBuilder, compat_revision, pdd
from cluster.kubehelpers import Cluster, pod_ready, wait_for
from kubernetes import client
from operator_harness import (
    OperatorProcess,
    RolloutWatcher,
    condition,
    create_pdd,
    engine_refusal,
    get_pdd,
    is_true,
    patch_spec,
    ready_after,
    settled,
    table,
    wait_settled,
)
from pdmtp.api import vocabulary as v
from pdmtp.cli.render import rendered_children
from pdmtp.core.agreement import check
from pdmtp.core.rollout.steering import target_and_policy
from replicas import LEASE_SECONDS, elected, leading, wait_leader

REPO = Path(__file__).resolve().parents[2]
CRD = REPO / "crds" / "pdmtp.io_pddeployments.yaml"
ROLL_TIMEOUT = 120


def deployments(api: client.ApiClient, ns: str) -> dict[str, client.V1Deployment]:
    return {d.metadata.name: d for d in client.AppsV1Api(api).list_namespaced_deployment(ns).items}


def pods(api: client.ApiClient, ns: str) -> list[client.V1Pod]:
    return client.CoreV1Api(api).list_namespaced_pod(ns).items


def revisions_present(api: client.ApiClient, ns: str) -> set[str]:
    revs = {d.metadata.labels.get(v.LABEL_REVISION) for d in deployments(api, ns).values()}
    revs |= {p.metadata.labels.get(v.LABEL_REVISION) for p in pods(api, ns)}
    return revs - {None}


def start_watcher(cluster: Cluster, ns: str, name: str, b: PDDBuilder) -> RolloutWatcher:
    spec = b.build().spec
    target_policy = target_and_policy(check(spec))[1]
    w = RolloutWatcher(cluster.api_client, ns, name, target_policy)
    w.start(spec)
    return w


# ---- 1. create -------------------------------------------------------------------------------


def test_create_becomes_available_matching_render(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(pdd("demo").mtp(3, modules=3).prefill(replicas=2).decode(replicas=1))
    create_pdd(cluster.api_client, namespace, b.dict())
    obj = wait_settled(cluster.api_client, namespace, "demo")

    rev = compat_revision(b.build().spec)
    status = obj["status"]
    assert status["currentRevision"] == status["updateRevision"] == rev
    assert status["lookahead"] == {"prefill": 3, "decode": 3, "prefillBackoff": 2}
    assert (status["prefill"], status["decode"]) == ("2/2", "1/1")
    for type_ in ("ConfigCompatible", "Available"):
        c = condition(obj, type_)
        assert c is not None and c["status"] == "True" and c["observedGeneration"] == 1
    assert condition(obj, "Degraded")["status"] == "False"  # type: ignore[index]

    # The children are what `pdmtp render` prints (router args come from live pod IPs). A role's
    # PodDisruptionBudget shares its Deployment's name, so children are keyed by kind and name.
    live = deployments(cluster.api_client, namespace)
    expected = {
        (c["kind"], c["metadata"]["name"]): c
        for c in rendered_children(
            b.build().model_copy(
                update={"metadata": b.build().metadata.model_copy(update={"namespace": namespace})}
            )
        )
    }
    for role in ("prefill", "decode"):
        name = f"demo-{rev}-{role}"
        want = expected["Deployment", name]["spec"]["template"]["spec"]["containers"][0]
        got = live[name].spec.template.spec.containers[0]
        assert got.args == want["args"]
        assert {e.name for e in got.env} == {e["name"] for e in want["env"]}
        assert live[name].spec.replicas == expected["Deployment", name]["spec"]["replicas"]
        assert live[name].metadata.owner_references[0].uid == obj["metadata"]["uid"]
    router = live[f"demo-{rev}-router"]
    assert router.spec.replicas == 1
    args = router.spec.template.spec.containers[0].args
    assert args.count("--prefill") == 2 and args.count("--decode") == 1
    svc = client.CoreV1Api(cluster.api_client).read_namespaced_service("demo", namespace)
    assert svc.spec.selector == expected["Service", "demo"]["spec"]["selector"]
    client.NetworkingV1Api(cluster.api_client).read_namespaced_network_policy("demo-pd", namespace)

    # Printer columns show real values.
    columns, rows = table(cluster.api_client, namespace)
    row = dict(zip(columns, rows[0], strict=True))
    assert row["Ready"] == "True" and row["Prefill"] == "2/2" and row["Decode"] == "1/1"
    assert row["Lookahead"] == 3 and row["Revision"] == rev

    # `kubectl wait --for=condition=Available` works.
    kubectl = cluster.local.bin_dir / "kubectl" if cluster.local else Path("kubectl")
    done = subprocess.run(
        [
            str(kubectl),
            "--kubeconfig",
            str(cluster.kubeconfig),
            "-n",
            namespace,
            "wait",
            "--for=condition=Available",
            "pdd/demo",
            "--timeout=20s",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr

    # Events tell the story (posted right after the status write that settled it).
    def reasons() -> set[str]:
        events = client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
        return {e.reason for e in events if e.involved_object.name == "demo"}

    wanted = {"Created", "Compatible", "MinimumReplicasAvailable"}
    wait_for(lambda: wanted <= reasons(), f"events {wanted}", 10, 0.2)


# ---- 2. paired rollout -----------------------------------------------------------------------


def test_paired_rollout_holds_the_invariants(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(
        pdd("roll")
        .mtp(3, modules=3)
        .prefill(replicas=2)
        .decode(replicas=2)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3)
    )
    create_pdd(cluster.api_client, namespace, b.dict())
    before = wait_settled(cluster.api_client, namespace, "roll")
    old_rev = before["status"]["currentRevision"]

    watcher = start_watcher(cluster, namespace, "roll", b)
    b.mtp(2, modules=3)
    new_rev = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "roll", b.dict()["spec"])
    obj = wait_settled(cluster.api_client, namespace, "roll")
    time.sleep(1)
    watcher.stop()

    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert watcher.events_seen > 20
    assert obj["status"]["currentRevision"] == new_rev != old_rev
    assert obj["status"]["lookahead"]["decode"] == 2
    assert revisions_present(cluster.api_client, namespace) == {new_rev}
    reasons = {
        e.reason
        for e in client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
    }
    assert {"TrafficStopped", "RevisionRetired"} <= reasons


# ---- 3. role-local change and scaling --------------------------------------------------------


def test_role_local_change_rolls_only_that_role_and_scaling_is_no_rollout(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(pdd("local"))
    create_pdd(cluster.api_client, namespace, b.dict())
    wait_settled(cluster.api_client, namespace, "local")
    rev = compat_revision(b.build().spec)
    before = deployments(cluster.api_client, namespace)
    prefill_pods = {
        p.metadata.uid
        for p in pods(cluster.api_client, namespace)
        if p.metadata.labels[v.LABEL_ROLE] == "prefill"
    }

    b.decode(resources={"requests": {"cpu": "2", "memory": "1Gi"}})
    patch_spec(cluster.api_client, namespace, "local", b.dict()["spec"])
    wait_for(
        lambda: (
            deployments(cluster.api_client, namespace)[f"local-{rev}-decode"]
            .spec.template.spec.containers[0]
            .resources.requests.get("cpu")
            == "2"
        ),
        "decode template updated",
        30,
    )
    wait_settled(cluster.api_client, namespace, "local")
    after = deployments(cluster.api_client, namespace)
    assert set(after) == set(before), "a role-local change must not create a revision"
    assert (
        after[f"local-{rev}-prefill"].metadata.generation
        == before[f"local-{rev}-prefill"].metadata.generation
    )
    assert (
        after[f"local-{rev}-decode"].metadata.generation
        > before[f"local-{rev}-decode"].metadata.generation
    )
    assert prefill_pods <= {p.metadata.uid for p in pods(cluster.api_client, namespace)}

    b.prefill(replicas=3)
    patch_spec(cluster.api_client, namespace, "local", b.dict()["spec"])
    obj = wait_for(
        lambda: (
            (o := get_pdd(cluster.api_client, namespace, "local"))
            and o["status"].get("prefill") == "3/3"
            and settled(o)
            and o
        ),
        "scaled",
        60,
    )
    assert set(deployments(cluster.api_client, namespace)) == set(before)
    assert obj["status"]["currentRevision"] == rev


# ---- 4. incompatible spec that passes CEL ----------------------------------------------------


def test_incompatible_spec_is_reported_and_touches_nothing(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(pdd("bad").mtp(3))  # mtpModules undeclared
    create_pdd(cluster.api_client, namespace, b.dict())
    wait_settled(cluster.api_client, namespace, "bad")
    uids = {p.metadata.uid for p in pods(cluster.api_client, namespace)}
    names = set(deployments(cluster.api_client, namespace))

    b.prefill(k=2)  # passes CEL; only the operator can tell
    patch_spec(cluster.api_client, namespace, "bad", b.dict()["spec"])
    obj = wait_for(
        lambda: (
            (o := get_pdd(cluster.api_client, namespace, "bad"))
            and o["status"]["observedGeneration"] == 2
            and o
        ),
        "generation 2 observed",
        30,
    )
    c = condition(obj, "ConfigCompatible")
    assert c is not None and c["status"] == "False" and c["reason"] == "MTPModulesUnknown"
    assert "spec.model.mtpModules" in c["message"]
    assert condition(obj, "Progressing")["reason"] == "RolloutBlocked"  # type: ignore[index]
    assert is_true(obj, "Available")
    time.sleep(3)  # a resync or two: still nothing moves
    assert set(deployments(cluster.api_client, namespace)) == names
    assert {p.metadata.uid for p in pods(cluster.api_client, namespace)} == uids
    warnings = [
        e
        for e in client.CoreV1Api(cluster.api_client).list_namespaced_event(namespace).items
        if e.type == "Warning" and e.reason == "MTPModulesUnknown"
    ]
    assert warnings

    b.mtp(3, modules=1)  # fix: declare the (single) MTP module: both roles derive lookahead 1
    patch_spec(cluster.api_client, namespace, "bad", b.dict()["spec"])
    obj = wait_settled(cluster.api_client, namespace, "bad")
    assert is_true(obj, "ConfigCompatible") and obj["status"]["lookahead"]["prefill"] is not None


# ---- 5. superseded rollout -------------------------------------------------------------------


def test_superseded_rollout_completes_to_the_last_spec(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    b = ready_after(
        pdd("abc")
        .mtp(3, modules=4)
        .prefill(replicas=2)
        .decode(replicas=2)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3),
        ms=1500,
    )
    create_pdd(cluster.api_client, namespace, b.dict())
    a = wait_settled(cluster.api_client, namespace, "abc")["status"]["currentRevision"]
    watcher = start_watcher(cluster, namespace, "abc", b)

    b.mtp(2, modules=4)
    b_rev = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "abc", b.dict()["spec"])
    wait_for(
        lambda: any(
            p.metadata.labels[v.LABEL_REVISION] == b_rev
            and p.metadata.labels[v.LABEL_ROLE] == "router"
            for p in pods(cluster.api_client, namespace)
        ),
        "B routed",
        60,
    )

    b.mtp(4, modules=4)
    c_rev = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    assert watcher.monitor.anchor == a
    patch_spec(cluster.api_client, namespace, "abc", b.dict()["spec"])
    obj = wait_settled(cluster.api_client, namespace, "abc", timeout=180)
    watcher.stop()

    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == c_rev
    assert revisions_present(cluster.api_client, namespace) == {c_rev}


def test_superseded_roll_of_three_decode_with_operator_kills_keeps_the_floor_clients_see(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    """Issue 31's dip: A -> B -> C with 3 decode pods, maxUnavailable 0, the operator killed
    as C starts and again as B drains. The watcher counts only what a client can reach (Ready
    pods of revisions whose router Deployment has replicas and a Ready pod). With the planner
    before it counted the same, 1 of 3 runs here was red: the operator marked one of A's decode
    pods leaving 60 ms after it scaled B's router to zero, B's router pod still Ready in its
    view: "2 decode pods a client can reach, fewer than 3 (... A [2, 1, 1, 1], B [1, 1, 0, 1],
    C [1, 1, 1, 1])"."""
    b = ready_after(
        pdd("dip")
        .mtp(3, modules=4)
        .prefill(replicas=1)
        .decode(replicas=3)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=3),
        ms=1500,
    )
    create_pdd(cluster.api_client, namespace, b.dict())
    wait_settled(cluster.api_client, namespace, "dip")
    watcher = start_watcher(cluster, namespace, "dip", b)

    def router_ready(rev: str) -> bool:
        return any(
            p.metadata.labels[v.LABEL_REVISION] == rev
            and p.metadata.labels[v.LABEL_ROLE] == "router"
            and pod_ready(p)
            for p in pods(cluster.api_client, namespace)
        )

    def draining_or_gone(rev: str) -> bool:
        router = deployments(cluster.api_client, namespace).get(f"dip-{rev}-router")
        return router is None or v.ANNOTATION_DRAIN_UNTIL in (router.metadata.annotations or {})

    b.mtp(2, modules=4)
    b_rev = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "dip", b.dict()["spec"])
    wait_for(lambda: router_ready(b_rev), "B serving", 60, interval=0.05)

    b.mtp(4, modules=4)
    c_rev = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "dip", b.dict()["spec"])
    kill_points = [
        (
            "C's workloads created",
            lambda: f"dip-{c_rev}-decode" in deployments(cluster.api_client, namespace),
        ),
        ("B draining (or gone)", lambda: draining_or_gone(b_rev)),
    ]
    for what, point in kill_points:
        wait_for(point, what, 90, interval=0.05)
        operator.kill()
        time.sleep(random.uniform(0.5, 2.0))
        operator.start()
    obj = wait_settled(cluster.api_client, namespace, "dip", timeout=180)
    watcher.stop()

    assert operator.starts == 3
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == c_rev
    assert revisions_present(cluster.api_client, namespace) == {c_rev}


# ---- 6. restart safety -----------------------------------------------------------------------


@pytest.mark.parametrize("replicas", [1, 2], ids=["alone", "with-a-standby"])
def test_operator_killed_mid_roll_finishes_it_after_restart(
    cluster: Cluster, crd: None, namespace: str, tmp_path: Path, replicas: int
) -> None:
    """Alone: each kill is a restart from what it observes. With a standby (two replicas
    electing on a Lease), each kill is a failover: the standby leads once the lease runs out,
    and the killed one comes back as the standby."""
    if replicas == 1:
        ops = [OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log")]
    else:
        ops = [elected(cluster.kubeconfig, namespace, tmp_path, f"op-{i}") for i in range(2)]
    for op in ops:
        op.start()
    try:
        _kill_mid_roll(cluster, namespace, ops)
    finally:
        for op in ops:
            op.stop()
            print(f"---- {op.log_path.name} ----\n" + op.log_tail(80))


def _kill_mid_roll(cluster: Cluster, namespace: str, ops: list[OperatorProcess]) -> None:
    b = ready_after(
        pdd("crash")
        .mtp(3, modules=3)
        .prefill(replicas=2)
        .decode(replicas=2)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=4),
        ms=1200,
    )
    create_pdd(cluster.api_client, namespace, b.dict())
    wait_settled(cluster.api_client, namespace, "crash")
    watcher = start_watcher(cluster, namespace, "crash", b)
    b.mtp(2, modules=3)
    new_rev = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(cluster.api_client, namespace, "crash", b.dict()["spec"])

    def has(role: str, ready: bool) -> bool:
        return any(
            p.metadata.labels[v.LABEL_REVISION] == new_rev
            and p.metadata.labels[v.LABEL_ROLE] == role
            and (not ready or pod_ready(p))
            for p in pods(cluster.api_client, namespace)
        )

    # Kill points: new workloads exist but no traffic yet; new router up; old one draining.
    kill_points = [
        (
            "new workloads created, before the traffic switch",
            lambda: (
                f"crash-{new_rev}-prefill" in deployments(cluster.api_client, namespace)
                and not has("router", ready=False)
            ),
        ),
        ("new revision serving", lambda: has("router", ready=True)),
        (
            "old revision draining",
            lambda: any(
                d.metadata.annotations and v.ANNOTATION_DRAIN_UNTIL in d.metadata.annotations
                for d in deployments(cluster.api_client, namespace).values()
            ),
        ),
    ]

    def restart(victim: OperatorProcess) -> None:
        time.sleep(random.uniform(0.5, 2.0))
        victim.start()

    failovers = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        restarting: Future[None] | None = None
        for what, point in kill_points:
            wait_for(point, what, 60, interval=0.05)
            if restarting:
                restarting.result()  # the previous victim is back, as the standby
            victim = ops[0] if len(ops) == 1 else wait_leader(ops)
            victim.kill()
            killed = time.monotonic()
            if len(ops) == 1:
                restart(victim)  # nothing moves the roll until it is back
                continue
            standby = next(op for op in ops if op is not victim)
            wait_for(lambda s=standby: leading(s), "the standby leads", 30, interval=0.05)
            failovers.append(time.monotonic() - killed)
            # The standby carries the roll on meanwhile: the victim restarts beside the wait for
            # the next point, which (the old revision's drain, 4 s) can come and go in less time
            # than a start takes on a loaded machine (seen in CI).
            restarting = pool.submit(restart, victim)
        if restarting:
            restarting.result()
    obj = wait_settled(cluster.api_client, namespace, "crash", timeout=180)
    watcher.stop()

    if failovers:
        print("failovers (s):", ", ".join(f"{s:.2f}" for s in failovers))
        assert max(failovers) <= LEASE_SECONDS + 3
    assert sum(op.starts for op in ops) == len(ops) + 3
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == new_rev
    assert revisions_present(cluster.api_client, namespace) == {new_rev}, "orphans left behind"
    names = set(deployments(cluster.api_client, namespace))
    assert names == {f"crash-{new_rev}-{r}" for r in ("prefill", "decode", "router")}


# ---- degraded --------------------------------------------------------------------------------


def test_engine_termination_message_surfaces_as_degraded(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    message = (
        "lookahead mismatch: operator expects 3, vLLM computes 1 (method=mtp k=3 mtp_modules=1)"
    )
    b = pdd("deg").mtp(3, modules=3).decode(podAnnotations=engine_refusal(message))
    create_pdd(cluster.api_client, namespace, b.dict())
    obj = wait_for(
        lambda: (
            (o := get_pdd(cluster.api_client, namespace, "deg")) and is_true(o, "Degraded") and o
        ),
        "Degraded",
        60,
    )
    c = condition(obj, "Degraded")
    assert c is not None and message in c["message"] and "decode pod" in c["message"]
    assert c["reason"] == "EngineRefusedConfig"
    assert not is_true(obj, "Available")


# ---- 7. deletion -----------------------------------------------------------------------------


def test_deleting_the_pddeployment_removes_every_child(
    cluster: Cluster, namespace: str, operator: OperatorProcess
) -> None:
    create_pdd(cluster.api_client, namespace, ready_after(pdd("gone")).dict())
    wait_settled(cluster.api_client, namespace, "gone")
    assert deployments(cluster.api_client, namespace)
    client.CustomObjectsApi(cluster.api_client).delete_namespaced_custom_object(
        v.GROUP, v.VERSION, namespace, v.PLURAL, "gone"
    )
    core = client.CoreV1Api(cluster.api_client)
    wait_for(
        lambda: (
            not deployments(cluster.api_client, namespace)
            and not pods(cluster.api_client, namespace)
            and not [
                s
                for s in core.list_namespaced_service(namespace).items
                if s.metadata.labels and s.metadata.labels.get(v.LABEL_NAME) == "gone"
            ]
            and not client.NetworkingV1Api(cluster.api_client)
            .list_namespaced_network_policy(namespace)
            .items
        ),
        "garbage collection",
        60,
        interval=0.5,
    )
