"""Autoscaling through a scale subresource: kube-controller-manager's HorizontalPodAutoscaler, fed
an external metric by KEDA (tests/support/keda.py), scales a custom resource up when the metric
rises and back down when it falls.

The scale target is the test's own CRD (spec.replicas, status.replicas, status.selector), a
stand-in for the operator's per-role scale object; any scaleTargetRef works the same way. The
metric is a JSON value the test serves on 127.0.0.1. Each step's time (metric changed ->
spec.replicas written by the HPA) is printed and recorded as a property; most of it is waiting for
the HPA controller's next sync (every 15 s by default).

KEDA's binaries come from `make keda-bins`. Without them this test is skipped, with the reason in
pytest's summary and a warning as well; PDMTP_REQUIRE_KEDA=1 makes it fail instead.
"""

from __future__ import annotations

import functools
import os
import sys
import time
import warnings
from collections.abc import Iterator
from typing import Any, NoReturn, cast

import pytest
from cluster.kubehelpers import Cluster, install_crd, wait_for
from keda import (
    Keda,
    MetricServer,
    ScaleTargetRef,
    build_problem,
    metrics_api_trigger,
    running_keda,
)
from kubernetes import client
from kubernetes.client.exceptions import ApiException

GROUP, VERSION, PLURAL, KIND = "keda-test.pdmtp.io", "v1", "widgets", "Widget"
# The metric per replica the HPA aims at (AverageValue): it wants ceil(metric / TARGET) replicas.
TARGET = 10
STEP_TIMEOUT = 60  # four HPA sync periods


def _keda_missing(why: str) -> NoReturn:
    if os.environ.get("PDMTP_REQUIRE_KEDA") == "1":
        pytest.fail(f"KEDA required (PDMTP_REQUIRE_KEDA=1): {why}", pytrace=False)
    warnings.warn(pytest.PytestWarning(f"autoscaling through KEDA NOT TESTED: {why}"), stacklevel=2)
    pytest.skip(f"autoscaling through KEDA not tested: {why}")


@pytest.fixture(scope="module")
def keda(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Keda]:
    if cluster.local is None:
        pytest.skip(
            f"PDMTP_CLUSTER={cluster.backend}: KEDA's adapter runs on this host's loopback, which "
            "only an API server on this host (the local control plane) can reach"
        )
    problem = build_problem()
    if problem:
        _keda_missing(problem)
    with running_keda(cluster.kubeconfig, tmp_path_factory.mktemp("keda")) as running:
        print(f"\nKEDA up in {running.timings['total']:.1f}s", file=sys.stderr)
        yield running
    print(f"\nKEDA torn down in {running.timings['stop']:.1f}s", file=sys.stderr)


@pytest.fixture(scope="module")
def widget_crd(cluster: Cluster) -> Iterator[None]:
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": {"replicas": {"type": "integer"}}},
            "status": {
                "type": "object",
                "properties": {"replicas": {"type": "integer"}, "selector": {"type": "string"}},
            },
        },
    }
    crd: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": KIND.lower(), "kind": KIND},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                }
            ],
        },
    }
    install_crd(cluster.api_client, crd)
    yield
    try:
        client.ApiextensionsV1Api(cluster.api_client).delete_custom_resource_definition(
            f"{PLURAL}.{GROUP}"
        )
    except ApiException as exc:
        if exc.status != 404:
            raise


# widget_crd before keda: kube-controller-manager only knows the new kind after its next
# discovery reset (every 30 s), and KEDA's start-up takes a share of that wait.
def test_hpa_scales_a_custom_resource_up_and_down_on_an_external_metric(
    cluster: Cluster,
    widget_crd: None,
    keda: Keda,
    namespace: str,
    record_property: Any,
) -> None:
    custom = client.CustomObjectsApi(cluster.api_client)
    name = "w"

    def set_replicas_status(replicas: int) -> None:
        # What the object's controller would do once the replicas exist; the HPA reads it as
        # the current count.
        status = {"status": {"replicas": replicas, "selector": f"app={name}"}}
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, status
        )

    def spec_replicas() -> int:
        widget = cast(
            dict[str, Any],
            custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
        )
        return int(widget["spec"]["replicas"])

    def has_replicas(want: int) -> bool:
        return spec_replicas() == want

    widget = {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND, "metadata": {"name": name}}
    custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, widget | {"spec": {"replicas": 1}}
    )
    set_replicas_status(1)

    with MetricServer(value=TARGET) as metric:
        target = ScaleTargetRef(f"{GROUP}/{VERSION}", KIND, name)
        t0 = time.monotonic()
        keda.create_scaled_object(
            namespace, name, target, [metrics_api_trigger(metric.url, TARGET)], max_replicas=5
        )
        try:
            keda.wait_scaling_active(namespace, name)
            timings = {"scaling_active": time.monotonic() - t0}
            assert metric.requests > 0, "the HPA is active but KEDA never read the metric"
            assert spec_replicas() == 1

            for label, value, replicas in (
                ("up_1_to_3", 3 * TARGET, 3),
                ("down_3_to_1", TARGET, 1),
            ):
                metric.value = value
                t0 = time.monotonic()
                wait_for(
                    functools.partial(has_replicas, replicas),
                    f"the HPA to set {name} to {replicas} replicas (metric {value})",
                    STEP_TIMEOUT,
                    interval=0.25,
                )
                timings[label] = time.monotonic() - t0
                set_replicas_status(replicas)
        finally:
            print("---- ScaledObjects, HPAs and KEDA logs ----\n" + keda.describe(namespace))
            # While the namespace is still there for KEDA's last events.
            keda.delete_scaled_object(namespace, name)

    summary = ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
    print(f"\nKEDA -> HPA -> {KIND}/scale: {summary}", file=sys.stderr)
    for key, seconds in timings.items():
        record_property(f"keda_{key}_s", round(seconds, 2))
