"""The operator recovers by itself from what the control plane does to it (issue 21): a CRD created
after the operator started, and an API server (with etcd) killed mid-rollout and started again
while the operator restarts too. Local control plane only: these tests kill and re-create what
every other test shares, so they leave it as they found it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from builders import compat_revision, pdd
from cluster.kubehelpers import Cluster, install_crd, pod_ready, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from operator_harness import (
    OperatorProcess,
    RolloutWatcher,
    create_pdd,
    delete_webhook_configuration,
    get_pdd,
    objects_dump,
    patch_spec,
    ready_after,
    settled,
    wait_settled,
)
from pdmtp.api import vocabulary as v
from pdmtp.core.agreement import check
from pdmtp.core.objects import parse_time
from pdmtp.core.rollout.steering import target_and_policy

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "pdmtp.io_pddeployments.yaml"
CRD_NAME = f"{v.PLURAL}.{v.GROUP}"
RECONCILED_WITHIN = 15.0
"""Seconds from a PDDeployment's creation to its first status, once its CRD is served: the
reflector's longest pause between listings (8 s, plus a quarter of jitter) and a reconcile."""
CRD_DELAYS = (1.0, 4.0, 8.0, 12.0)
"""Seconds between the operator's start and the CRD's creation."""
OUTAGE_SECONDS = 10.0
DRAIN = 10
"""drainSeconds of the late-router test."""
READY_MS = 4000
"""Engine pods turn Ready this long after they start: the outage lands while the surge waits."""


@pytest.fixture
def local(cluster: Cluster) -> Cluster:
    if cluster.local is None or cluster.backend != "local":
        pytest.skip("kills and restarts control-plane processes: the local control plane only")
    return cluster


def delete_crd(api: client.ApiClient) -> None:
    ext = client.ApiextensionsV1Api(api)
    try:
        ext.delete_custom_resource_definition(CRD_NAME)
    except ApiException as exc:
        if exc.status != 404:
            raise

    def gone() -> bool:
        try:
            ext.read_custom_resource_definition(CRD_NAME)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, "CRD deleted", 60, transient=())


@pytest.fixture
def without_crd(local: Cluster) -> Iterator[None]:
    delete_crd(local.api_client)
    try:
        yield
    finally:
        install_crd(local.api_client, CRD_FILE)


def pdd_watched(op: OperatorProcess) -> float:
    return op.metrics().get(
        f'pdmtp_resource_watched{{resource="{v.PLURAL}",scope="{op.namespaces[0]}"}}', -1.0
    )


def test_crd_created_after_the_operator_is_served_every_time(
    local: Cluster, without_crd: None, namespace: str, tmp_path: Path
) -> None:
    results = []
    for i, delay in enumerate(CRD_DELAYS):
        op = OperatorProcess(local.kubeconfig, [namespace], tmp_path / f"operator-{i}.log")
        op.start()
        try:
            time.sleep(delay)
            # Before the CRD: live (within its grace), not ready, and it says why.
            live, _ = op.health("/healthz")
            ready, body = op.health("/readyz")
            assert (live, ready) == (200, 503), body
            assert any("is its CRD installed?" in p for p in body["problems"]), body
            assert pdd_watched(op) == 0.0

            install_crd(local.api_client, CRD_FILE)
            name = f"late-{i}"
            create_pdd(local.api_client, namespace, ready_after(pdd(name)).dict())
            created = time.monotonic()
            wait_for(
                lambda name=name: (
                    get_pdd(local.api_client, namespace, name).get("status") or {}
                ).get("observedGeneration"),
                f"{name} reconciled (operator log:\n{op.log_tail(30)})",
                RECONCILED_WITHIN,
                interval=0.1,
            )
            results.append((delay, round(time.monotonic() - created, 1)))
            assert wait_for(lambda op=op: op.health("/readyz")[0] == 200, "ready", 10)
            assert pdd_watched(op) == 1.0
        finally:
            op.stop()
        delete_crd(local.api_client)
    print(f"CRD delay (s) -> first status after creation (s): {results}")


