"""What a role's pods carry besides the engine's own settings: environment, resources,
tolerations, volumes, and the pod-level scheduling settings (shared in spec.pod, overridable per
role in spec.<role>.pod). Scheduling settings are role-local: changing them rolls a role in place,
never a paired rollout."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field

from pdmtp.api import rules as r
from pdmtp.api import vocabulary as v
from pdmtp.api.base import Model
from pdmtp.api.corev1 import CoreV1, snapshot
from pdmtp.api.rules import Checked, Rule, model_rules

OWNED_ENV = (
    v.ENV_VLLM_HOST_IP,
    v.ENV_MOONCAKE_BOOTSTRAP_PORT,
    v.ENV_ROLE,
    v.ENV_EXPECTED_LOOKAHEAD,
    v.ENV_EXPECTED_BACKOFF,
    v.ENV_METRICS_PORT,
    v.ENV_HF_HOME,
    v.ENV_HF_HUB_OFFLINE,
)


ENV_NAME = Annotated[
    str, Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
]
OBJECT_NAME = Annotated[
    str,
    Field(min_length=1, max_length=253),
    Checked(r.name_rule("a referenced object's name", r.DNS_SUBDOMAIN, "a DNS subdomain", 253)),
]
KEY_NAME = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]


def _exactly_one(what: str, *fields: tuple[str, str]) -> Rule:
    """Exactly one of the (wire name, python name) fields is set."""
    cel = "[" + ", ".join(f"has(self.{wire})" for wire, _ in fields) + "].filter(x, x).size() == 1"
    names = ", ".join(wire for wire, _ in fields)
    return Rule(
        cel,
        f"{what} sets exactly one of {names}",
        lambda obj: sum(getattr(obj, attr) is not None for _, attr in fields) == 1,
    )


class KeySelector(Model):
    """A key of a Secret or ConfigMap in the PDDeployment's namespace."""

    name: OBJECT_NAME = Field(description="The Secret's or ConfigMap's name.")
    key: KEY_NAME = Field(description="The key whose value is used.")
    optional: bool | None = Field(default=None, description="Whether the key may be missing.")


class FieldSelector(Model):
    """A field of the pod (the downward API)."""

    field_path: str = Field(
        min_length=1, max_length=256, description="e.g. metadata.name or status.podIP."
    )


