"""core.reconcile.decide over hand-built API objects: what the shell would write, and status."""

from __future__ import annotations

import copy
from typing import Any

from builders import PDDBuilder, compat_revision, pdd
from pdmtp.api import reasons
from pdmtp.api import vocabulary as v
from pdmtp.core.actions import Apply, Delete, Scale
from pdmtp.core.context import Observed
from pdmtp.core.reconcile import Decision, decide
from pdmtp.core.status.conditions import ConditionUpdate, set_conditions

NOW = 1_800_000_000.0


def find(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c["type"] == type_), None)


def body(b: PDDBuilder, status: dict[str, Any] | None = None) -> dict[str, Any]:
    obj = b.dict()
    obj["metadata"].update(namespace="ns", uid="u-1", generation=1)
    if status is not None:
        obj["status"] = status
    return obj


def applied(decision: Decision) -> dict[str, dict[str, Any]]:
    """What the cluster holds after the decision's applies (as the API server would echo it)."""
    out = {}
    for a in decision.actions:
        if isinstance(a, Apply):
            m = copy.deepcopy(a.manifest)
            m["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
            out[a.key] = m
    return out


def pods_for(
    deployment: dict[str, Any], ready: bool = True, ip_base: int = 10
) -> list[dict[str, Any]]:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    anns = deployment["spec"]["template"]["metadata"].get("annotations", {})
    return [
        {
            "kind": "Pod",
            "metadata": {
                "name": f"{deployment['metadata']['name']}-{i}",
                "namespace": "ns",
                "labels": labels,
                "annotations": anns,
                "uid": f"p{i}",
            },
            # The template's spec, as the pod would carry it: a router pod's args say what it
            # lists, and only what a Ready router pod lists is capacity.
            "spec": copy.deepcopy(deployment["spec"]["template"]["spec"]),
            "status": {
                "phase": "Running",
                "podIP": f"192.0.2.{ip_base + i}",
                "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            },
        }
        for i in range(deployment["spec"]["replicas"])
    ]


def split(objs: dict[str, dict[str, Any]]) -> tuple[list[Any], list[Any]]:
    deployments = [o for k, o in objs.items() if k.startswith("Deployment/")]
    others = [o for k, o in objs.items() if not k.startswith("Deployment/")]
    return deployments, others


def test_create_renders_everything_and_waits_for_ready_pods() -> None:
    d = decide(Observed(body(pdd("x"))), NOW)
    kinds = sorted(a.key.split("/")[0] for a in d.actions if isinstance(a, Apply))
    assert kinds == ["ControllerRevision"] + ["Deployment"] * 3 + [
        "NetworkPolicy",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "Service",
        "ServiceAccount",
    ]
    router = next(
        a.manifest
        for a in d.actions
        if isinstance(a, Apply) and a.key.startswith("Deployment/") and a.key.endswith("router")
    )
    assert router["spec"]["replicas"] == 0
    conds = {c["type"]: c for c in d.status["conditions"]}
    assert conds["ConfigCompatible"]["status"] == "True"
    assert conds["Available"]["reason"] == reasons.NO_SERVING_REVISION
    assert conds["Progressing"]["status"] == "True"
    assert conds["Degraded"]["status"] == "False"
    assert d.status["observedGeneration"] == 1 and d.status["lookahead"]["decode"] == 1
    assert {e.reason for e in d.events} >= {"Created"}


def test_ready_pods_bring_the_router_up_and_then_nothing_more_to_write() -> None:
    b = pdd("x")
    first = decide(Observed(body(b)), NOW)
    objs = applied(first)
    deployments, others = split(objs)
    pods = [
        p
        for dep in deployments
        if not dep["metadata"]["name"].endswith("router")
        for p in pods_for(dep)
    ]
    second = decide(Observed(body(b, first.status), deployments, pods, others), NOW + 5)
    (router,) = [a for a in second.actions if isinstance(a, Apply)]
    args = router.manifest["spec"]["template"]["spec"]["containers"][0]["args"]
    assert router.manifest["spec"]["replicas"] == 1
    assert "http://192.0.2.10:8000" in args
    objs.update(applied(second))
    deployments, others = split(objs)
    pods += pods_for(objs[router.key], ip_base=50)
    third = decide(Observed(body(b, second.status), deployments, pods, others), NOW + 9)
    assert third.actions == ()
    assert find(third.status["conditions"], "Available")["status"] == "True"  # type: ignore[index]
    assert find(third.status["conditions"], "Progressing")["reason"] == reasons.ROLLOUT_COMPLETE  # type: ignore[index]
    fourth = decide(Observed(body(b, third.status), deployments, pods, others), NOW + 60)
    assert fourth.actions == () and not fourth.status_changed and fourth.events == ()


def test_incompatible_spec_writes_nothing_but_status() -> None:
    good = pdd("x").mtp(3)
    first = decide(Observed(body(good)), NOW)
    deployments, others = split(applied(first))
    bad = pdd("x").mtp(3).prefill(k=2)
    d = decide(Observed(body(bad, first.status), deployments, [], others), NOW + 1)
    assert d.actions == ()
    cond = find(d.status["conditions"], "ConfigCompatible")
    assert cond is not None and cond["status"] == "False"
    assert cond["reason"] == reasons.MTP_MODULES_UNKNOWN
    assert find(d.status["conditions"], "Progressing")["reason"] == reasons.ROLLOUT_BLOCKED  # type: ignore[index]
    assert d.status["updateRevision"] == compat_revision(good.build().spec)
    assert any(e.type == "Warning" and e.reason == reasons.MTP_MODULES_UNKNOWN for e in d.events)


def test_a_new_revision_scales_old_workloads_without_touching_their_templates() -> None:
    old_spec = pdd("x").prefill(replicas=2).decode(replicas=2)
    first = decide(Observed(body(old_spec)), NOW)
    objs = applied(first)
    deployments, others = split(objs)
    pods = [p for dep in deployments for p in pods_for(dep)]
    # Routers of the old revision come up.
    rolled = decide(Observed(body(old_spec, first.status), deployments, pods, others), NOW + 1)
    objs.update(applied(rolled))
    deployments, others = split(objs)
    router = next(
        o for k, o in objs.items() if k.startswith("Deployment/") and k.endswith("router")
    )
    pods = [p for dep in deployments if dep is not router for p in pods_for(dep)]
    pods += pods_for(router, ip_base=80)
    new_spec = pdd("x").prefill(replicas=2).decode(replicas=2).mtp(2, modules=1)
    d = decide(Observed(body(new_spec, rolled.status), deployments, pods, others), NOW + 2)
    new_rev = compat_revision(new_spec.build().spec)
    created = [a.key for a in d.actions if isinstance(a, Apply) and not a.exists]
    assert (
        f"Deployment/x-{new_rev}-prefill" in created and f"Deployment/x-{new_rev}-decode" in created
    )
    assert not [a for a in d.actions if isinstance(a, (Scale, Delete))]
    assert find(d.status["conditions"], "Progressing")["status"] == "True"  # type: ignore[index]


def test_a_refused_engine_start_degrades_with_the_launcher_message() -> None:
    b = pdd("x")
    first = decide(Observed(body(b)), NOW)
    deployments, others = split(applied(first))
    pods = pods_for(deployments[0], ready=False)
    pods[0]["status"]["containerStatuses"] = [
        {
            "name": "engine",
            "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {
                "terminated": {
                    "exitCode": v.LAUNCHER_REFUSED_EXIT_CODE,
                    "message": "lookahead mismatch: operator expects 3, vLLM computes 1",
                }
            },
        }
    ]
    d = decide(Observed(body(b, first.status), deployments, pods, others), NOW + 3)
    cond = find(d.status["conditions"], "Degraded")
    assert cond is not None and cond["status"] == "True"
    assert cond["reason"] == reasons.ENGINE_REFUSED_CONFIG
    assert "lookahead mismatch: operator expects 3" in cond["message"]


def test_condition_times_move_only_when_status_flips() -> None:
    up = ConditionUpdate("Available", "True", "A", "m1")
    conds, flips = set_conditions([], [up], 1, "t1")
    assert conds[0].last_transition_time == "t1" and len(flips) == 1
    conds, flips = set_conditions(conds, [ConditionUpdate("Available", "True", "B", "m2")], 2, "t2")
    assert conds[0].last_transition_time == "t1" and flips == []
    assert (conds[0].reason, conds[0].message, conds[0].observed_generation) == ("B", "m2", 2)
    conds, flips = set_conditions(
        conds, [ConditionUpdate("Available", "False", "C", "m3")], 2, "t3"
    )
    assert conds[0].last_transition_time == "t3" and flips[0].old == "True"


def test_unusable_body_reports_invalid_spec() -> None:
    broken = body(pdd("x"))
    broken["spec"]["prefill"]["replicas"] = "many"
    d = decide(Observed(broken), NOW)
    assert d.actions == ()
    cond = find(d.status["conditions"], "ConfigCompatible")
    assert cond is not None and cond["reason"] == reasons.INVALID_SPEC
    assert "spec.prefill.replicas" in cond["message"]


def test_a_refused_write_is_status_and_no_event_claims_it() -> None:
    from fake_cluster import FakeCluster
    from pdmtp.core.actions import Rejection

    fc = FakeCluster(body(pdd("x")))
    d = decide(fc.observed(), NOW)
    decode = next(a for a in d.actions if a.key.endswith("-decode"))
    refusal = Rejection(decode.key, 422, 'admission webhook "quota" denied the request: no GPUs')
    report = d.report([refusal])
    cond = find(report.written["conditions"], "Progressing")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "ChildRejected")
    assert decode.key in cond["message"] and "denied the request: no GPUs" in cond["message"]
    created = {e.message for e in report.events if e.reason == "Created"}
    assert f"Created {decode.key}" not in created and len(created) == len(d.actions) - 1
    warnings = [e for e in report.events if e.type == "Warning" and e.reason == "ChildRejected"]
    assert len(warnings) == 1 and "no GPUs" in warnings[0].message

    # The same refusal again: the condition holds, no second warning; accepted later: recovery.
    fc.apply_some(d, refused={decode.key})
    fc.body["status"] = report.written
    again = decide(fc.observed(), NOW + 1)
    still = again.report([refusal])
    assert not [e for e in still.events if e.reason == "ChildRejected"]
    assert find(still.written["conditions"], "Progressing")["reason"] == "ChildRejected"  # type: ignore[index]
    fine = again.report()
    assert find(fine.written["conditions"], "Progressing")["reason"] == "RolloutInProgress"  # type: ignore[index]
    assert f"Created {decode.key}" in {e.message for e in fine.events}