@pytest.mark.parametrize("restart_at", ["outage", "return", "after"])
def test_control_plane_killed_mid_rollout_while_the_operator_restarts(
    local: Cluster, namespace: str, crd: None, tmp_path: Path, restart_at: str
) -> None:
    """etcd and the API server die mid-rollout with the operator; the operator comes back during
    the outage, as the API server returns (discovery still filling), or a while after."""
    assert local.local is not None
    api = local.api_client
    op = OperatorProcess(local.kubeconfig, [namespace], tmp_path / "operator.log")
    op.start()
    b = ready_after(
        pdd("outage")
        .mtp(3, modules=3)
        .prefill(replicas=2)
        .decode(replicas=2)
        .rollout(maxSurge=1, maxUnavailable=0, drainSeconds=4),
        ms=READY_MS,
    )
    create_pdd(api, namespace, b.dict())
    wait_settled(api, namespace, "outage")
    spec = b.build().spec
    watcher = RolloutWatcher(
        api, namespace, "outage", target_and_policy(check(spec))[1], forgive_surplus=True
    )
    watcher.start(spec)
    b.mtp(2, modules=3)
    new_rev = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(api, namespace, "outage", b.dict()["spec"])
    core = client.CoreV1Api(api)

    def surged() -> bool:
        # Kill once the surge's pods are bound and not Ready yet: no pod create in flight (a
        # create whose answer the crash loses is retried by the ReplicaSet controller, one pod
        # too many that is Kubernetes' doing, not the operator's), the roll half done.
        selector = f"{v.LABEL_NAME}=outage,{v.LABEL_REVISION}={new_rev}"
        new = core.list_namespaced_pod(namespace, label_selector=selector).items
        roles = {p.metadata.labels.get(v.LABEL_ROLE) for p in new if p.spec.node_name}
        return {"prefill", "decode"} <= roles and not any(pod_ready(p) for p in new)

    wait_for(surged, "the new revision's first pods bound", 60, interval=0.05)
    timeline: list[str] = []
    recording = threading.Event()

    def record() -> None:  # the status as the operator wrote it, to explain a violation
        last = None
        while not recording.wait(0.2):
            try:
                status = get_pdd(api, namespace, "outage").get("status") or {}
            except Exception:  # the API server is down: nothing to record
                continue
            now = (
                status.get("revisions"),
                [c.get("message") for c in status.get("conditions", [])],
            )
            if now != last:
                timeline.append(f"{time.time():.1f} {json.dumps(now)}")
                last = now

    recorder = threading.Thread(target=record, daemon=True)
    recorder.start()
    try:
        local.local.kill("kube-apiserver", "etcd")
        op.kill()
        if restart_at == "outage":
            time.sleep(OUTAGE_SECONDS / 2)
            op.start()
            time.sleep(OUTAGE_SECONDS / 2)
            local.local.restart("etcd", "kube-apiserver")
        else:
            time.sleep(OUTAGE_SECONDS)
            local.local.restart("etcd", "kube-apiserver")
            time.sleep(0 if restart_at == "return" else 5)
            op.start()
        obj = wait_settled(api, namespace, "outage", timeout=180)
    except BaseException:
        print("---- operator log ----\n" + op.log_tail(150))
        print("---- namespace ----\n" + "\n".join(objects_dump(api, namespace)))
        raise
    finally:
        recording.set()
        watcher.stop()
        op.stop()
    if watcher.violations:
        print("---- status timeline ----\n" + "\n".join(timeline))
        print("---- operator log ----\n" + op.log_tail(150))
        print("---- what the watcher saw ----\n" + "\n".join(watcher.views))
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == new_rev
    assert op.starts == 2


