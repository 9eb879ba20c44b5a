"""The PDDeployment API (pdmtp.io/v1alpha1) as pydantic models: the one source of the CRD schema.

Every field carries a description (it becomes the CRD's and the field reference's text). CEL rules
that the API server enforces at admission are declared once as `Rule`s (`pdmtp.api.rules`) and
checked here too, or by the agreement (`pdmtp.core.agreement`) where a rule is a cross-role
finding, so offline validation and admission agree. The status models
are what the operator writes (`pdmtp.core.status` builds them), so schema and writer cannot drift.

Like the rest of `pdmtp.api`, this module imports nothing from `pdmtp.core`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from pdmtp.api import rules as r
from pdmtp.api import vocabulary as v
from pdmtp.api.autoscaling import AUTOSCALING_SPEC_RULES, BAND_REACHABLE_RULE, AutoscalingSpec
from pdmtp.api.base import Model, defaulted
from pdmtp.api.corev1 import ListMap
from pdmtp.api.methods import SPECULATIVE_METHODS
from pdmtp.api.multinode import (
    ENGINE_GROUP_ARGS_RULES,
    ROLE_GROUP_ARGS_RULES,
    MultiNodeSpec,
)
from pdmtp.api.pod import (
    OWNED_ENV_RULE,
    EnvFromSource,
    EnvVar,
    KeySelector,
    Placement,
    PodSettings,
    ResourceRequirements,
    Toleration,
)
from pdmtp.api.rules import Checked, Rule, model_rules
from pdmtp.api.spec_rules import (
    BOOTSTRAP_PORT_RULE,
    CANARY_BUDGET_RULE,
    CREDENTIAL_ARG_RULE,
    DRAFT_MODEL_RULE,
    ENGINE_EXTRA_ARGS_RULE,
    GROUP_GPUS_RULE,
    HUB_TOKEN_RULE,
    MAX_MODEL_LEN_RULE,
    MOUNTS_RULE,
    RDMA_DEVICES_RULE,
    ROLE_EXTRA_ARGS_RULE,
    ROUTER_GPU_RULE,
    SPECULATIVE_OVERRIDE_RULE,
    SPECULATIVE_TOKENS_DIVISIBLE_RULE,
    TP_DIVISIBLE_RULE,
    TP_SPLIT_RULE,
    WEIGHTS_MOUNT_RULE,
)
from pdmtp.api.status import PDDeploymentStatus

MAX_NAME_LENGTH = 40
"""Child names add up to 23 characters (`-<revision>-prefill`); Services must fit 63."""


DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")
BLOCK_SIZES = (8, 16, 32, 64, 128)


ExtraArgs = list[Annotated[str, Field(max_length=1024), Checked(CREDENTIAL_ARG_RULE)]]

EngineImage = Annotated[
    str, Field(min_length=1, max_length=512), Checked(r.image_rule("spec.image"))
]
RouterImage = Annotated[
    str, Field(min_length=1, max_length=512), Checked(r.image_rule("spec.router.image"))
]

METADATA_NAME = r.name_rule(
    "metadata.name",
    r.DNS_1035_LABEL,
    "a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): the client "
    "Service takes this name",
    MAX_NAME_LENGTH,
)


class PVCModel(Model):
    """Weights on a PersistentVolumeClaim, mounted read-only at /models in both roles."""

    claim_name: Annotated[
        str, Checked(r.name_rule("claimName", r.DNS_SUBDOMAIN, "a DNS subdomain", 253))
    ] = Field(max_length=253, description="The PVC holding the checkpoint.")
    sub_path: Annotated[str, Checked(r.sub_path_rule("spec.model.source.pvc.subPath"))] | None = (
        Field(
            default=None,
            max_length=1024,
            description="The checkpoint's directory in the volume; served as /models/<subPath>.",
        )
    )
    read_only: bool = Field(default=True, description="Mount read-only (the default).")


class ImageModel(Model):
    """Weights packaged as an OCI image, mounted as an image volume at /models (Kubernetes image
    volumes; the API server and runtime must support them)."""

    reference: Annotated[
        str,
        Field(min_length=1, max_length=512),
        Checked(r.image_rule("spec.model.source.image.reference")),
    ] = Field(description="The image holding the checkpoint.")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] | None = Field(
        default=None, description="When to pull it."
    )
    sub_path: Annotated[str, Checked(r.sub_path_rule("spec.model.source.image.subPath"))] | None = (
        Field(
            default=None,
            max_length=1024,
            description="The checkpoint's directory in the image; served as /models/<subPath>.",
        )
    )


class ClaimReference(Model):
    """A PersistentVolumeClaim in the PDDeployment's namespace."""

    claim_name: Annotated[
        str, Checked(r.name_rule("claimName", r.DNS_SUBDOMAIN, "a DNS subdomain", 253))
    ] = Field(max_length=253, description="The PVC's name.")


