"""Rendering: names, labels, GPUs, env, probes and engine flags of every child."""

from __future__ import annotations

import json
from typing import Any

import pytest
from builders import PDDBuilder, compat_revision, pdd
from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeploymentSpec
from pdmtp.core.agreement import check
from pdmtp.core.effective import resolve
from pdmtp.core.render.children import (
    RevisionReplicas,
    engine_args,
    revision_children,
    router_deployment,
    shared_children,
)
from pdmtp.core.render.membership import Membership, Prefill
from pdmtp.core.render.weights import served_model
from pdmtp.core.revision import role_hash
from pdmtp.core.rollout.states import revision_states


def children(b: PDDBuilder, membership: Membership | None = None) -> dict[str, dict[str, Any]]:
    obj = b.build()
    spec = obj.spec
    replicas = RevisionReplicas(spec.prefill.replicas, spec.decode.replicas, spec.router.replicas)
    rev = compat_revision(spec)
    rendered = [
        *shared_children(obj, resolve(spec)),
        *revision_children(obj, rev, replicas, check(spec), membership),
    ]
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in rendered}


def engine(objs: dict[str, dict[str, Any]], role: str) -> dict[str, Any]:
    (d,) = [o for k, o in objs.items() if k.startswith("Deployment/") and k.endswith(role)]
    return d


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    c: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return c


def args_of(spec: PDDeploymentSpec, role: str) -> list[str]:
    eff = resolve(spec)
    return engine_args(eff.shared, eff.role(role), served_model(eff.shared.model))  # type: ignore[arg-type]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_names_are_deterministic_and_revisioned() -> None:
    b = pdd("inkling").mtp(3, modules=3)
    rev = compat_revision(b.build().spec)
    assert set(children(b)) == {
        "Service/inkling",
        "NetworkPolicy/inkling-pd",
        "ServiceAccount/inkling-router",
        f"Deployment/inkling-{rev}-prefill",
        f"Deployment/inkling-{rev}-decode",
        f"Deployment/inkling-{rev}-router",
        f"PodDisruptionBudget/inkling-{rev}-prefill",
        f"PodDisruptionBudget/inkling-{rev}-decode",
    }
    assert children(b) == children(b)


