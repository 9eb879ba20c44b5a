"""core.drift: what counts as a change to a child the operator owns, on objects shaped as the API
server returns them (defaults filled in, fields of other managers present)."""

from __future__ import annotations

import copy
from typing import Any

from builders import compat_revision, pdd
from pdmtp.core.agreement import check
from pdmtp.core.drift import drifted
from pdmtp.core.effective import resolve
from pdmtp.core.render.children import engine_deployment, shared_children


def rendered() -> dict[str, Any]:
    p = pdd("x").mtp(3, modules=3).prefill(resources={"limits": {"memory": "1.5Gi"}}).build()
    return engine_deployment(p, compat_revision(p.spec), "prefill", 2, check(p.spec))


def as_served(manifest: dict[str, Any]) -> dict[str, Any]:
    """What the API server hands back: defaults, normalised quantities, status, other owners."""
    live = copy.deepcopy(manifest)
    live["metadata"].update(uid="d-1", resourceVersion="42", generation=3)
    live["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "1"}
    spec = live["spec"]
    spec.update(progressDeadlineSeconds=600)
    pod = spec["template"]["spec"]
    pod.update(dnsPolicy="ClusterFirst", schedulerName="default-scheduler", securityContext={})
    (container,) = pod["containers"]
    container.update(terminationMessagePath="/dev/termination-log", imagePullPolicy="IfNotPresent")
    resources = container["resources"]
    resources["limits"] = {k: str(val) for k, val in resources["limits"].items()}
    resources["limits"]["memory"] = "1536Mi"  # the server's canonical form of 1.5Gi
    resources["requests"] = {k: str(val) for k, val in resources["requests"].items()}
    container["env"][1]["valueFrom"]["fieldRef"]["apiVersion"] = "v1"
    container["env"].append({"name": "ADDED_BY_SOMEONE", "value": "1"})  # keyed: not ours
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        container[probe].update(successThreshold=1)
        container[probe]["httpGet"]["scheme"] = "HTTP"
    live["status"] = {"replicas": 2, "readyReplicas": 2}
    return live


def test_a_served_copy_of_the_rendered_manifest_has_no_drift() -> None:
    manifest = rendered()
    assert drifted(manifest, as_served(manifest)) == []


def test_shared_children_as_served_have_no_drift() -> None:
    obj = pdd("x").build()
    for manifest in shared_children(obj, resolve(obj.spec)):
        live = copy.deepcopy(manifest)
        if manifest["kind"] == "Service":
            live["spec"].update(
                clusterIP="10.96.0.9", clusterIPs=["10.96.0.9"], ipFamilies=["IPv4"]
            )
        assert drifted(manifest, live) == [], manifest["kind"]


def test_an_edited_image_args_or_replicas_is_drift() -> None:
    manifest = rendered()
    live = as_served(manifest)
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["image"] = "elsewhere.example.com/engine:evil"
    container["args"] = [*container["args"], "--speculative-config", "{}"]
    live["spec"]["replicas"] = 5
    assert drifted(manifest, live) == [
        "spec.replicas",
        "spec.template.spec.containers[engine].image",
        "spec.template.spec.containers[engine].args",
    ]


def test_a_removed_label_or_env_var_is_drift_an_added_one_is_not() -> None:
    manifest = rendered()
    live = as_served(manifest)
    live["metadata"]["labels"]["extra"] = "fine"
    del live["metadata"]["labels"]["pdmtp.io/role"]
    env = live["spec"]["template"]["spec"]["containers"][0]["env"]
    live["spec"]["template"]["spec"]["containers"][0]["env"] = [
        e for e in env if e["name"] != "PDMTP_ROLE"
    ]
    assert drifted(manifest, live) == [
        "metadata.labels.pdmtp.io/role",
        "spec.template.spec.containers[engine].env[PDMTP_ROLE]",
    ]


def test_quantities_compare_by_value() -> None:
    want = {"spec": {"resources": {"limits": {"memory": "1.5Gi", "nvidia.com/gpu": 8}}}}
    same = {"spec": {"resources": {"limits": {"memory": "1536Mi", "nvidia.com/gpu": "8"}}}}
    other = {"spec": {"resources": {"limits": {"memory": "2Gi", "nvidia.com/gpu": "8"}}}}
    assert drifted(want, same) == []
    assert drifted(want, other) == ["spec.resources.limits.memory"]


def test_an_atomic_list_is_reported_once() -> None:
    want = {"spec": {"tolerations": [{"key": "a"}, {"key": "b"}]}}
    assert drifted(want, {"spec": {"tolerations": [{"key": "a"}, {"key": "c"}]}}) == [
        "spec.tolerations"
    ]
    assert drifted(want, {"spec": {"tolerations": [{"key": "a"}]}}) == ["spec.tolerations"]


def test_empty_values_match_absent_ones() -> None:
    assert drifted({"spec": {"nodeSelector": {}, "volumes": []}}, {"spec": {}}) == []
