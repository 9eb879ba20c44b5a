"""Scale figure: PDDeployments (1P+1D, 50 by default, PDMTP_SCALE_COUNT=500 for the benchmark)
created at once reach Available; the time is reported as a ratio against a script creating the
same pods as plain Deployments on the same cluster in the same run (the floor), with the
operator's peak RSS and its reconcile latency from its own metrics. Figures: docs/benchmarks.md.
The test holds a loose bound; the benchmark holds the number."""

from __future__ import annotations

import json
import math
import os
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
from builders import pdd
from cluster.kubehelpers import Cluster, install_crd, wait_for
from kubernetes import client
from kubernetes.client.rest import ApiException
from localcluster import fake_gpu_node
from operator_harness import OperatorProcess, create_pdd, settled
from pdmtp.api import vocabulary as v

REPO = Path(__file__).resolve().parents[2]
COUNT = int(os.environ.get("PDMTP_SCALE_COUNT", "50"))
# 2 GPUs per object at 8 per node, on top of the session's 4 nodes; pods per node stay < 110.
EXTRA_NODES = max(12, math.ceil(COUNT / 4))


def add_nodes(api: client.ApiClient) -> None:
    core = client.CoreV1Api(api)
    for i in range(EXTRA_NODES):
        try:
            core.create_node(fake_gpu_node(f"scale-gpu-{i}"))
        except ApiException as e:
            if e.status != 409:
                raise


def floor_deployment(name: str, role: str) -> dict[str, Any]:
    labels = {"app": name, "role": role}
    resources = {"limits": {v.GPU_RESOURCE: "1"}} if role != "router" else {}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{name}-{role}"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "c", "image": "fake", "resources": resources}]},
            },
        },
    }


def latency_quantile(metrics: dict[str, float], q: float) -> float:
    """A quantile of the reconcile-duration histogram, interpolated inside its bucket."""
    prefix = "pdmtp_reconcile_duration_seconds_bucket{le="
    buckets = sorted(
        (float(k[len(prefix) + 1 : -2]), n)
        for k, n in metrics.items()
        if k.startswith(prefix) and "+Inf" not in k
    )
    total = metrics.get("pdmtp_reconcile_duration_seconds_count", 0)
    rank, lower, below = q * total, 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            share = (rank - below) / (count - below) if count > below else 1.0
            return lower + (upper - lower) * share
        lower, below = upper, count
    return lower


def ready_deployments(apps: client.AppsV1Api, ns: str) -> int:
    return sum(
        (d.status.ready_replicas or 0) >= 1 for d in apps.list_namespaced_deployment(ns).items
    )


@pytest.mark.timeout(3600)
def test_fifty_pddeployments_reach_available(
    cluster: Cluster, tmp_path: Path, record_property: Any
) -> None:
    install_crd(cluster.api_client, REPO / "crds" / "pdmtp.io_pddeployments.yaml")
    add_nodes(cluster.api_client)
    core, apps = client.CoreV1Api(cluster.api_client), client.AppsV1Api(cluster.api_client)
    ns_floor, ns_op = f"scale-floor-{os.getpid()}", f"scale-op-{os.getpid()}"
    for ns in (ns_floor, ns_op):
        core.create_namespace({"metadata": {"name": ns}})
        wait_for(lambda ns=ns: core.read_namespaced_service_account("default", ns), "SA", 30)

    # The floor: the same 3 pods per object (prefill, decode, router) as plain Deployments.
    started = time.monotonic()
    for i in range(COUNT):
        for role in ("prefill", "decode", "router"):
            apps.create_namespaced_deployment(ns_floor, floor_deployment(f"d{i}", role))
    wait_for(lambda: ready_deployments(apps, ns_floor) == 3 * COUNT, "floor ready", 1800, 1)
    floor_seconds = time.monotonic() - started
    # Give the GPUs back before the operator's turn.
    core.delete_namespace(ns_floor)
    wait_for(lambda: not core.list_namespaced_pod(ns_floor).items, "floor pods gone", 900, 1)

    op = OperatorProcess(cluster.kubeconfig, [ns_op], tmp_path / "operator.log", resync_seconds=10)
    op.start()
    peak = {"rss": 0}
    stop = threading.Event()

    def sample() -> None:
        proc = psutil.Process(op.pid)
        while not stop.is_set():
            try:
                rss = sum(p.memory_info().rss for p in [proc, *proc.children(recursive=True)])
                peak["rss"] = max(peak["rss"], rss)
            except psutil.Error:
                pass
            time.sleep(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        custom = client.CustomObjectsApi(cluster.api_client)
        started = time.monotonic()
        for i in range(COUNT):
            create_pdd(cluster.api_client, ns_op, pdd(f"p{i}").dict())

        def all_available() -> bool:
            items = custom.list_namespaced_custom_object(v.GROUP, v.VERSION, ns_op, v.PLURAL)[
                "items"
            ]
            return len(items) == COUNT and all(settled(o) for o in items)

        wait_for(all_available, f"{COUNT} PDDeployments Available", 1800, 1)
        operator_seconds = time.monotonic() - started
        op_metrics = op.metrics()
    finally:
        stop.set()
        sampler.join(5)
        op.stop()
        core.delete_namespace(ns_op)

    p50, p99 = (latency_quantile(op_metrics, q) for q in (0.5, 0.99))
    ratio = operator_seconds / floor_seconds
    figures = {
        "count": COUNT,
        "floor_seconds": round(floor_seconds, 1),
        "operator_seconds": round(operator_seconds, 1),
        "ratio": round(ratio, 2),
        "operator_peak_rss_mib": round(peak["rss"] / 2**20, 1),
        "reconcile_p50_ms": round(p50 * 1000, 1),
        "reconcile_p99_ms": round(p99 * 1000, 1),
        "reconciles": int(op_metrics.get("pdmtp_reconcile_duration_seconds_count", 0)),
    }
    for key, value in figures.items():
        record_property(key, value)
    print("scale:", json.dumps(figures))
    out = os.environ.get("PDMTP_SCALE_RESULT")
    if out:
        Path(out).write_text(json.dumps(figures))
    assert peak["rss"] > 0
    assert ratio < 10, f"operator took {ratio:.1f}x the floor"