class HubModel(Model):
    """Weights downloaded from the Hugging Face hub (spec.model.name at spec.model.revision)."""

    token_secret_ref: KeySelector | None = Field(
        default=None,
        description="A Secret key holding the hub token, projected as HF_TOKEN; never copied.",
    )
    cache_pvc: ClaimReference | None = Field(
        default=None,
        description="A PVC for the download cache (HF_HOME), so restarts do not download again.",
    )


class ModelSource(Model):
    """Where both roles load the weights from: exactly one of pvc, image, hub."""

    RULES = (
        Rule(
            "[has(self.pvc), has(self.image), has(self.hub)].filter(x, x).size() == 1",
            "spec.model.source sets exactly one of pvc, image, hub",
            lambda s: sum(x is not None for x in (s.pvc, s.image, s.hub)) == 1,
        ),
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    pvc: PVCModel | None = Field(default=None, description="Weights on a PVC.")
    image: ImageModel | None = Field(default=None, description="Weights in an OCI image.")
    hub: HubModel | None = Field(default=None, description="Weights from the hub.")


class ModelSpec(Model):
    """The checkpoint both roles serve."""

    name: str = Field(
        min_length=1,
        max_length=512,
        description=(
            "The model's name: a Hugging Face repository id, or with a pvc/image source the "
            "name clients use (`--served-model-name`)."
        ),
    )
    revision: str = Field(
        default="main",
        min_length=1,
        max_length=256,
        description="Checkpoint revision (branch, tag or commit). Both roles load the same one.",
    )
    mtp_modules: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description=(
            "The checkpoint's MTP module count (`num_nextn_predict_layers` in its config.json). "
            "Declare it so the operator can prove both roles derive the same prefill lookahead; "
            "without it, roles with different numSpeculativeTokens are rejected."
        ),
    )
    quantization: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="vLLM `--quantization` method; unset lets vLLM read it from the checkpoint.",
    )
    source: ModelSource | None = Field(
        default=None,
        description=(
            "Where the weights come from; unset: downloaded from the hub into each pod. Both "
            "roles load the same weights (part of the compat revision)."
        ),
    )


class EngineSpec(Model):
    """`vllm serve` settings both roles must share (part of the compat revision)."""

    dtype: Literal[DTYPES] = Field(  # type: ignore[valid-type]
        default="auto", description="Weight and activation dtype (`--dtype`)."
    )
    kv_cache_dtype: Literal[KV_CACHE_DTYPES] = Field(  # type: ignore[valid-type]
        default="auto",
        description=(
            "KV cache dtype (`--kv-cache-dtype`); Mooncake moves raw blocks: both roles share it."
        ),
    )
    block_size: Literal[BLOCK_SIZES] = Field(  # type: ignore[valid-type]
        default=16,
        description="KV block size in tokens (`--block-size`); Mooncake has no block-size ratio.",
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description=(
            "Context length (`--max-model-len`); roles may override it (decode >= prefill)."
        ),
    )
    attention_backend: str | None = Field(
        default=None,
        min_length=1,
        max_length=64,
        description="Attention backend (`--attention-backend`); unset, vLLM chooses on both roles.",
    )
    disable_hybrid_kv_cache_manager: bool = Field(
        default=False,
        alias="disableHybridKVCacheManager",
        description="Turn off the hybrid KV cache manager (`--disable-hybrid-kv-cache-manager`).",
    )
    state_backoff: Literal[0, 1] = Field(
        default=0,
        description=(
            "1 for hybrid Mamba and bounded-replay sliding-window models (vLLM backs the prefill "
            "off one token for them), else 0."
        ),
    )
    extra_args: ExtraArgs = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Extra `vllm serve` arguments for both roles, one token per item; part of the compat "
            "revision. Flags owned by typed fields are rejected."
        ),
        json_schema_extra=model_rules(ENGINE_EXTRA_ARGS_RULE),
    )


