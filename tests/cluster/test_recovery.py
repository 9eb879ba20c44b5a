"""The operator recovers by itself from what the control plane does to it (issue 21): a CRD created
after the operator started, and an API server (with etcd) killed mid-rollout and started again
while the operator restarts too. Local control plane only: these tests kill and re-create what
every other test shares, so they leave it as they found it.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from builders import pdd
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
    wait_settled,
)
from pdmtp.api import vocabulary as v
from pdmtp.core.agreement import check
from pdmtp.core.revision import compat_revision
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


def test_a_router_removed_late_still_leaves_its_revision_the_whole_drain(
    local: Cluster, namespace: str, crd: None, tmp_path: Path
) -> None:
    """The Deployment controller removes the old revision's router pod seconds after the operator
    scaled it to zero (kube-controller-manager frozen, as its caches are after an outage): the
    old revision's pods still stay drainSeconds after that pod stopped serving (invariant 4),
    counted from the traffic-stopped time the operator records on the router Deployment."""
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

    def new_router_ready() -> bool:
        selector = f"{v.LABEL_NAME}=late,{v.LABEL_REVISION}={new_rev},{v.LABEL_ROLE}=router"
        return any(
            pod_ready(p) for p in core.list_namespaced_pod(namespace, label_selector=selector).items
        )

    timeline: list[str] = []
    try:
        wait_for(new_router_ready, "the new revision's router Ready", 90, interval=0.05)
        # The operator un-routes the old revision next: nothing will remove its router pod.
        manager.suspend()
        frozen = time.time()
        wait_for(
            lambda: apps.read_namespaced_deployment(router, namespace).spec.replicas == 0,
            "the old router scaled to zero",
            30,
            interval=0.05,
        )
        # The router pod serves on for longer than a drain: an operator that counted the drain
        # from its last look at a serving router (it looks again every drain or so) would end it
        # up to a whole drain early.
        time.sleep(1.5 * DRAIN)
        selector = f"{v.LABEL_NAME}=late,{v.LABEL_REVISION}={old},{v.LABEL_ROLE}=router"
        assert any(
            pod_ready(p) for p in core.list_namespaced_pod(namespace, label_selector=selector).items
        )
        marks = apps.read_namespaced_deployment(router, namespace).metadata.annotations or {}
        timeline.append(f"{time.time() - frozen:.1f}s frozen: router marks {marks}")
        assert v.ANNOTATION_TRAFFIC_STOPPED not in marks, marks
    finally:
        manager.resume()
    resumed = time.time()
    obj = wait_settled(api, namespace, "late", timeout=120)
    watcher.stop()
    op.stop()
    if watcher.violations:
        print("---- timeline ----\n" + "\n".join(timeline))
        print("---- operator log ----\n" + op.log_tail(80))
    assert watcher.violations == [], (watcher.violations[:5], watcher.views)
    assert obj["status"]["currentRevision"] == new_rev
    print(f"controller manager frozen {resumed - frozen:.1f} s; {timeline}")


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
