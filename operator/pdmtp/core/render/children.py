"""Render the child objects of a PDDeployment as plain dicts (what the shell applies).

Per revision: one Deployment and one PodDisruptionBudget (`budgets`) per engine role and one
router Deployment. Per PDDeployment: the client Service (selects every serving router), the
NetworkPolicy between P and D pods, and the routers' ServiceAccount. Names come from `names`,
labels from `vocabulary`; nothing here reads the cluster or the clock.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pdmtp.api import vocabulary as v
from pdmtp.api.v1alpha1 import PDDeployment
from pdmtp.api.vocabulary import EngineRole, Role
from pdmtp.core import names
from pdmtp.core.agreement import Agreement
from pdmtp.core.effective import Effective, EngineRoleSettings, Shared
from pdmtp.core.groups import podgroups
from pdmtp.core.hashing import canonical_json
from pdmtp.core.objects import Manifest
from pdmtp.core.render import budgets, scheduling
from pdmtp.core.render.membership import Membership
from pdmtp.core.render.router import ROUTER_LIVENESS_PATH, ROUTER_READINESS_PATH, router_args
from pdmtp.core.render.weights import weights
from pdmtp.core.revision import hash_of

KV_ROLES: Mapping[EngineRole, str] = {"prefill": "kv_producer", "decode": "kv_consumer"}
ENGINE_CONTAINER = "engine"
ROUTER_CONTAINER = "router"
HEALTH_PATH = "/health"
STARTUP_BUDGET_SECONDS = 1800
"""Model loads take minutes; the startup probe allows half an hour before liveness applies."""
ROUTER_DRAIN_SECONDS = 5
"""A retiring router's pod serves this long after it leaves the endpoints (kube-proxy's lag)."""
ROUTER_SHUTDOWN_SECONDS = 30
ROUTER_RESOURCES: Manifest = {
    "requests": {"cpu": "500m", "memory": "256Mi"},
    "limits": {"memory": "1Gi"},
}
"""The router container's resources unless spec.router.resources says otherwise."""


@dataclass(frozen=True)
class RevisionReplicas:
    """Replicas of one revision's workloads, as the planner decided them."""

    prefill: int
    decode: int
    router: int
    drain_until: str | None = None


def _metadata(pdd: PDDeployment, name: str, labels: Mapping[str, str]) -> Manifest:
    return {
        "name": name,
        "namespace": pdd.metadata.namespace,
        "labels": dict(labels),
        "ownerReferences": [names.owner_reference(pdd)],
    }


def kv_transfer_config(shared: Shared, role: EngineRoleSettings) -> Manifest:
    """The `--kv-transfer-config` of a role: the fixed connector, loaded out of tree."""
    extra: dict[str, Any] = {"mooncake_protocol": shared.kv_transfer.protocol}
    if role.local.device_names:
        extra["mooncake_device_name"] = ",".join(role.local.device_names)
    config: dict[str, Any] = {
        "kv_connector": v.CONNECTOR_CLASS,
        "kv_connector_module_path": v.CONNECTOR_MODULE,
        "kv_role": KV_ROLES[role.name],
        "kv_connector_extra_config": extra,
    }
    if role.local.load_failure_policy is not None:  # unset: vLLM's default, as before
        config["kv_load_failure_policy"] = role.local.load_failure_policy
    return config


def speculative_config(shared: Shared, role: EngineRoleSettings) -> Manifest | None:
    """The `--speculative-config` of a role (its own k where it overrides the shared one)."""
    if shared.speculative is None:
        return None
    config: dict[str, Any] = {
        "method": shared.speculative.method,
        "num_speculative_tokens": role.compat.num_speculative_tokens,
    }
    if shared.speculative.draft_model is not None:
        config["model"] = shared.speculative.draft_model
    return config


def stop_timings(role: EngineRoleSettings) -> tuple[int, int, int]:
    """(grace period, preStop sleep, vLLM --shutdown-timeout) of a role's engine pods.

    Told to stop, the pod keeps serving through the preStop sleep (a router that still lists it
    is answered), then vLLM refuses new requests and finishes those it holds for up to the
    shutdown timeout, and exits before the grace period runs out.
    """
    own = role.local.pod.termination_grace_period_seconds
    grace = v.DEFAULT_ENGINE_GRACE_SECONDS if own is None else own
    pre_stop = max(grace - v.ENGINE_SHUTDOWN_SECONDS, 1)
    shutdown = max(min(grace - pre_stop, v.ENGINE_SHUTDOWN_SECONDS) - v.SHUTDOWN_MARGIN_SECONDS, 0)
    return grace, pre_stop, shutdown