class SpeculativeSpec(Model):
    """Speculative decoding shared by both roles (`--speculative-config`)."""

    method: Literal[SPECULATIVE_METHODS] = Field(  # type: ignore[valid-type]
        default="mtp",
        description=(
            "Speculative method. MTP aliases (deepseek_mtp, qwen3_next_mtp, ...) are normalised "
            "to `mtp` as vLLM does."
        ),
    )
    num_speculative_tokens: int = Field(
        default=1,
        ge=1,
        le=16,
        description="Draft tokens per step (k). A role may override it; see spec.model.mtpModules.",
    )
    draft_model: str | None = Field(
        default=None,
        min_length=1,
        max_length=512,
        description="Separate draft model (EAGLE family); MTP drafts with the target checkpoint.",
    )


class KVTransferSpec(Model):
    """The Mooncake KV transfer between prefill and decode."""

    RULES = (RDMA_DEVICES_RULE,)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    protocol: Literal["rdma", "tcp"] = Field(
        default="tcp",
        description=(
            "Mooncake transport protocol, the same on both roles. rdma needs deviceNames and "
            "RDMA-capable nodes; tcp works everywhere."
        ),
    )
    device_names: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list,
        max_length=16,
        description="RDMA device names (`mooncake_device_name`), e.g. mlx5_0. Required for rdma.",
    )
    bootstrap_port: Annotated[int, Checked(BOOTSTRAP_PORT_RULE)] = Field(
        default=v.DEFAULT_BOOTSTRAP_PORT,
        ge=1024,
        le=65535,
        description=(
            "The prefill's Mooncake bootstrap server port (`VLLM_MOONCAKE_BOOTSTRAP_PORT`)."
        ),
    )
    load_failure_policy: Literal["recompute", "fail"] | None = Field(
        default=None,
        description=(
            "What a decode does when it cannot load a prefill's KV (vLLM's "
            "`kv_load_failure_policy`, rendered on the decode only): fail ends the request with "
            "an error, recompute has the decode compute the prompt itself. Unset: vLLM's "
            "default, fail since vLLM 0.32 (PR 34896), and nothing is rendered. Role-local: a "
            "change rolls the decodes alone."
        ),
    )


class RoleSpeculativeSpec(Model):
    """A role's override of the shared speculative settings."""

    num_speculative_tokens: int = Field(
        ge=1,
        le=16,
        description=(
            "This role's k. Allowed to differ from the other role only where the derived prefill "
            "lookahead stays equal (e.g. single-module MTP, where it is 1 whatever k is)."
        ),
    )


class RoleKVTransfer(Model):
    """A role's override of the shared KV transfer settings."""

    device_names: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        max_length=16,
        description="This role's RDMA devices (nodes of the two roles may differ); role-local.",
    )


