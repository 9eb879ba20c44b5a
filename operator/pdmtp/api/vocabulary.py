"""Every name the project writes and every default it applies, in one place: the API group, label
and annotation keys, engine environment variables, ports, extended resources, the connector the
engine image ships, and the router's pin.

Other modules import these names; nothing spells the strings or numbers again. This module imports
nothing from pdmtp: it is the bottom of the layering (docs/design.md, "Layers").
"""

from typing import Final, Literal, TypeVar

T = TypeVar("T")

GROUP: Final = "pdmtp.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "PDDeployment"
PLURAL: Final = "pddeployments"
SINGULAR: Final = "pddeployment"
SHORT_NAME: Final = "pdd"
ROLE_SCALE_KIND: Final = "PDRoleScale"
"""An External-autoscaled role's scale endpoint (`<name>-<role>`): what an HPA targets."""
ROLE_SCALE_PLURAL: Final = "pdrolescales"

EngineRole = Literal["prefill", "decode"]
Role = Literal["prefill", "decode", "router"]
ENGINE_ROLES: Final[tuple[EngineRole, EngineRole]] = ("prefill", "decode")
ROLES: Final[tuple[Role, Role, Role]] = ("prefill", "decode", "router")

# Labels on every child object and pod.
LABEL_NAME: Final = f"{GROUP}/name"
LABEL_ROLE: Final = f"{GROUP}/role"
LABEL_REVISION: Final = f"{GROUP}/revision"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "pdmtp"
LABEL_METRICS_SCRAPER: Final = f"{GROUP}/metrics-scraper"
"""Set to METRICS_SCRAPER_VALUE on a pod (any namespace) or a namespace (all its pods): the
engines' NetworkPolicy lets it reach their metrics-only port, ENGINE_METRICS_PORT, and nothing
else. Put it on the operator and on Prometheus."""
METRICS_SCRAPER_VALUE: Final = "true"
LABEL_GROUP: Final = f"{GROUP}/group"
"""On the pods and the PodGroup of one multi-node replica (spec.<role>.multiNode): its id, `g<n>`,
unique among the (revision, role)'s groups while any object of it exists."""
LABEL_GROUP_RANK: Final = f"{GROUP}/group-rank"
"""On a multi-node replica's pod: its node rank, "0" for the leader (the pod the router lists)."""

# Annotations.
ANNOTATION_ROLE_HASH: Final = f"{GROUP}/role-hash"
"""Hash of a role's local settings: a change rolls that role only, inside its revision."""
ANNOTATION_BOOTSTRAP_PORT: Final = f"{GROUP}/bootstrap-port"
"""The Mooncake bootstrap port of a prefill pod, read by the router's service discovery."""
ANNOTATION_DRAIN_UNTIL: Final = f"{GROUP}/drain-until"
"""RFC 3339 time until which a revision that lost traffic keeps its pods (drainSeconds); set when
its router is turned off, and moved while a router pod still serves."""
ANNOTATION_TRAFFIC_STOPPED: Final = f"{GROUP}/traffic-stopped"
"""RFC 3339 time the operator first saw no router pod of a draining revision serve: its drain ends
no earlier than this plus drainSeconds, across operator restarts and control-plane outages."""
ANNOTATION_ROUTER_PARKED: Final = f"{GROUP}/router-parked"
"""On a router Deployment held at zero because its revision has no ready prefill or no ready
decode to list (e.g. its last group broke): the replicas the planner asked for. The revision took
traffic and still counts as routed: it leaves only through a drain, and a canary's anchor stays."""
ANNOTATION_ROUTER_MEMBERSHIP: Final = f"{GROUP}/router-membership"
"""Token of the engines a router was started with: a change restarts the router (docs/router.md)."""
ANNOTATION_PROMOTE: Final = f"{GROUP}/promote"
"""On a PDDeployment: the canary revision a user promoted (`pdmtp rollout promote`)."""
ANNOTATION_LEAVING: Final = f"{GROUP}/leaving"
"""On an engine pod: out of routing before it is removed (RFC 3339 time it was marked)."""
ANNOTATION_REPLACE: Final = f"{GROUP}/replace"
"""On an engine pod the operator replaces (its KV pulls kept failing): why. Its replacement comes
first, then it leaves as a pod on a cordoned node does (`core.rollout.evacuation`)."""
ANNOTATION_REPLACE_SINCE: Final = f"{GROUP}/replace-since"
"""Beside ANNOTATION_REPLACE: when the pod was marked (RFC 3339); pods started since replace it."""
ANNOTATION_REPLACEMENT_OF: Final = f"{GROUP}/replacement-of"
"""On a decode pod started while another of its revision was being replaced: that pod's name. A
replacement that fails as the pod it replaced did shows a fault of the revision's, not the
pod's: it is not replaced again (`core.verification.revisions.replacements`)."""
ANNOTATION_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"
"""The ReplicaSet controller deletes the pods with the lowest cost first."""
RELEASED_DELETION_COST: Final = "-1000000"
"""The cost a leaving pod gets once no router lists it: the ReplicaSet's first choice."""