def engine_args(shared: Shared, role: EngineRoleSettings, served: list[str]) -> list[str]:
    """The engine container's args: `vllm serve` `served` (the weights' positional model and
    flags) with every typed setting as a flag."""
    compat, engine = role.compat, shared.engine
    args = [
        "vllm",
        "serve",
        *served,
        "--host",
        "0.0.0.0",
        "--port",
        str(v.ENGINE_HTTP_PORT),
        "--dtype",
        engine.dtype,
        "--kv-cache-dtype",
        engine.kv_cache_dtype,
        "--block-size",
        str(engine.block_size),
        "--tensor-parallel-size",
        str(compat.tensor_parallel_size),
        "--pipeline-parallel-size",
        str(compat.pipeline_parallel_size),
        "--shutdown-timeout",
        str(stop_timings(role)[2]),
    ]
    if compat.max_model_len is not None:
        args += ["--max-model-len", str(compat.max_model_len)]
    if shared.model.quantization is not None:
        args += ["--quantization", shared.model.quantization]
    if engine.attention_backend is not None:
        args += ["--attention-backend", engine.attention_backend]
    if engine.disable_hybrid_kv_cache_manager:
        args.append("--disable-hybrid-kv-cache-manager")
    speculative = speculative_config(shared, role)
    if speculative is not None:
        args += ["--speculative-config", canonical_json(speculative)]
    args += ["--kv-transfer-config", canonical_json(kv_transfer_config(shared, role))]
    return [*args, *engine.extra_args, *role.local.extra_args]