class RoleSpec(Model):
    """One engine role (prefill or decode)."""

    RULES = (TP_SPLIT_RULE, GROUP_GPUS_RULE, *ROLE_GROUP_ARGS_RULES)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    replicas: int = Field(
        default=1,
        ge=1,
        le=1000,
        description=(
            "Engine replicas of this role: pods, or with multiNode groups of pods. Scaling is not "
            "a rollout."
        ),
    )
    multi_node: MultiNodeSpec | None = Field(
        default=None,
        description=(
            "One replica spans several nodes: a gang-scheduled group of pods (needs the "
            "Kubernetes Workload API, scheduling.k8s.io). Unset: one pod per replica."
        ),
    )
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        le=64,
        description=(
            "GPUs per pipeline stage (`--tensor-parallel-size`); roles' sizes divide each other."
        ),
    )
    pipeline_parallel_size: int = Field(
        default=1, ge=1, le=16, description="Pipeline stages (`--pipeline-parallel-size`)."
    )
    max_model_len: int | None = Field(
        default=None,
        ge=1,
        le=16_777_216,
        description="Per-role override of spec.engine.maxModelLen.",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        json_schema_extra=defaulted(ResourceRequirements),
        description="Compute resources besides GPUs (and RDMA, added when protocol is rdma).",
    )
    extra_args: ExtraArgs = Field(
        default_factory=list,
        max_length=64,
        description=(
            "Extra `vllm serve` arguments for this role only; a change rolls this role alone. "
            "Flags owned by typed fields are rejected."
        ),
        json_schema_extra=model_rules(ROLE_EXTRA_ARGS_RULE),
    )
    speculative: RoleSpeculativeSpec | None = Field(
        default=None, description="Override of spec.speculative for this role."
    )
    env: Annotated[list[EnvVar], Checked(OWNED_ENV_RULE), ListMap("name")] = Field(
        default_factory=list,
        max_length=64,
        description="Extra environment for the engine container.",
    )
    env_from: list[EnvFromSource] = Field(
        default_factory=list,
        max_length=16,
        description="Secrets and ConfigMaps whose keys become environment variables.",
    )
    node_selector: Annotated[
        dict[str, Annotated[str, Field(max_length=63)]],
        Checked(
            r.keys_rule("nodeSelector", r.QUALIFIED_NAME, "label keys"),
            r.label_values_rule("nodeSelector"),
        ),
    ] = Field(
        default_factory=dict, max_length=32, description="Node labels the role's pods must match."
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=32, description="Tolerations for the role's pods."
    )
    pod_annotations: Annotated[
        dict[str, str],
        Checked(r.keys_rule("podAnnotations", r.QUALIFIED_NAME, "annotation keys")),
    ] = Field(
        default_factory=dict, max_length=64, description="Extra annotations on the role's pods."
    )
    pod: PodSettings | None = Field(
        default=None,
        description="This role's pod settings; each field it sets replaces spec.pod's.",
    )
    kv_transfer: RoleKVTransfer | None = Field(
        default=None,
        alias="kvTransfer",
        description="This role's override of spec.kvTransfer.deviceNames.",
    )


class RouterSpec(Model):
    """The per-revision vllm-router that pairs a prefill and a decode for each request."""

    RULES = (ROUTER_GPU_RULE,)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    replicas: int = Field(default=1, ge=1, le=100, description="Router pods of a serving revision.")
    policy: Literal[v.ROUTER_POLICIES] = Field(  # type: ignore[valid-type]
        default="round_robin", description="Load-balancing policy of vllm-router (`--policy`)."
    )
    image: RouterImage = Field(
        default=v.DEFAULT_ROUTER_IMAGE,
        description="Router image (images/router), vllm-router pinned.",
    )
    resources: ResourceRequirements | None = Field(
        default=None,
        description=(
            "The router container's resources; unset: requests cpu 500m and memory 256Mi, "
            "limits memory 1Gi. A router rolls whenever its revision's engines change, one new "
            "pod before the old one goes: leave room for it."
        ),
    )


class CanarySpec(Model):
    """Hold a paired rollout with the new revision serving a share next to the old one."""

    percent: int = Field(
        ge=1,
        le=99,
        description=(
            "Share of each role's replicas the new revision runs while held (at least one pod "
            "per role); the old revision keeps the rest and its routers are scaled so that the "
            "new revision's routers are this share of the client Service's endpoints."
        ),
    )
    auto_promote: bool = Field(
        default=False,
        description=(
            "Promote by itself once the new revision is Verified (spec.verification); unset, "
            "the hold waits for `pdmtp rollout promote`. A Failed canary rolls back either way "
            "unless spec.verification.mode is Report or Off."
        ),
    )