# Environment variables the rendered engine pods carry. The engine launcher (images/engine)
# reads the PDMTP_* ones; a test checks both sides spell them alike.
ENV_EXPECTED_LOOKAHEAD: Final = "PDMTP_EXPECTED_LOOKAHEAD"
ENV_EXPECTED_BACKOFF: Final = "PDMTP_EXPECTED_PREFILL_BACKOFF"
ENV_ROLE: Final = "PDMTP_ROLE"
ENV_VLLM_HOST_IP: Final = "VLLM_HOST_IP"
ENV_MOONCAKE_BOOTSTRAP_PORT: Final = "VLLM_MOONCAKE_BOOTSTRAP_PORT"
ENV_METRICS_PORT: Final = "PDMTP_METRICS_PORT"
# A multi-node replica's pods: which group, which rank, and where the leader is (its DNS name
# through the role's headless Service).
ENV_GROUP: Final = "PDMTP_GROUP"
ENV_GROUP_RANK: Final = "PDMTP_GROUP_RANK"
ENV_GROUP_SIZE: Final = "PDMTP_GROUP_SIZE"
ENV_LEADER_ADDRESS: Final = "PDMTP_LEADER_ADDRESS"
"""Where the engine container serves its metrics-only listener (ENGINE_METRICS_PORT)."""
# Hugging Face hub settings the operator derives from spec.model.source.
ENV_HF_TOKEN: Final = "HF_TOKEN"
ENV_HF_HOME: Final = "HF_HOME"
ENV_HF_HUB_OFFLINE: Final = "HF_HUB_OFFLINE"

# Volumes the operator mounts into engine pods; spec volumes may not reuse the names or paths.
SHM_VOLUME: Final = "dshm"
SHM_PATH: Final = "/dev/shm"
MODEL_VOLUME: Final = "model"
MODEL_PATH: Final = "/models"
"""Where a PVC or image model source is mounted; the engine serves the weights from here."""
HF_CACHE_VOLUME: Final = "hf-cache"
HF_CACHE_PATH: Final = "/cache/huggingface"
TERMINATION_LOG_PATH: Final = "/dev/termination-log"
RESERVED_VOLUMES: Final = (SHM_VOLUME, MODEL_VOLUME, HF_CACHE_VOLUME)
RESERVED_MOUNT_PATHS: Final = (SHM_PATH, MODEL_PATH, HF_CACHE_PATH, TERMINATION_LOG_PATH)

LAUNCHER_REFUSED_EXIT_CODE: Final = 3
"""Exit code of the engine launcher when it refuses a config (images/engine launcher)."""