def test_labels_selectors_and_owner_references() -> None:
    objs = children(pdd("x"))
    rev = compat_revision(pdd("x").build().spec)
    for role in ("prefill", "decode", "router"):
        d = engine(objs, role)
        selector = d["spec"]["selector"]["matchLabels"]
        assert selector == {v.LABEL_NAME: "x", v.LABEL_ROLE: role, v.LABEL_REVISION: rev}
        labels = d["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()
    for obj in objs.values():
        (owner,) = obj["metadata"]["ownerReferences"]
        assert owner["kind"] == "PDDeployment" and owner["controller"] is True
        assert owner["uid"] and obj["metadata"]["labels"][v.LABEL_NAME] == "x"


def test_gpus_are_tp_times_pp_and_rdma_brings_ipc_lock() -> None:
    objs = children(pdd().prefill(tp=8, pipelineParallelSize=2).decode(tp=4).rdma("mlx5_0"))
    p, d = container(engine(objs, "prefill")), container(engine(objs, "decode"))
    assert p["resources"]["limits"][v.GPU_RESOURCE] == 16
    assert d["resources"]["requests"][v.GPU_RESOURCE] == 4
    assert p["resources"]["limits"][v.RDMA_RESOURCE] == 1
    assert p["securityContext"]["capabilities"] == {"add": ["IPC_LOCK"]}
    tcp = container(engine(children(pdd()), "prefill"))
    assert "capabilities" not in tcp["securityContext"]
    assert v.RDMA_RESOURCE not in tcp["resources"]["limits"]


def test_engine_env_downward_api_and_expectations() -> None:
    objs = children(pdd().mtp(3, modules=3))
    env = {e["name"]: e for e in container(engine(objs, "decode"))["env"]}
    assert env[v.ENV_VLLM_HOST_IP]["valueFrom"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env[v.ENV_MOONCAKE_BOOTSTRAP_PORT]["value"] == "8998"
    assert env[v.ENV_EXPECTED_LOOKAHEAD]["value"] == "3"
    assert env[v.ENV_EXPECTED_BACKOFF]["value"] == "2"
    assert env[v.ENV_ROLE]["value"] == "decode"


def test_unknown_lookahead_sets_no_expectation() -> None:
    env = {e["name"] for e in container(engine(children(pdd().mtp(3)), "prefill"))["env"]}
    assert v.ENV_EXPECTED_LOOKAHEAD not in env and v.ENV_EXPECTED_BACKOFF not in env


@pytest.mark.parametrize(
    ("role", "kv_role"), [("prefill", "kv_producer"), ("decode", "kv_consumer")]
)
def test_engine_flags_load_the_fixed_connector(role: str, kv_role: str) -> None:
    spec = pdd().mtp(2, modules=2).rdma("mlx5_0", "mlx5_1").build().spec
    args = args_of(spec, role)
    assert args[:3] == ["vllm", "serve", "org/model"]
    kv = json.loads(flag(args, "--kv-transfer-config"))
    assert kv == {
        "kv_connector": "BackoffMooncakeConnector",
        "kv_connector_module_path": "pdmtp_engine.connector",
        "kv_role": kv_role,
        "kv_connector_extra_config": {
            "mooncake_protocol": "rdma",
            "mooncake_device_name": "mlx5_0,mlx5_1",
        },
    }
    assert json.loads(flag(args, "--speculative-config")) == {
        "method": "mtp",
        "num_speculative_tokens": 2,
    }


@pytest.mark.parametrize("policy", ["recompute", "fail"])
def test_the_kv_load_failure_policy_is_the_decodes_alone(policy: str) -> None:
    """Set, it reaches the decode's --kv-transfer-config (a prefill loads no KV) and the decode's
    hash alone; unset, nothing is rendered (vLLM's default) and no hash moves."""
    plain = pdd().mtp(2, modules=2)
    spec = plain.set(kvTransfer={"protocol": "tcp", "loadFailurePolicy": policy}).build().spec
    decode = json.loads(flag(args_of(spec, "decode"), "--kv-transfer-config"))
    prefill = json.loads(flag(args_of(spec, "prefill"), "--kv-transfer-config"))
    assert decode["kv_load_failure_policy"] == policy
    assert "kv_load_failure_policy" not in prefill
    unset = pdd().mtp(2, modules=2).build().spec
    decode_unset = json.loads(flag(args_of(unset, "decode"), "--kv-transfer-config"))
    assert "kv_load_failure_policy" not in decode_unset
    assert compat_revision(spec) == compat_revision(unset)
    assert role_hash(spec, "prefill") == role_hash(unset, "prefill")
    assert role_hash(spec, "decode") != role_hash(unset, "decode")


def test_role_k_override_and_extra_args_land_on_that_role_only() -> None:
    spec = pdd().mtp(1, modules=1).prefill(k=3, extra_args=["--enforce-eager"]).build().spec
    p, d = args_of(spec, "prefill"), args_of(spec, "decode")
    assert json.loads(flag(p, "--speculative-config"))["num_speculative_tokens"] == 3
    assert json.loads(flag(d, "--speculative-config"))["num_speculative_tokens"] == 1
    assert p[-1] == "--enforce-eager" and "--enforce-eager" not in d


def test_no_speculation_renders_no_speculative_config() -> None:
    assert "--speculative-config" not in args_of(pdd().no_speculation().build().spec, "decode")


def _stop(objs: dict[str, dict[str, Any]], role: str) -> tuple[int, int, int]:
    """(grace period, preStop sleep, vLLM --shutdown-timeout) of a role's engine pods."""
    pod = engine(objs, role)["spec"]["template"]["spec"]
    c = pod["containers"][0]
    shutdown = int(flag(c["args"], "--shutdown-timeout"))
    return (
        pod["terminationGracePeriodSeconds"],
        c["lifecycle"]["preStop"]["sleep"]["seconds"],
        shutdown,
    )


def test_pods_survive_model_loads_and_stop_gracefully() -> None:
    d = engine(children(pdd()), "prefill")
    pod = d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in c["volumeMounts"]
    # Serving through the preStop, then vLLM finishes what it holds (--shutdown-timeout) and
    # exits inside the grace period: 90 s unless the pod settings say otherwise.
    assert _stop(children(pdd()), "decode") == (90, 60, 25)
    own = children(
        pdd()
        .set(pod={"terminationGracePeriodSeconds": 200})
        .decode(pod={"terminationGracePeriodSeconds": 31})
    )
    assert _stop(own, "prefill") == (200, 170, 25) and _stop(own, "decode") == (31, 1, 25)
    short = children(pdd().decode(pod={"terminationGracePeriodSeconds": 5}))
    assert _stop(short, "decode") == (5, 1, 0)
    for grace in range(1, 400):
        g, pre_stop, shutdown = _stop(
            children(pdd().set(pod={"terminationGracePeriodSeconds": grace})), "prefill"
        )
        assert pre_stop >= 1 and shutdown >= 0 and (pre_stop + shutdown < g or shutdown == 0)


def test_drain_seconds_reaches_no_pod() -> None:
    """spec.rollout.drainSeconds times the operator's drain of a retiring revision; a change
    to it must not replace a serving pod (it used to set the grace period and preStop)."""
    before, after = children(pdd()), children(pdd().rollout(drainSeconds=600))
    for role in ("prefill", "decode", "router"):
        assert engine(before, role)["spec"]["template"] == engine(after, role)["spec"]["template"]


def test_prefill_advertises_its_bootstrap_port() -> None:
    objs = children(pdd().set(kvTransfer={"protocol": "tcp", "bootstrapPort": 9100}))
    p = engine(objs, "prefill")
    assert p["spec"]["template"]["metadata"]["annotations"][v.ANNOTATION_BOOTSTRAP_PORT] == "9100"
    ports = {x["name"]: x["containerPort"] for x in container(p)["ports"]}
    assert ports == {"http": v.ENGINE_HTTP_PORT, "bootstrap": 9100, "metrics": 29100}


def test_both_engine_roles_serve_the_metrics_only_port() -> None:
    objs = children(pdd())
    for role in ("prefill", "decode"):
        c = container(engine(objs, role))
        ports = {x["name"]: x["containerPort"] for x in c["ports"]}
        assert ports["metrics"] == v.ENGINE_METRICS_PORT != v.ENGINE_HTTP_PORT
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert env[v.ENV_METRICS_PORT] == str(v.ENGINE_METRICS_PORT)


def _selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A LabelSelector as the API server reads it (the operators the policy uses)."""
    if selector is None:
        return False
    if any(labels.get(k) != want for k, want in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        assert expr["operator"] == "In", expr
        if labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def _admits(
    policy: dict[str, Any],
    pod: dict[str, str],
    namespace: str,
    ns_labels: dict[str, str],
    port: int,
) -> bool:
    """NetworkPolicy ingress semantics, for a policy in namespace "ns": a peer with only a
    podSelector means pods of the policy's own namespace; a rule without ports, every port."""
    for rule in policy["spec"]["ingress"]:
        ports = rule.get("ports", [])
        if not all(p["protocol"] == "TCP" for p in ports):
            continue
        if ports and all(p.get("port") not in (None, port) for p in ports):
            continue
        for peer in rule["from"]:
            if "namespaceSelector" in peer:
                if not _selects(peer["namespaceSelector"], ns_labels):
                    continue
            elif namespace != "ns":
                continue
            if "podSelector" not in peer or _selects(peer["podSelector"], pod):
                return True
    return False


HTTP, BOOTSTRAP, TRANSFER, METRICS = v.ENGINE_HTTP_PORT, 8998, 17000, v.ENGINE_METRICS_PORT
SCRAPER = {v.LABEL_METRICS_SCRAPER: "true"}


@pytest.mark.parametrize(
    ("who", "pod", "namespace", "ns_labels", "open_ports"),
    [
        ("its prefill", {v.LABEL_NAME: "x", v.LABEL_ROLE: "prefill"}, "ns", {}, "all"),
        ("its decode", {v.LABEL_NAME: "x", v.LABEL_ROLE: "decode"}, "ns", {}, "all"),
        ("its router", {v.LABEL_NAME: "x", v.LABEL_ROLE: "router"}, "ns", {}, {HTTP, BOOTSTRAP}),
        ("another PDDeployment", {v.LABEL_NAME: "y", v.LABEL_ROLE: "decode"}, "ns", {}, set()),
        ("its labels elsewhere", {v.LABEL_NAME: "x", v.LABEL_ROLE: "decode"}, "ns2", {}, set()),
        ("an unlabelled pod", {}, "ns", {}, set()),
        ("a scraper pod", SCRAPER, "monitoring", {}, {METRICS}),
        ("a pod of a scraper namespace", {}, "monitoring", SCRAPER, {METRICS}),
        ("a pod labelled false", {v.LABEL_METRICS_SCRAPER: "false"}, "ns", {}, set()),
    ],
)
def test_network_policy_admits_exactly_its_engines_routers_and_scrapers(
    who: str, pod: dict[str, str], namespace: str, ns_labels: dict[str, str], open_ports: Any
) -> None:
    policy = children(pdd("x"))["NetworkPolicy/x-pd"]
    engines = policy["spec"]["podSelector"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert _selects(engines, {v.LABEL_NAME: "x", v.LABEL_ROLE: "prefill"})
    assert _selects(engines, {v.LABEL_NAME: "x", v.LABEL_ROLE: "decode"})
    assert not _selects(engines, {v.LABEL_NAME: "x", v.LABEL_ROLE: "router"})
    ports = {HTTP, BOOTSTRAP, TRANSFER, METRICS}
    admitted = {port for port in ports if _admits(policy, pod, namespace, ns_labels, port)}
    assert admitted == (ports if open_ports == "all" else open_ports), who


def test_client_service_selects_routers_of_every_revision() -> None:
    svc = children(pdd("x"))["Service/x"]["spec"]
    assert svc["selector"] == {v.LABEL_NAME: "x", v.LABEL_ROLE: "router"}


def test_router_lists_exactly_its_membership_and_stays_down_without_one() -> None:
    obj = pdd("x").build()
    members = Membership(
        (Prefill("http://192.0.2.1:8000", 8998),), ("http://192.0.2.2:8000",), "t1"
    )
    eff = resolve(obj.spec)
    up = router_deployment(obj, eff, "rev1", 2, members)
    args = container(up)["args"]
    assert flag(args, "--prefill") == "http://192.0.2.1:8000" and flag(args, "--decode")
    assert up["spec"]["replicas"] == 2
    tmpl = up["spec"]["template"]
    assert tmpl["metadata"]["annotations"][v.ANNOTATION_ROUTER_MEMBERSHIP] == "t1"
    assert tmpl["spec"]["automountServiceAccountToken"] is False
    down = router_deployment(obj, eff, "rev1", 2, Membership((), ("http://192.0.2.2:8000",), "t2"))
    assert down["spec"]["replicas"] == 0
    # Parked, not retired: the planner still reads the revision as routed (2 router replicas).
    assert down["metadata"]["annotations"] == {v.ANNOTATION_ROUTER_PARKED: "2"}
    assert revision_states([down], [])[0].router.replicas == 2
    assert revision_states([up], [])[0].router.replicas == 2
    assert v.ANNOTATION_ROUTER_PARKED not in (up["metadata"].get("annotations") or {})
    drained = router_deployment(obj, eff, "rev1", 0, members, drain_until="2026-01-01T00:00:00Z")
    assert drained["metadata"]["annotations"] == {v.ANNOTATION_DRAIN_UNTIL: "2026-01-01T00:00:00Z"}
    assert revision_states([drained], [])[0].router.replicas == 0
    unrouted = router_deployment(obj, eff, "rev1", 0, Membership((), (), "t3"))
    assert "annotations" not in unrouted["metadata"] or not unrouted["metadata"]["annotations"]