def _env(
    shared: Shared, role: EngineRoleSettings, agreement: Agreement, model_env: list[Manifest]
) -> list[Manifest]:
    env: list[Manifest] = [
        {"name": v.ENV_ROLE, "value": role.name},
        {"name": v.ENV_VLLM_HOST_IP, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": v.ENV_MOONCAKE_BOOTSTRAP_PORT, "value": str(shared.kv_transfer.bootstrap_port)},
        {"name": v.ENV_METRICS_PORT, "value": str(v.ENGINE_METRICS_PORT)},
    ]
    lookahead = agreement.lookahead(role.name)
    if lookahead is not None:
        env.append({"name": v.ENV_EXPECTED_LOOKAHEAD, "value": str(lookahead)})
    if agreement.prefill_backoff is not None:
        env.append({"name": v.ENV_EXPECTED_BACKOFF, "value": str(agreement.prefill_backoff)})
    env += model_env
    env += [e.model_dump(by_alias=True, exclude_none=True) for e in role.local.env]
    return env


def _resources(shared: Shared, role: EngineRoleSettings) -> Manifest:
    gpus = role.compat.tensor_parallel_size * role.compat.pipeline_parallel_size
    extended: dict[str, int | str] = {v.GPU_RESOURCE: gpus}
    if shared.kv_transfer.protocol == "rdma":
        extended[v.RDMA_RESOURCE] = 1
    resources = role.local.resources
    return {
        "requests": {**resources.requests, **extended},
        "limits": {**resources.limits, **extended},
    }


def _probe(path: str, period: int, failures: int) -> Manifest:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def engine_pod_template(
    pdd: PDDeployment, revision: str, role: EngineRole, agreement: Agreement
) -> Manifest:
    """The pod template of one (revision, engine role), from the settings `agreement` judged
    (`pdd` gives only the names)."""
    eff = agreement.settings
    shared, settings = eff.shared, eff.role(role)
    local = settings.local
    bootstrap_port = shared.kv_transfer.bootstrap_port
    ports: list[Manifest] = [
        {"name": "http", "containerPort": v.ENGINE_HTTP_PORT, "protocol": "TCP"}
    ]
    annotations = {**local.pod_annotations, v.ANNOTATION_ROLE_HASH: hash_of(eff, role)}
    if role == "prefill":
        ports.append({"name": "bootstrap", "containerPort": bootstrap_port, "protocol": "TCP"})
        annotations[v.ANNOTATION_BOOTSTRAP_PORT] = str(bootstrap_port)
    ports.append({"name": "metrics", "containerPort": v.ENGINE_METRICS_PORT, "protocol": "TCP"})
    model = weights(shared.model)
    pod_fields, extra_mounts = scheduling.pod_fields(local, pdd.metadata.name, revision, role)
    security: Manifest = {"allowPrivilegeEscalation": False}
    if shared.kv_transfer.protocol == "rdma":
        security["capabilities"] = {"add": ["IPC_LOCK"]}
    grace, pre_stop, _ = stop_timings(settings)
    container: Manifest = {
        "name": ENGINE_CONTAINER,
        "image": shared.image,
        "args": engine_args(shared, settings, model.served),
        "env": _env(shared, settings, agreement, model.env),
        "ports": ports,
        "resources": _resources(shared, settings),
        "securityContext": security,
        "volumeMounts": [
            {"name": v.SHM_VOLUME, "mountPath": v.SHM_PATH},
            *model.mounts,
            *extra_mounts,
        ],
        "startupProbe": _probe(HEALTH_PATH, 10, STARTUP_BUDGET_SECONDS // 10),
        "readinessProbe": _probe(HEALTH_PATH, 5, 3),
        "livenessProbe": _probe(HEALTH_PATH, 15, 4),
        "lifecycle": {"preStop": {"sleep": {"seconds": pre_stop}}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if local.env_from:
        container["envFrom"] = [
            e.model_dump(by_alias=True, exclude_none=True) for e in local.env_from
        ]
    pod_spec: Manifest = {
        "containers": [container],
        "volumes": [
            {"name": v.SHM_VOLUME, "emptyDir": {"medium": "Memory"}},
            *model.volumes,
            *pod_fields.pop("volumes", []),
        ],
        "terminationGracePeriodSeconds": grace,
        "enableServiceLinks": False,
        **pod_fields,
    }
    if local.node_selector:
        pod_spec["nodeSelector"] = dict(local.node_selector)
    if local.tolerations:
        pod_spec["tolerations"] = [
            t.model_dump(by_alias=True, exclude_none=True) for t in local.tolerations
        ]
    return {
        "metadata": {
            "labels": names.pod_labels(pdd.metadata.name, revision, role),
            "annotations": annotations,
        },
        "spec": pod_spec,
    }


def _deployment(
    pdd: PDDeployment, eff: Effective, revision: str, role: Role, replicas: int, template: Manifest
) -> Manifest:
    name = pdd.metadata.name
    rollout = eff.rollout
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _metadata(
            pdd, names.workload(name, revision, role), names.pod_labels(name, revision, role)
        ),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": names.selector(name, revision, role)},
            "strategy": {
                "type": "RollingUpdate",
                # Routers restart whenever their engines change: always bring the new one up
                # before the old one goes, so a serving revision never loses its router.
                "rollingUpdate": (
                    {"maxSurge": 1, "maxUnavailable": 0}
                    if role == "router"
                    else {"maxSurge": rollout.max_surge, "maxUnavailable": rollout.max_unavailable}
                ),
            },
            "revisionHistoryLimit": 2,
            "template": template,
        },
    }


HOLD_SECONDS = 86_400
"""A held Deployment's minReadySeconds (`held`): longer than any progressDeadlineSeconds (at most
a day), so only the operator releases the roll."""
HELD_PROGRESS_DEADLINE = HOLD_SECONDS + 600
"""A held Deployment's progressDeadlineSeconds: the API server wants it above minReadySeconds."""
DEPLOYMENT_PROGRESS_DEADLINE = 600
"""The Deployment controller's default, restored on release."""


def held(manifest: Manifest, hold: bool, live: Mapping[str, Any] | None) -> Manifest:
    """An engine Deployment with its roll held at its first new pods, or released.

    Held, its new pods serve once Ready but do not count as available, so the Deployment
    controller retires no old pod beyond maxUnavailable and starts no further new one. Released,
    the two fields go back to the controller's defaults, written only where a hold left them
    (an untouched Deployment renders as before)."""
    spec = manifest["spec"]
    if hold:
        spec["minReadySeconds"] = HOLD_SECONDS
        spec["progressDeadlineSeconds"] = HELD_PROGRESS_DEADLINE
    elif live is not None and ((live.get("spec") or {}).get("minReadySeconds") or 0) > 0:
        spec["minReadySeconds"] = 0
        spec["progressDeadlineSeconds"] = DEPLOYMENT_PROGRESS_DEADLINE
    return manifest


def engine_deployment(
    pdd: PDDeployment, revision: str, role: EngineRole, replicas: int, agreement: Agreement
) -> Manifest:
    """The Deployment of one (revision, engine role)."""
    template = engine_pod_template(pdd, revision, role, agreement)
    return _deployment(pdd, agreement.settings, revision, role, replicas, template)


def router_deployment(
    pdd: PDDeployment,
    eff: Effective,
    revision: str,
    replicas: int,
    membership: Membership | None,
    drain_until: str | None = None,
    traffic_stopped: str | None = None,
) -> Manifest:
    """The router Deployment of one revision; its args list exactly that revision's engines.

    With no routable membership the router has no args to run with: it stays at zero replicas
    (a revision gets traffic only once it pairs a ready prefill with a ready decode).
    """
    name = pdd.metadata.name
    routable = membership is not None and membership.routable
    args = (
        router_args(membership=membership, policy=eff.router.policy)
        if membership is not None and membership.routable
        else []
    )
    annotations = {v.ANNOTATION_ROLE_HASH: hash_of(eff, "router")}
    if membership is not None:
        annotations[v.ANNOTATION_ROUTER_MEMBERSHIP] = membership.token
    container: Manifest = {
        "name": ROUTER_CONTAINER,
        "image": eff.router.image,
        "args": args,
        "ports": [
            {"name": "http", "containerPort": v.ROUTER_HTTP_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": v.ROUTER_METRICS_PORT, "protocol": "TCP"},
        ],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "readinessProbe": _probe(ROUTER_READINESS_PATH, 2, 3),
        "livenessProbe": _probe(ROUTER_LIVENESS_PATH, 10, 3),
        # A router being replaced or retired leaves the Service's endpoints at once, but kube-proxy
        # learns that a moment later: keep answering new connections meanwhile.
        "lifecycle": {"preStop": {"sleep": {"seconds": ROUTER_DRAIN_SECONDS}}},
        "resources": (
            copy.deepcopy(ROUTER_RESOURCES)
            if eff.router.resources is None
            else eff.router.resources.model_dump(by_alias=True, mode="json")
        ),
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    template = {
        "metadata": {
            "labels": names.pod_labels(name, revision, "router"),
            "annotations": annotations,
        },
        "spec": {
            "containers": [container],
            # The root filesystem is read-only; the router may still want a scratch /tmp.
            "volumes": [{"name": "tmp", "emptyDir": {}}],
            "serviceAccountName": names.router_account(name),
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": ROUTER_DRAIN_SECONDS + ROUTER_SHUTDOWN_SECONDS,
        },
    }
    # Offline (`pdmtp render`, membership None) the replicas show the intent; in the cluster a
    # router without a ready prefill and decode to list has nothing to run with.
    parked = membership is not None and not routable and replicas > 0
    deployment = _deployment(pdd, eff, revision, "router", 0 if parked else replicas, template)
    marks: dict[str, str] = {}
    if drain_until is not None:
        marks[v.ANNOTATION_DRAIN_UNTIL] = drain_until
    if traffic_stopped is not None:
        marks[v.ANNOTATION_TRAFFIC_STOPPED] = traffic_stopped
    if parked:
        # The planner's intent outlives the wait, so the planner never mistakes a revision that
        # served for one that never took traffic (which it retires at once, with no drain).
        marks[v.ANNOTATION_ROUTER_PARKED] = str(replicas)
    if marks:
        deployment["metadata"]["annotations"] = marks
    return deployment


def client_service_manifest(pdd: PDDeployment) -> Manifest:
    """The Service clients use: it selects the routers of every serving revision."""
    name = pdd.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(pdd, names.client_service(name), names.base_labels(name)),
        "spec": {
            "type": "ClusterIP",
            "selector": {v.LABEL_NAME: name, v.LABEL_ROLE: "router"},
            "ports": [
                {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
            ],
        },
    }


def network_policy_manifest(pdd: PDDeployment, eff: Effective) -> Manifest:
    """Who may open a connection to the PDDeployment's engine pods; nobody else may.

    1. Its own engines, both roles, every revision: every TCP port (the Mooncake transfer
       engine listens on random ports).
    2. Its routers: the HTTP and bootstrap ports.
    3. Metrics scrapers, pods labelled `pdmtp.io/metrics-scraper: "true"` in any namespace or
       every pod of a namespace labelled so: the metrics-only port, which answers GET /metrics
       and nothing else (the API port also serves /metrics, but NetworkPolicy cannot tell paths
       apart).
    """
    name = pdd.metadata.name
    scraper = {"matchLabels": {v.LABEL_METRICS_SCRAPER: v.METRICS_SCRAPER_VALUE}}
    engines = {
        "matchLabels": {v.LABEL_NAME: name},
        "matchExpressions": [
            {"key": v.LABEL_ROLE, "operator": "In", "values": list(v.ENGINE_ROLES)}
        ],
    }
    routers = {"matchLabels": {v.LABEL_NAME: name, v.LABEL_ROLE: "router"}}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(pdd, names.network_policy(name), names.base_labels(name)),
        "spec": {
            "podSelector": engines,
            "policyTypes": ["Ingress"],
            "ingress": [
                {"from": [{"podSelector": engines}], "ports": [{"protocol": "TCP"}]},
                {
                    "from": [{"podSelector": routers}],
                    "ports": [
                        {"protocol": "TCP", "port": v.ENGINE_HTTP_PORT},
                        {"protocol": "TCP", "port": eff.shared.kv_transfer.bootstrap_port},
                    ],
                },
                {
                    "from": [
                        {"namespaceSelector": {}, "podSelector": scraper},
                        {"namespaceSelector": scraper},
                    ],
                    "ports": [{"protocol": "TCP", "port": v.ENGINE_METRICS_PORT}],
                },
            ],
        },
    }


def router_service_account(pdd: PDDeployment) -> Manifest:
    """The routers' identity. It is bound to no Role: the static router never calls the API."""
    name = pdd.metadata.name
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(pdd, names.router_account(name), names.base_labels(name)),
        "automountServiceAccountToken": False,
    }


def shared_children(pdd: PDDeployment, eff: Effective) -> list[Manifest]:
    """The children that belong to the PDDeployment as a whole, not to a revision."""
    return [
        client_service_manifest(pdd),
        network_policy_manifest(pdd, eff),
        router_service_account(pdd),
    ]


def revision_children(
    pdd: PDDeployment,
    revision: str,
    replicas: RevisionReplicas,
    agreement: Agreement,
    membership: Membership | None,
    pod_group_api: str = podgroups.DEFAULT_WORKLOAD_API,
) -> list[Manifest]:
    """The workloads of one revision, from the settings `agreement` judged: per engine role a
    Deployment, or for a multi-node role its headless Service and `replicas` whole groups
    (`groups`), and the role's disruption budget (`budgets`); then the router Deployment."""
    eff = agreement.settings
    allowed = budgets.allowance(eff.rollout)
    out: list[Manifest] = []
    for role in v.ENGINE_ROLES:
        count = replicas.prefill if role == "prefill" else replicas.decode
        shape = podgroups.shape_of(agreement, role)
        if shape is None:
            out.append(engine_deployment(pdd, revision, role, count, agreement))
            out.append(budgets.disruption_budget_manifest(pdd, revision, role, allowed))
            continue
        template = engine_pod_template(pdd, revision, role, agreement)
        out.append(podgroups.group_service(pdd, revision, role))
        for gid in podgroups.next_group_ids(set(), count):
            out += podgroups.group_objects(
                pdd, revision, role, gid, template, agreement, pod_group_api
            )
        grouped = budgets.allowance(eff.rollout, grouped=True)
        out.append(
            budgets.disruption_budget_manifest(pdd, revision, role, grouped, shape.nodes, count)
        )
    out.append(
        router_deployment(pdd, eff, revision, replicas.router, membership, replicas.drain_until)
    )
    return out