class EnvVarSource(Model):
    """Where an environment variable's value comes from."""

    RULES = (
        _exactly_one(
            "valueFrom",
            ("secretKeyRef", "secret_key_ref"),
            ("configMapKeyRef", "config_map_key_ref"),
            ("fieldRef", "field_ref"),
        ),
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    secret_key_ref: KeySelector | None = Field(default=None, description="A Secret's key.")
    config_map_key_ref: KeySelector | None = Field(default=None, description="A ConfigMap's key.")
    field_ref: FieldSelector | None = Field(default=None, description="A field of the pod.")


CREDENTIAL_NAME = r"(?i).*(TOKEN|KEY|SECRET|PASSWORD).*"
CREDENTIAL_LITERAL = Rule(
    f"!self.name.matches('{CREDENTIAL_NAME}') || !has(self.value) || self.value == ''",
    "env entries whose name contains TOKEN, KEY, SECRET or PASSWORD must not carry a literal "
    "value (anyone who can read the PDDeployment would see it): use valueFrom.secretKeyRef",
    lambda e: not r.matches(CREDENTIAL_NAME)(e.name) or not e.value,
)


class EnvVar(Model):
    """An environment variable for the engine container: a literal value or a reference."""

    RULES = (
        Rule(
            "!has(self.valueFrom) || !has(self.value) || self.value == ''",
            "an env entry sets value or valueFrom, not both",
            lambda e: e.value_from is None or not e.value,
        ),
        CREDENTIAL_LITERAL,
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    name: ENV_NAME = Field(description="Variable name.")
    value: str | None = Field(default=None, max_length=32768, description="A literal value.")
    value_from: EnvVarSource | None = Field(
        default=None, description="The value from a Secret, a ConfigMap or the pod."
    )


class NameReference(Model):
    """A Secret or ConfigMap in the PDDeployment's namespace, by name."""

    name: OBJECT_NAME = Field(description="The object's name.")
    optional: bool | None = Field(default=None, description="Whether it may be missing.")


class EnvFromSource(Model):
    """Every key of a Secret or ConfigMap as environment variables."""

    RULES = (
        _exactly_one("envFrom", ("secretRef", "secret_ref"), ("configMapRef", "config_map_ref")),
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    prefix: ENV_NAME | None = Field(default=None, description="Prepended to every key.")
    secret_ref: NameReference | None = Field(default=None, description="A Secret.")
    config_map_ref: NameReference | None = Field(default=None, description="A ConfigMap.")


QuantityValue = int | Annotated[str, Field(max_length=64)]


def _resource_map(path: str) -> Checked:
    return Checked(
        r.keys_rule(
            path, r.QUALIFIED_NAME, "resource names such as cpu, memory or example.com/foo"
        ),
        r.quantities_rule(path),
        r.extended_resources_rule(path),
    )


class ResourceRequirements(Model):
    """Compute resources for the engine container. GPUs are added from the parallel sizes."""

    RULES = (r.requests_within_limits_rule("resources"),)
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    requests: Annotated[dict[str, QuantityValue], _resource_map("resources.requests")] = Field(
        default_factory=dict,
        max_length=12,
        description=(
            "Minimum resources (cpu, memory, ...); `nvidia.com/gpu` is set by the operator."
        ),
    )
    limits: Annotated[dict[str, QuantityValue], _resource_map("resources.limits")] = Field(
        default_factory=dict,
        max_length=12,
        description="Maximum resources. `nvidia.com/gpu` is set by the operator.",
    )


class Toleration(Model):
    """A pod toleration (the core/v1 Toleration fields)."""

    RULES = (
        Rule(
            "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || "
            "self.value == ''",
            "a toleration with operator Exists matches any value: leave value empty",
            lambda t: t.operator != "Exists" or not t.value,
        ),
        Rule(
            "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
            "tolerationSeconds applies only to effect NoExecute",
            lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
        ),
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    key: (
        Annotated[
            str,
            Field(max_length=316),
            Checked(r.name_rule("a toleration key", r.QUALIFIED_NAME, "a label key", 316)),
        ]
        | None
    ) = Field(default=None, description="Taint key the toleration applies to.")
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Key operator.")
    value: (
        Annotated[
            str,
            Field(max_length=63),
            Checked(r.name_rule("a toleration value", r.LABEL_VALUE, "a label value", 63)),
        ]
        | None
    ) = Field(default=None, description="Taint value the toleration matches.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, description="How long a NoExecute taint is tolerated."
    )


OWNED_ENV_RULE = Rule(
    "self.all(e, !(e.name in " + str(list(OWNED_ENV)).replace('"', "'") + "))",
    "env must not set " + ", ".join(OWNED_ENV) + ": the operator owns them",
    lambda env: all(e.name not in OWNED_ENV for e in env),
)


VOLUME_SOURCES = tuple(
    name for name in snapshot()["definitions"]["Volume"]["properties"] if name != "name"
)
"""The core/v1 volume sources (emptyDir, secret, persistentVolumeClaim, ...), from the snapshot."""


class Volume(Model):
    """A pod volume: the core/v1 Volume (its schema is Kubernetes' own, pdmtp.api.corev1), with
    a name outside the operator's and exactly one source."""

    RULES = (
        Rule(
            "[" + ", ".join(f"has(self.{s})" for s in VOLUME_SOURCES) + "]"
            ".filter(x, x).size() == 1",
            "a volume sets exactly one source (emptyDir, secret, configMap, "
            "persistentVolumeClaim, ...)",
            lambda vol: sum(k in VOLUME_SOURCES for k in vol.model_extra or {}) == 1,
        ),
    )
    model_config = ConfigDict(extra="allow", json_schema_extra=model_rules(*RULES))

    name: Annotated[
        str,
        Checked(
            r.name_rule("a volume name", r.DNS_LABEL, "a DNS label", 63),
            Rule(
                "!(self in " + str(list(v.RESERVED_VOLUMES)).replace('"', "'") + ")",
                "volume names " + ", ".join(v.RESERVED_VOLUMES) + " are the operator's",
                lambda name: name not in v.RESERVED_VOLUMES,
            ),
        ),
    ] = Field(max_length=63, description="Volume name, referenced by volumeMounts.")


_DOT_SEGMENT = r"(^|/)\.\.?(/|$)"


def _mount_path_ok(path: str) -> bool:
    normal = (
        path.startswith("/")
        and path != "/"
        and "//" not in path
        and not r.found(_DOT_SEGMENT, path)
    )
    return normal and not any(path == p or path.startswith(p + "/") for p in v.RESERVED_MOUNT_PATHS)


MOUNT_PATH_RULE = Rule(
    # Refusing '//' and '.'/'..' segments makes the prefix test exact: '//models' and
    # '/cache/../models' would otherwise land on an operator's mount past it.
    "self.startsWith('/') && self != '/' && !self.contains('//') && "
    f"!self.matches('{r.re2(_DOT_SEGMENT)}') && !("
    + " || ".join(f"self == '{p}' || self.startsWith('{p}/')" for p in v.RESERVED_MOUNT_PATHS)
    + ")",
    "mountPath must be absolute and normalised (no '//', '.' or '..' segments), not '/', "
    "and outside the operator's mounts (" + ", ".join(v.RESERVED_MOUNT_PATHS) + ")",
    _mount_path_ok,
)


class VolumeMount(Model):
    """Where a volume appears in the engine container: the core/v1 VolumeMount (Kubernetes'
    schema, pdmtp.api.corev1), at a path outside the operator's mounts."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=63, description="The volume's name.")
    mount_path: Annotated[str, Checked(MOUNT_PATH_RULE)] = Field(
        min_length=1, max_length=1024, description="Absolute path in the container."
    )
    sub_path: str | None = Field(default=None, max_length=1024, description="Path in the volume.")
    read_only: bool | None = Field(default=None, description="Mount read-only.")


FreeForm = dict[str, Any]


class PodSettings(Model):
    """Pod-level settings: shared in spec.pod, overridden per role in spec.<role>.pod (a field a
    role sets replaces the shared one). Free-form fields take the core/v1 shapes and are
    checked by the API server when the Deployment is written (a refusal is ChildRejected)."""

    image_pull_secrets: list[NameReference] | None = Field(
        default=None, max_length=16, description="Secrets to pull the engine image with."
    )
    priority_class_name: (
        Annotated[
            str, Checked(r.name_rule("priorityClassName", r.DNS_SUBDOMAIN, "a DNS subdomain", 253))
        ]
        | None
    ) = Field(default=None, max_length=253, description="The pods' PriorityClass.")
    scheduler_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        description="The scheduler that places the pods.",
    )
    service_account_name: (
        Annotated[
            str, Checked(r.name_rule("serviceAccountName", r.DNS_SUBDOMAIN, "a DNS subdomain", 253))
        ]
        | None
    ) = Field(default=None, max_length=253, description="The engine pods' ServiceAccount.")
    affinity: Annotated[FreeForm, CoreV1("PodSpec.affinity")] | None = Field(
        default=None,
        description="core/v1 Affinity; spec.placement adds its pod-affinity term to it.",
    )
    topology_spread_constraints: (
        Annotated[list[FreeForm], CoreV1("PodSpec.topologySpreadConstraints")] | None
    ) = Field(default=None, max_length=16, description="core/v1 TopologySpreadConstraints.")
    pod_security_context: Annotated[FreeForm, CoreV1("PodSpec.securityContext")] | None = Field(
        default=None, description="core/v1 PodSecurityContext (the pod's securityContext)."
    )
    volumes: Annotated[list[Volume], CoreV1("PodSpec.volumes", refine=Volume)] | None = Field(
        default=None, max_length=32, description="Extra pod volumes (core/v1 Volume)."
    )
    volume_mounts: (
        Annotated[list[VolumeMount], CoreV1("Container.volumeMounts", refine=VolumeMount)] | None
    ) = Field(
        default=None,
        max_length=32,
        description="Where the extra volumes appear in the engine (core/v1 VolumeMount).",
    )
    termination_grace_period_seconds: int | None = Field(
        default=None,
        ge=1,
        le=86400,
        description=(
            "Seconds an engine pod has to stop once it is told to (default "
            f"{v.DEFAULT_ENGINE_GRACE_SECONDS}): it keeps answering for all but the last "
            f"{v.ENGINE_SHUTDOWN_SECONDS} (a preStop sleep of at least 1 s), so a router that "
            "still lists it is served; then vLLM refuses new requests and finishes those it holds "
            f"(`--shutdown-timeout`, {v.SHUTDOWN_MARGIN_SECONDS} s less than what is left). "
            "Role-local: a change rolls the role; spec.rollout.drainSeconds does not touch it."
        ),
    )

    def over(self, shared: PodSettings | None) -> PodSettings:
        """These settings laid over `shared`: every field this one sets wins."""
        if shared is None:
            return self
        mine = self.model_dump(exclude_unset=True, exclude_none=True)
        return shared.model_copy(update={k: getattr(self, k) for k in mine})


class Placement(Model):
    """Where a revision's pods land, for the KV hand-off from prefill to decode."""

    RULES = (
        Rule(
            "!has(self.topologyKey) || !has(self.spreadKey) || self.topologyKey != self.spreadKey",
            "spec.placement.spreadKey must differ from topologyKey: pods cannot share one "
            "domain and spread across the same domains",
            lambda p: p.topology_key is None or p.topology_key != p.spread_key,
        ),
    )
    model_config = ConfigDict(json_schema_extra=model_rules(*RULES))

    topology_key: (
        Annotated[
            str,
            Checked(
                r.name_rule("spec.placement.topologyKey", r.QUALIFIED_NAME, "a label key", 316)
            ),
        ]
        | None
    ) = Field(
        default=None,
        max_length=316,
        description=(
            "A node label (a rack, an NVLink or RDMA domain): the prefill and decode pods of one "
            "revision all land in one domain of it (required pod affinity)."
        ),
    )
    spread_key: (
        Annotated[
            str,
            Checked(r.name_rule("spec.placement.spreadKey", r.QUALIFIED_NAME, "a label key", 316)),
        ]
        | None
    ) = Field(
        default=None,
        max_length=316,
        description=(
            "A node label to spread each role's pods across (maxSkew 1), e.g. hostname inside "
            "the topologyKey domain, or zones when pairs need not share a domain."
        ),
    )