# Ports inside the pods.
ENGINE_HTTP_PORT: Final = 8000
ENGINE_METRICS_PORT: Final = 29100
"""The engine's metrics-only listener: GET /metrics (vLLM's, relayed from ENGINE_HTTP_PORT) and
nothing else, so a NetworkPolicy (L4) can open metrics to scrapers and keep the API closed."""
ROUTER_HTTP_PORT: Final = 8000
DP_RPC_PORT: Final = 29550
"""A DataParallel group's coordinator port on its leader (vLLM's --data-parallel-rpc-port)."""
MASTER_PORT: Final = 29501
"""A TensorParallel group's torch.distributed rendezvous on its leader (vLLM's --master-port)."""
ROUTER_METRICS_PORT: Final = 29000

# Connector the engine image ships (images/engine/pdmtp_engine/connector.py).
CONNECTOR_CLASS: Final = "BackoffMooncakeConnector"
CONNECTOR_MODULE: Final = "pdmtp_engine.connector"

# Extended resources the rendered pods request.
GPU_RESOURCE: Final = "nvidia.com/gpu"
RDMA_RESOURCE: Final = "rdma/hca_shared_devices_a"
"""The shared-device RDMA resource (k8s-rdma-shared-dev-plugin's default name)."""

# The Kubernetes Workload API (gang scheduling): the group and the versions pdmtp speaks, newest
# first; the shell uses the first one the API server serves (1.37: v1beta1; 1.36: v1alpha2).
WORKLOAD_API_GROUP: Final = "scheduling.k8s.io"
WORKLOAD_API_VERSIONS: Final[tuple[str, ...]] = ("v1beta1", "v1alpha2")
POD_GROUP_KIND: Final = "PodGroup"
POD_GROUP_PLURAL: Final = "podgroups"

DISRUPTION_BUDGET_KIND: Final = "PodDisruptionBudget"
"""policy/v1: one per (revision, engine role), rendered by `core.render.budgets`."""
UNHEALTHY_POD_EVICTION_POLICY: Final = "AlwaysAllow"
"""A budget's unhealthyPodEvictionPolicy: an engine that is not Ready serves nothing, so evicting
it never costs capacity, and a crash-looping new revision must not hold a drain."""

# Defaults the API applies (the CRD's defaults are generated from the model, which reads these).
DEFAULT_BOOTSTRAP_PORT: Final = 8998
VLLM_KV_LOAD_FAILURE_POLICY: Final = "fail"
"""What the pinned vLLM does with a KV load that fails when `kv_load_failure_policy` is not set
(`KVTransferConfig`, 0.33.0, and 0.32.0 already: PR 34896): the request fails."""
"""vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT default; also what vllm-router assumes when given none."""
ENGINE_SHUTDOWN_SECONDS: Final = 30
"""The last part of an engine pod's grace period: vLLM's own shutdown after SIGTERM."""
SHUTDOWN_MARGIN_SECONDS: Final = 5
"""Of that part, what vLLM's --shutdown-timeout leaves for its processes to exit."""
DEFAULT_ENGINE_GRACE_SECONDS: Final = 90
"""An engine pod's terminationGracePeriodSeconds unless spec.pod says otherwise: 60 s of serving
after it is told to stop, then the shutdown (the template pdmtp rendered for drainSeconds' default
before the two were separated, so such pods are not replaced on upgrade)."""
ROUTER_VERSION: Final = "0.1.17"
"""The vllm-router release images/router pins and core/render/router.py renders flags for."""
DEFAULT_ROUTER_IMAGE: Final = f"pdmtp-router:{ROUTER_VERSION}"
ROUTER_POLICIES: Final[tuple[str, ...]] = ("round_robin", "random", "cache_aware", "power_of_two")
"""spec.router.policy values: the vllm-router `--policy` choices that need no extra inputs.

kv_aware needs KV event sources, consistent_hash and sticky_least_loaded need session keys from
the client; none of those is modelled by the CRD.
"""


def by_role(role: EngineRole, prefill: T, decode: T) -> T:
    """The prefill or decode member of a pair: the one place the two roles are told apart."""
    return prefill if role == "prefill" else decode