def test_a_router_that_stops_serving_while_the_operator_is_down_leaves_the_whole_drain(
    local: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    """The old revision's router pod stops serving seconds after the operator un-routed the
    revision, while the operator is down (kube-controller-manager frozen across the un-routing,
    as its caches are after an outage; the operator killed once it has): restarted, the
    operator counts the drain from when it saw the pod gone, which it records on the router
    Deployment, never from when it un-routed (issue 52: the outage test's early drain)."""
    assert local.local is not None
    api = local.api_client
    apps, core = client.AppsV1Api(api), client.CoreV1Api(api)
    op = OperatorProcess(local.kubeconfig, [namespace], tmp_path / "operator.log")
    op.start()
    b = ready_after(pdd("late").mtp(3, modules=3).rollout(drainSeconds=DRAIN), ms=500)
    create_pdd(api, namespace, b.dict())
    old = wait_settled(api, namespace, "late")["status"]["currentRevision"]
    watcher = RolloutWatcher.watching(api, namespace, "late", b)
    b.mtp(2, modules=3)
    new_rev = compat_revision(b.build().spec)
    watcher.expect(b.build().spec)
    patch_spec(api, namespace, "late", b.dict()["spec"])
    manager = psutil.Process(local.local.running_pids()["kube-controller-manager"])
    router = f"late-{old}-router"

    def router_pods(revision: str) -> list[client.V1Pod]:
        selector = f"{v.LABEL_NAME}=late,{v.LABEL_REVISION}={revision},{v.LABEL_ROLE}=router"
        return list(core.list_namespaced_pod(namespace, label_selector=selector).items)

    def marks() -> dict[str, str]:
        return apps.read_namespaced_deployment(router, namespace).metadata.annotations or {}

    # Frozen once the new router's pod exists: it turns Ready without the controller manager
    # (KWOK), and the operator un-routes the old revision then, so nothing can remove the old
    # router pod. Frozen only once the new pod was Ready, the operator could un-route first and
    # the old pod be gone before the freeze (the test then timed the stop 5 s late; run 6).
    wait_for(lambda: router_pods(new_rev), "the new revision's router pod", 90, interval=0.05)
    manager.suspend()
    try:
        wait_for(lambda: v.ANNOTATION_DRAIN_UNTIL in marks(), "the old router turned off", 30)
        op.kill()
        time.sleep(DRAIN / 2)
        held = router_pods(old)
        assert held and all(pod_ready(p) for p in held), "the freeze did not hold the pod"
    finally:
        manager.resume()
    wait_for(lambda: not router_pods(old), "the old router pod gone", 60, interval=0.05)
    gone = time.time()
    time.sleep(2)
    op.start()
    stopped: list[str] = []

    def settled_with_the_stop_recorded() -> dict[str, Any] | None:
        with contextlib.suppress(ApiException):  # the old router is deleted when it retires
            if recorded := marks().get(v.ANNOTATION_TRAFFIC_STOPPED):
                stopped[:] = [recorded]
        obj = get_pdd(api, namespace, "late")
        return obj if settled(obj) else None

    try:
        obj = wait_for(settled_with_the_stop_recorded, "late settled", 180, interval=0.2)
    finally:
        watcher.stop()
        op.stop()
    if watcher.violations:
        print("---- operator log ----\n" + op.log_tail(80))
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == new_rev
    # The fact the drain was counted from: no earlier than the pod was seen gone.
    assert stopped and parse_time(stopped[0]) >= int(gone), (stopped, gone)


@pytest.mark.parametrize("delay", [2.0, 8.0])
def test_a_webhook_whose_crd_came_late_admits_or_the_operator_asks_for_a_restart(
    local: Cluster, without_crd: None, namespace: str, tmp_path: Path, delay: float
) -> None:
    """kopf resolves the webhook's resource from discovery, which a CRD created just after the
    operator can miss for good: then readiness says so, and liveness fails once the grace is
    over, so Kubernetes restarts the pod. Reconciling never depends on it."""
    grace = 20
    op = OperatorProcess(
        local.kubeconfig,
        [namespace],
        tmp_path / "operator.log",
        webhook=True,
        extra_args=["--unwatched-grace-seconds", str(grace)],
    )
    custom = client.CustomObjectsApi(local.api_client)
    op.start()
    try:
        time.sleep(delay)
        install_crd(local.api_client, CRD_FILE)
        create_pdd(local.api_client, namespace, ready_after(pdd("good")).dict())
        wait_for(
            lambda: (get_pdd(local.api_client, namespace, "good").get("status") or {}).get(
                "observedGeneration"
            ),
            "reconciled",
            RECONCILED_WITHIN,
        )

        def outcome() -> str | None:
            if op.health("/readyz")[0] == 200:
                return "ready"
            return "restart" if op.health("/healthz")[0] == 500 else None

        found = wait_for(outcome, "ready, or not live", grace + 15, interval=0.5)
        if found == "restart":
            _, body = op.health("/healthz")
            assert any("webhook" in p for p in body["problems"]), body
            return

        def refused() -> str | None:
            bad = pdd("bad").mtp(3).prefill(k=2).dict()
            try:
                create_pdd(local.api_client, namespace, bad)
            except ApiException as e:
                return str(e.body)
            custom.delete_namespaced_custom_object(v.GROUP, v.VERSION, namespace, v.PLURAL, "bad")
            return None

        body = wait_for(refused, "the webhook to refuse", 30, interval=0.5)
        assert "denied the request" in body, body
    finally:
        op.stop()
        delete_webhook_configuration(local.api_client)
