"""Autoscaling an External role through its PDRoleScale: kube-controller-manager's real
HorizontalPodAutoscaler, fed an external metric by KEDA (tests/support/keda.py), sets the scale
subresource of the decode role's PDRoleScale, and the operator rolls the decode role to it: up
when the metric rises, back down when it falls. No HPA status is written by hand.

The metric is a JSON value the test serves on 127.0.0.1 (KEDA's metrics-api trigger). Each step's
time (metric changed -> pods Ready, or gone) is printed and recorded as a property.

KEDA's binaries come from `make keda-bins` (`make test-cluster` builds them). Without them this
test is skipped, with the reason in pytest's summary and a warning as well; PDMTP_REQUIRE_ALL=1
(as make runs it) or PDMTP_REQUIRE_KEDA=1 makes it fail instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn, cast

import pytest
from builders import pdd
from cluster.kubehelpers import Cluster, wait_for
from keda import (
    Keda,
    MetricServer,
    ScaleTargetRef,
    build_problem,
    metrics_api_trigger,
    running_keda,
)
from kubernetes import client
from operator_harness import OperatorProcess, create_pdd, get_pdd, ready_after, wait_settled
from pdmtp.api import vocabulary as v

# The metric per replica the HPA aims at (AverageValue): it wants ceil(metric / TARGET) replicas.
TARGET = 10
REPO = Path(__file__).resolve().parents[2]
STEP_TIMEOUT = 90
NAME = "hpa"


def _keda_missing(why: str) -> NoReturn:
    if "1" in (os.environ.get("PDMTP_REQUIRE_KEDA"), os.environ.get("PDMTP_REQUIRE_ALL")):
        pytest.fail(f"KEDA required (PDMTP_REQUIRE_ALL=1, as make runs it): {why}", pytrace=False)
    warnings.warn(pytest.PytestWarning(f"autoscaling through KEDA NOT TESTED: {why}"), stacklevel=2)
    pytest.skip(f"autoscaling through KEDA not tested: {why}")


@pytest.fixture(scope="module")
def keda(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keda]:
    if cluster.local is None:
        pytest.skip(
            f"PDMTP_CLUSTER={cluster.backend}: KEDA's adapter runs on this host's loopback, which "
            "only an API server on this host (the local control plane) can reach"
        )
    if os.environ.get("PDMTP_BUILD_KEDA") == "1":
        # `make test-cluster`: the build (or the wait for hack/prebuild.sh's, under its lock)
        # happens here, last in the tier (conftest orders this file last), so the tier's other
        # tests run while a cold build is still going.
        started = time.monotonic()
        built = subprocess.run(
            [str(REPO / "hack" / "keda" / "build.sh")],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=3600,
        )
        print(f"\nKEDA build ready after {time.monotonic() - started:.1f}s", file=sys.stderr)
        if built.returncode != 0:
            _keda_missing(f"hack/keda/build.sh exited {built.returncode}: {built.stderr[-2000:]}")
    problem = build_problem()
    if problem:
        _keda_missing(problem)
    with running_keda(cluster.kubeconfig, tmp_path_factory.mktemp("keda")) as running:
        print(f"\nKEDA up in {running.timings['total']:.1f}s", file=sys.stderr)
        yield running
    print(f"\nKEDA torn down in {running.timings['stop']:.1f}s", file=sys.stderr)


def test_an_hpa_fed_by_keda_scales_a_role_through_its_pdrolescale(
    cluster: Cluster, crd: None, keda: Keda, namespace: str, tmp_path: Any, record_property: Any
) -> None:
    api = cluster.api_client
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    op = OperatorProcess(cluster.kubeconfig, [namespace], tmp_path / "operator.log")
    op.start()
    scale_name = f"{NAME}-decode"
    b = ready_after(pdd(NAME).prefill(replicas=1).decode(replicas=1), ms=300).set(
        autoscaling={"decode": {"source": "External", "minReplicas": 1, "maxReplicas": 3}}
    )
    create_pdd(api, namespace, b.dict())

    def decode_pods(ready: bool = True) -> int:
        pods = core.list_namespaced_pod(
            namespace, label_selector=f"{v.LABEL_NAME}={NAME},{v.LABEL_ROLE}=decode"
        ).items
        return sum(
            1
            for p in pods
            if p.metadata.deletion_timestamp is None
            and (
                not ready
                or any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            )
        )

    def scale_status() -> dict[str, Any]:
        obj = cast(
            dict[str, Any],
            custom.get_namespaced_custom_object(
                v.GROUP, v.VERSION, namespace, v.ROLE_SCALE_PLURAL, scale_name
            ),
        )
        return cast(dict[str, Any], obj.get("status") or {})

    timings: dict[str, float] = {}
    try:
        wait_settled(api, namespace, NAME)
        wait_for(lambda: scale_status().get("replicas") == 1, "the PDRoleScale's status", 30)
        with MetricServer(value=TARGET) as metric:
            target = ScaleTargetRef(v.API_VERSION, v.ROLE_SCALE_KIND, scale_name)
            t0 = time.monotonic()
            keda.create_scaled_object(
                namespace,
                scale_name,
                target,
                [metrics_api_trigger(metric.url, TARGET)],
                max_replicas=3,
            )
            try:
                keda.wait_scaling_active(namespace, scale_name)
                timings["scaling_active"] = time.monotonic() - t0
                assert metric.requests > 0, "the HPA is active but KEDA never read the metric"
                for label, value, replicas in (
                    ("up_1_to_3", 3 * TARGET, 3),
                    ("down_3_to_1", TARGET, 1),
                ):
                    metric.value = value
                    t0 = time.monotonic()
                    wait_for(
                        lambda replicas=replicas: (
                            decode_pods(ready=replicas > 1) == replicas
                            and decode_pods(ready=False) == replicas
                        ),
                        f"{replicas} decode pods (metric {value})",
                        STEP_TIMEOUT,
                        interval=0.25,
                    )
                    timings[label] = time.monotonic() - t0
                    status = get_pdd(api, namespace, NAME)["status"]["autoscaling"]["roles"][0]
                    assert (status["name"], status["desiredReplicas"]) == ("decode", replicas)
                    assert f"set to {replicas} through its scale endpoint" in status["reason"]
            finally:
                print("---- ScaledObjects, HPAs and KEDA logs ----\n" + keda.describe(namespace))
                keda.delete_scaled_object(namespace, scale_name)
    finally:
        op.stop()
        print("---- operator log ----\n" + op.log_tail(80))
    summary = ", ".join(f"{k} {s:.1f}s" for k, s in timings.items())
    print(f"\nKEDA -> HPA -> PDRoleScale/scale -> decode pods: {summary}", file=sys.stderr)
    for key, seconds in timings.items():
        record_property(f"keda_{key}_s", round(seconds, 2))