def test_pods_a_deployment_cannot_create_show_in_status() -> None:
    from fake_cluster import FakeCluster

    fc = FakeCluster(body(pdd("x")))
    fc.reconcile(NOW)
    router = fc.objects[
        next(k for k in fc.objects if k.startswith("Deployment/") and k.endswith("-router"))
    ]
    router["status"] = {
        "conditions": [
            {
                "type": "ReplicaFailure",
                "status": "True",
                "reason": "FailedCreate",
                "message": 'pods "x-router-1" is forbidden: exceeded quota: pods',
            }
        ]
    }
    d = decide(fc.observed(), NOW + 1)
    cond = find(d.status["conditions"], "Progressing")
    assert cond is not None and cond["reason"] == "PodsRejected"
    assert "exceeded quota" in cond["message"] and router["metadata"]["name"] in cond["message"]
    assert any(e.type == "Warning" and e.reason == "PodsRejected" for e in d.events)


def test_a_foreign_edit_is_reverted_and_nothing_else_is_written() -> None:
    from fake_cluster import FakeCluster

    fc = FakeCluster(body(pdd("x")))
    fc.reconcile(NOW)
    fc.run_pods()
    fc.reconcile(NOW + 1)
    fc.run_pods()
    assert fc.reconcile(NOW + 2).actions == ()
    decode = next(o for k, o in fc.objects.items() if k.endswith("-decode"))
    decode["spec"]["template"]["spec"]["containers"][0]["image"] = "evil.example.com/x:1"
    decode["spec"]["replicas"] = 5
    d = fc.reconcile(NOW + 3)
    (fix,) = d.actions
    assert isinstance(fix, Apply) and fix.exists
    assert fix.drift == ("spec.replicas", "spec.template.spec.containers[engine].image")
    assert [e.message for e in d.events if e.reason == "Updated"] == [
        f"Updated {fix.key}: spec.replicas, spec.template.spec.containers[engine].image"
    ]
    assert fc.reconcile(NOW + 4).actions == ()
    del fc.objects["Service/x"]
    (recreate,) = fc.reconcile(NOW + 5).actions
    assert isinstance(recreate, Apply) and recreate.key == "Service/x" and not recreate.exists