class VerificationSpec(Model):
    """How a revision's P/D path is judged on what its decodes did, and what the judgement
    holds back (`pdmtp verify NAME` prints it)."""

    mode: Literal["Gate", "Rollback", "Report", "Off"] = Field(
        default="Rollback",
        description=(
            "Rollback (default): the old revision keeps its last pods until the new one has a "
            "verdict, whatever the replica counts, and a new revision found Failed (KV pulls "
            "failing, decode-only fallback, the wrong backoff, acceptance regressed) is rolled "
            "back; with no verdict within progressDeadlineSeconds the rollout goes on "
            "unverified. Gate: the same hold lasts until the new revision is Verified (and a "
            "canary with autoPromote holds until then); no verdict in time fails the rollout. "
            "Report: judge and report only. Off: judge nothing. In Rollback and Gate a "
            "role-local change is held at its role's first new pods the same way, and goes back "
            "to the Verified template on a Failed verdict."
        ),
    )
    false_rollback_percent: float | None = Field(
        default=None,
        ge=0.01,
        le=10,
        description=(
            "The chance, in percent, that a healthy new revision is failed over its whole "
            "rollout (every judgement made at every scrape, not one); unset: 1. Lower needs "
            "more evidence before a verdict."
        ),
    )
    smallest_regression_percent: int | None = Field(
        default=None,
        ge=1,
        le=90,
        description=(
            "The smallest drop in accepted tokens per draft worth catching, in percent of the "
            "reference (the serving revision's over the same span, else "
            "expectedAcceptanceLength): a revision that drafts this much worse is Failed "
            "before it can be Verified in at least 95 % of rollouts; a drop of about half of it "
            "or less tends to pass. Smaller needs more evidence (about 1 / the square). Unset: "
            "acceptanceTolerancePercent, whose default is 10."
        ),
    )
    min_requests: int = Field(
        default=8,
        ge=1,
        le=100000,
        description=(
            "Requests whose KV a revision's decodes pulled before it can be Verified: a floor "
            "under the statistics, which usually need more."
        ),
    )
    min_drafts: int = Field(
        default=32,
        ge=1,
        le=1000000,
        description=(
            "Drafts needed, on each side, before acceptance is judged: a floor under the "
            "statistics, which also need 4 scrape windows with drafts on each side."
        ),
    )
    acceptance_tolerance_percent: int = Field(
        default=10,
        ge=0,
        le=100,
        description=(
            "Deprecated: read as smallestRegressionPercent when that is unset (0 as 1, above 90 "
            "as 90). It was a fixed tolerance on one ratio; the verdict is now a sequential test "
            "whose effect is smallestRegressionPercent."
        ),
    )
    expected_acceptance_length: float | None = Field(
        default=None,
        ge=0,
        le=64,
        description=(
            "Accepted tokens per draft to hold a revision to when no other revision serves "
            "beside it; unset: acceptance is compared only between revisions."
        ),
    )
    replace_after_failed_pulls: int = Field(
        default=3,
        ge=0,
        le=100000,
        description=(
            "A serving decode pod whose KV receives failed at least this many times, and at "
            "least as often as they succeeded, between its two latest scrapes is replaced "
            "(modes Rollback and Gate; under kvTransfer.loadFailurePolicy fail each was a failed "
            "request): a new pod first, then the failing one leaves its routers and goes, one "
            "pod of a revision at a time. 0: never replace."
        ),
    )
    probe_requests_per_minute: int = Field(
        default=12,
        ge=0,
        le=600,
        description=(
            "Requests a minute the operator sends through a revision's own router while the "
            "revision's verdict waits for requests or drafts (no traffic to judge it by, e.g. "
            "a canary at night): small completions, one at a time, only to a revision whose "
            "router and engines are Ready. 0: send none."
        ),
    )

    @property
    def false_rollback(self) -> float:
        """falseRollbackPercent as a fraction (its default filled in)."""
        percent = 1.0 if self.false_rollback_percent is None else self.false_rollback_percent
        return percent / 100

    @property
    def smallest_regression(self) -> float:
        """smallestRegressionPercent as a fraction, else the deprecated tolerance's, within the
        smallest regression's bounds."""
        percent = self.smallest_regression_percent
        if percent is None:
            percent = min(max(self.acceptance_tolerance_percent, 1), 90)
        return percent / 100


class DisruptionBudgetSpec(Model):
    """The PodDisruptionBudget of each (revision, engine role): voluntary disruptions only."""

    max_unavailable: int = Field(
        ge=1,
        le=1000,
        description=(
            "Pods per role and revision that voluntary disruptions (a node drain's evictions) "
            "may take at once; for a multi-node role, pods of at most this many groups. At "
            "least 1 (unset, a role that may surge allows none and the operator moves a "
            "cordoned node's pods itself). The operator's own rollouts, scale-downs and "
            "rollbacks delete pods and are never held by it."
        ),
    )


class RolloutSpec(Model):
    """How a paired (both roles) or role-local rollout proceeds."""

    RULES = (
        Rule(
            "self.maxSurge > 0 || self.maxUnavailable > 0",
            "spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0: a "
            "rollout could never make progress; set maxSurge: 1",
            lambda rollout: rollout.max_surge > 0 or rollout.max_unavailable > 0,
        ),
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    max_surge: int = Field(
        default=1, ge=0, le=1000, description="Pods per role allowed above replicas during a roll."
    )
    max_unavailable: int = Field(
        default=0,
        ge=0,
        le=1000,
        description="Ready serving pods per role allowed below replicas during a roll.",
    )
    drain_seconds: int = Field(
        default=60,
        ge=0,
        le=3600,
        description="Seconds an old revision keeps its pods after its router stops taking traffic.",
    )
    progress_deadline_seconds: int = Field(
        default=600,
        ge=10,
        le=86400,
        description=(
            "Seconds a paired rollout may make no progress (no new ready pod, no old pod gone) "
            "before it fails with ProgressDeadlineExceeded."
        ),
    )
    on_failure: Literal["Rollback", "Hold"] = Field(
        default="Rollback",
        description=(
            "When the new revision fails (an engine refuses its config, crash-loops, or the "
            "deadline passes) while an old revision serves: Rollback scales the new revision "
            "away and keeps serving on the old one; Hold leaves the rollout where it is."
        ),
    )
    paused: bool = Field(
        default=False,
        description="Freeze the rollout at its current step (drains already started finish).",
    )
    canary: CanarySpec | None = Field(
        default=None,
        description="Hold the rollout at a share of the new revision until it is promoted.",
    )
    disruption_budget: DisruptionBudgetSpec | None = Field(
        default=None,
        description=(
            "Each (revision, engine role) gets a PodDisruptionBudget. Unset: with maxSurge >= 1 "
            "it allows no eviction, and the operator moves the engine pods off a cordoned node "
            "itself, replacement first, out of the routers before they stop (a drain waits for "
            "it); with maxSurge 0, or for a multi-node role, it allows maxUnavailable, at least "
            "1 (one pod or group per role and revision at a time). Set, drains evict that many "
            "at once. Changing it rolls nothing."
        ),
    )


class PDDeploymentSpec(Model):
    """Desired state of a prefill/decode deployment."""

    # Cross-role rules: CEL refuses them at admission; in Python they are the agreement's
    # findings, reported with their own reason (pdmtp.core.agreement).
    RULES = (
        TP_DIVISIBLE_RULE,
        MAX_MODEL_LEN_RULE,
        SPECULATIVE_OVERRIDE_RULE,
        DRAFT_MODEL_RULE,
        SPECULATIVE_TOKENS_DIVISIBLE_RULE,
        HUB_TOKEN_RULE,
        MOUNTS_RULE,
        WEIGHTS_MOUNT_RULE,
        BAND_REACHABLE_RULE,
        CANARY_BUDGET_RULE,
        *AUTOSCALING_SPEC_RULES,
        *ENGINE_GROUP_ARGS_RULES,
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    model: ModelSpec = Field(description="The checkpoint both roles serve.")
    image: EngineImage = Field(
        description="Engine image (images/engine: pinned vLLM + the backoff-fixed connector).",
    )
    engine: EngineSpec = Field(
        default_factory=EngineSpec,
        json_schema_extra=defaulted(EngineSpec),
        description="Engine settings both roles share.",
    )
    speculative: SpeculativeSpec | None = Field(
        default=None, description="Speculative decoding; unset serves without it (lookahead 0)."
    )
    kv_transfer: KVTransferSpec = Field(
        default_factory=KVTransferSpec,
        alias="kvTransfer",
        json_schema_extra=defaulted(KVTransferSpec),
        description="The Mooncake KV transfer between prefill and decode.",
    )
    prefill: RoleSpec = Field(description="The prefill role (Mooncake kv_producer).")
    decode: RoleSpec = Field(description="The decode role (Mooncake kv_consumer).")
    router: RouterSpec = Field(
        default_factory=RouterSpec,
        json_schema_extra=defaulted(RouterSpec),
        description="The per-revision request router.",
    )
    rollout: RolloutSpec = Field(
        default_factory=RolloutSpec,
        json_schema_extra=defaulted(RolloutSpec),
        description="Rollout policy for both kinds of rollout.",
    )
    verification: VerificationSpec | None = Field(
        default=None,
        description=(
            "Judge each revision on its decodes' hand-off counts and MTP acceptance, and hold "
            "or roll back rollouts on the verdict. Changing it rolls nothing. Unset: every "
            "default below (mode Rollback); left unset rather than defaulted, so that objects "
            "stored before it existed read back unchanged."
        ),
    )
    pod: PodSettings | None = Field(
        default=None,
        description=(
            "Pod settings of both roles (pull secrets, priority, scheduler, affinity, spread, "
            "security context, service account, volumes); role-local."
        ),
    )
    placement: Placement | None = Field(
        default=None, description="Where a revision's prefill and decode pods land; role-local."
    )
    autoscaling: AutoscalingSpec | None = Field(
        default=None,
        description=(
            "Scale prefill and decode with their load within a prefill:decode band; unset keeps "
            "spec.<role>.replicas. Scaling rolls nothing."
        ),
    )
    revision_history_limit: int = Field(
        default=10,
        ge=0,
        le=100,
        description=(
            "Retired revisions whose spec is kept (a ControllerRevision each) for "
            "`pdmtp rollout undo`."
        ),
    )

    def role(self, role: v.EngineRole) -> RoleSpec:
        """spec.prefill or spec.decode."""
        return v.by_role(role, self.prefill, self.decode)

    @property
    def effective_verification(self) -> VerificationSpec:
        """spec.verification, or its defaults where it is unset."""
        return self.verification or VerificationSpec()


class ObjectMeta(Model):
    """The metadata fields pdmtp reads; others pass through untouched."""

    model_config = ConfigDict(extra="allow")

    # The rule bounds the length too, so it alone speaks about a bad name.
    name: Annotated[str, Checked(METADATA_NAME)] = Field(description="Object name.")
    namespace: (
        Annotated[str, Checked(r.name_rule("metadata.namespace", r.DNS_LABEL, "a DNS label", 63))]
        | None
    ) = Field(default=None, description="Namespace.")
    uid: str | None = Field(default=None, description="Object uid.")
    generation: int | None = Field(default=None, description="Spec generation.")


class PDDeployment(Model):
    """A prefill/decode disaggregated vLLM deployment with MTP agreement checks."""

    api_version: Literal["pdmtp.io/v1alpha1"] = Field(
        alias="apiVersion", description="pdmtp.io/v1alpha1."
    )
    kind: Literal["PDDeployment"] = Field(description="PDDeployment.")
    metadata: ObjectMeta = Field(description="Standard object metadata.")
    spec: PDDeploymentSpec = Field(description="Desired state.")
    status: PDDeploymentStatus | None = Field(default=None, description="Observed state.")
