"""The PDDeployment's status, as the operator writes it (`pdmtp.core.status` builds these
models; the writer dumps them by alias, so the schema and what is written cannot drift)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from pdmtp.api.base import Model


class Condition(Model):
    """A metav1.Condition."""

    type: str = Field(max_length=316, description="Condition type, e.g. Available.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    observed_generation: int | None = Field(
        default=None, ge=0, description="metadata.generation this condition was computed from."
    )
    last_transition_time: str = Field(
        description="When status last changed (RFC 3339); unchanged while status holds."
    )
    reason: str = Field(max_length=1024, description="CamelCase reason from pdmtp's vocabulary.")
    message: str = Field(default="", max_length=32768, description="Human-readable details.")


class Lookahead(Model):
    """The prefill lookahead each role derives, and the prefill backoff."""

    prefill: int | None = Field(default=None, description="Lookahead the prefill derives.")
    decode: int | None = Field(default=None, description="Lookahead the decode derives.")
    prefill_backoff: int | None = Field(
        default=None, description="Tokens the prefill stops short of each prompt."
    )


class RoleStatus(Model):
    """Pod counts of one role across revisions."""

    name: Literal["prefill", "decode", "router"] = Field(description="The role.")
    replicas: int = Field(
        default=0,
        description=(
            "Replicas of this role (all revisions): pods, or for a multi-node role whole groups."
        ),
    )
    ready_replicas: int = Field(
        default=0, description="Ready replicas (all revisions); a group is Ready when all is."
    )
    updated_replicas: int = Field(default=0, description="Replicas at the update revision.")
    desired_replicas: int = Field(
        default=0, description="spec.<role>.replicas, or the autoscaler's count."
    )
    pods_per_replica: int | None = Field(
        default=None,
        description=(
            "Pods in one replica of a multi-node role (spec.<role>.multiNode.nodes) at the "
            "update revision; unset for one pod per replica."
        ),
    )


class VerificationStatus(Model):
    """What a revision's decode pods did while the operator watched them (since its first
    scrape of each: an operator restart starts the evidence again), and the verdict on it."""

    verdict: Literal["Pending", "Verified", "Failed"] = Field(
        description="Pending (too little evidence), Verified or Failed."
    )
    reason: str = Field(description="Why: a reason of the Verified condition.")
    message: str = Field(description="The verdict in words, with the figures it rests on.")
    decode_pods: int = Field(description="Decode pods scraped.")
    requests: int = Field(description="Requests whose KV the decodes pulled from a prefill.")
    pulled_tokens: int = Field(description="Prompt tokens pulled.")
    recomputed_tokens: int = Field(description="Prompt tokens recomputed for the MTP backoff.")
    expected_backoff: int | None = Field(
        default=None, description="The backoff per request derived from the lookahead."
    )
    failed_pulls: int = Field(
        description=(
            "KV receives that failed (a revision that rolled out: over each decode's last "
            "windows, so that a recovered blip stops counting)."
        )
    )
    decode_only: int = Field(
        description="Requests served with no prefill's KV (counted as failedPulls is)."
    )
    drafts: int = Field(description="MTP drafts made.")
    windows: int | None = Field(
        default=None,
        description=(
            "Scrape windows with drafts (one pod, one interval) the acceptance test rests on: "
            "its variance is measured across them."
        ),
    )
    acceptance_length: float | None = Field(
        default=None, description="Accepted tokens per draft; unset before the first draft."
    )


class RevisionStatus(Model):
    """One revision that has workloads."""

    revision: str = Field(description="Compat revision hash.")
    phase: Literal["Starting", "Serving", "Draining", "Retired"] = Field(
        description="Starting (no traffic yet), Serving, Draining (traffic off) or Retired."
    )
    prefill: str = Field(
        description="Ready/desired prefill replicas, e.g. 2/2 (groups for a multi-node role)."
    )
    decode: str = Field(description="Ready/desired decode replicas.")
    routers: int = Field(description="Ready router pods.")
    verification: VerificationStatus | None = Field(
        default=None, description="The P/D path judged on what its decodes did."
    )


RolloutPhase = Literal[
    "Progressing", "Paused", "CanaryHold", "Complete", "Failed", "RollingBack", "RolledBack"
]


class RolloutStatus(Model):
    """Where the paired rollout to the update revision stands (the deadline's clock)."""

    revision: str = Field(description="The revision being rolled to.")
    phase: RolloutPhase = Field(description="What the rollout is doing.")
    started_at: str = Field(description="When the rollout to this revision started (RFC 3339).")
    last_progress_at: str = Field(description="When it last made progress (RFC 3339).")
    progress: str = Field(
        description="What progress means here: ready new pods and remaining old pods."
    )
    failed_revision: str | None = Field(
        default=None,
        description="A revision that failed and was rolled back from; kept until the spec changes.",
    )
    rollback_revision: str | None = Field(
        default=None, description="The revision the rollback returns to."
    )
    failure: str | None = Field(default=None, description="Why the revision failed.")
    failed_verdict: str | None = Field(
        default=None,
        description="The Verified condition's reason, when the failure is the revision's verdict.",
    )
    failed_generation: int | None = Field(
        default=None,
        description="metadata.generation that failed: any later spec change rolls again.",
    )
    canary_traffic_percent: int | None = Field(
        default=None,
        description="During a canary hold: the new revision's share of router endpoints.",
    )
    verdict_waived: str | None = Field(
        default=None,
        description=(
            "Why the rollout went on without the new revision's verdict (spec.verification.mode "
            "Rollback: none within progressDeadlineSeconds); kept until the spec changes."
        ),
    )


TemplateRollPhase = Literal["Judging", "Verified", "Waived", "Failed"]


class TemplateRollStatus(Model):
    """A role-local change rolling inside a revision (a new pod template of its Deployment),
    judged as a new revision is (spec.verification modes Rollback and Gate)."""

    role: Literal["prefill", "decode"] = Field(description="The role whose pods roll.")
    revision: str = Field(description="The revision whose Deployment rolls in place.")
    template: str = Field(description="The role hash (pdmtp.io/role-hash) the role rolls to.")
    verified_template: str = Field(
        description="The role hash it replaces: the role returns to it if the new one fails."
    )
    phase: TemplateRollPhase = Field(
        description=(
            "Judging: held at its first new pods until they have a verdict. Verified: the roll "
            "goes on. Waived: mode Rollback, no verdict within progressDeadlineSeconds, the roll "
            "goes on unverified. Failed: the role went back to verifiedTemplate, until its "
            "settings change."
        )
    )
    started_at: str = Field(description="When the operator saw the change (RFC 3339).")
    reason: str = Field(default="", description="The verdict's reason (a Verified reason).")
    message: str = Field(default="", max_length=4096, description="The verdict in words.")


WaitReason = Literal[
    "Unschedulable",
    "ImagePull",
    "ContainerError",
    "CrashLoop",
    "DisruptionBudget",
    "Starting",
    "NotReady",
    "Replacing",
    "ListedByRouter",
    "Draining",
]
"""Why a step waits for an object; in the order facts are named (after the stuck ones)."""


class WaitStatus(Model):
    """One object the unfinished step (a roll, a canary hold, a scale, a removal, a drain) waits
    for, and why."""

    object: str = Field(description="`Kind/name`: a Pod, a PodDisruptionBudget, a Deployment.")
    revision: str = Field(default="", description="Its revision.")
    role: str = Field(default="", description="Its role (prefill, decode or router).")
    reason: WaitReason = Field(
        description=(
            "Unschedulable (the scheduler's message), ImagePull, ContainerError (a container "
            "that cannot start: config, secret), CrashLoop, DisruptionBudget (a budget that "
            "allows no eviction of its Ready pods while one is on a cordoned node: a drain "
            "waits), Starting (Pending), NotReady (running, not Ready yet), "
            "Replacing (a decode whose KV pulls kept failing, being replaced), ListedByRouter "
            "(leaving, still listed by its routers: the removal gate), Draining (traffic "
            "stopped, drainSeconds running)."
        )
    )
    message: str = Field(default="", max_length=1024, description="Why, in words.")
    stuck: bool = Field(
        default=False,
        description=(
            "It will not resolve by itself (capacity, an image, a config, a crash loop, a "
            "budget over a stuck role): posted as a Stalled Warning event when it first appears."
        ),
    )


class SignalValue(Model):
    """One signal as the last evaluation read it."""

    signal: str = Field(description="The signal (spec.autoscaling.<role>.targets[].signal).")
    value: float | None = Field(default=None, description="Observed value; unset when missing.")
    target: float = Field(description="The target used (MTP-adjusted for decode tokens).")
    desired: int | None = Field(default=None, description="The count it asked for; unset: no vote.")
    coverage: Literal["full", "partial", "missing", "quiet"] = Field(
        description="How many Ready pods reported it: full (all), partial, missing, quiet."
    )


class ScaleSample(Model):
    """A recommendation the stabilisation windows remember."""

    at: str = Field(description="When (RFC 3339).")
    replicas: int = Field(description="The recommended count.")


class ScaleChange(Model):
    """A change of the desired count the step limits remember."""

    at: str = Field(description="When (RFC 3339).")
    before: int = Field(description="Desired before.")
    after: int = Field(description="Desired after.")


class RoleScaling(Model):
    """One role's autoscaling state: what it decided, from what, and what it remembers."""

    name: Literal["prefill", "decode"] = Field(description="The role.")
    source: Literal["Operator", "External"] = Field(description="Who sets its count.")
    desired_replicas: int = Field(description="The count the operator rolls the role to.")
    current_replicas: int = Field(default=0, description="Ready pods of the role (all revisions).")
    recommendation: int | None = Field(
        default=None,
        description="The autoscaler's raw recommendation (or the PDRoleScale's replicas), before "
        "stabilisation, step limits, min/max and the ratio band.",
    )
    deciding_signal: str | None = Field(default=None, description="The signal that decided.")
    reason: str = Field(default="", max_length=4096, description="Why, step by step.")
    last_scale_time: str | None = Field(
        default=None, description="When the desired count last changed (RFC 3339)."
    )
    acceptance_length: float | None = Field(
        default=None, description="MTP accepted tokens per draft measured over the last interval."
    )
    signals: list[SignalValue] = Field(
        default_factory=list, description="The signal values the last evaluation used."
    )
    recommendations: list[ScaleSample] = Field(
        default_factory=list, description="Recommendations inside the stabilisation windows."
    )
    changes: list[ScaleChange] = Field(
        default_factory=list, description="Desired-count changes inside the step-limit periods."
    )


class AutoscalingStatus(Model):
    """spec.autoscaling's state, kept here so a restarted operator resumes its windows."""

    last_evaluation_time: str | None = Field(
        default=None, description="When the roles were last evaluated (RFC 3339)."
    )
    ratio_note: str | None = Field(
        default=None, description="What the prefill:decode band did at the last evaluation."
    )
    roles: list[RoleScaling] = Field(default_factory=list, description="prefill and decode.")


class PDDeploymentStatus(Model):
    """Observed state, written by the operator once per reconcile."""

    model_config = ConfigDict(frozen=False)

    observed_generation: int | None = Field(
        default=None, description="metadata.generation the operator last acted on."
    )
    lookahead: Lookahead | None = Field(default=None, description="Derived MTP prefill lookahead.")
    current_revision: str | None = Field(
        default=None, description="The most established serving revision."
    )
    update_revision: str | None = Field(default=None, description="The revision the spec asks for.")
    rollout: RolloutStatus | None = Field(
        default=None, description="The paired rollout's progress, deadline and failure state."
    )
    prefill: str | None = Field(
        default=None, description="Ready/desired prefill replicas (printer)."
    )
    decode: str | None = Field(default=None, description="Ready/desired decode replicas (printer).")
    roles: list[RoleStatus] = Field(default_factory=list, description="Per-role pod counts.")
    autoscaling: AutoscalingStatus | None = Field(
        default=None, description="The autoscaler's decisions (with spec.autoscaling)."
    )
    waiting_for: list[WaitStatus] | None = Field(
        default=None,
        max_length=10,
        description=(
            "While a rollout, a canary hold or a scale is unfinished: what it waits for, across "
            "all revisions and roles (routers too), stuck first; at most 10 (the Progressing "
            "condition names the first 3 and counts the rest). Unset when nothing waits."
        ),
    )
    revisions: list[RevisionStatus] = Field(
        default_factory=list, description="Revisions that have workloads, newest last."
    )
    template_rolls: list[TemplateRollStatus] | None = Field(
        default=None,
        description=(
            "Role-local changes rolling inside the spec revision and their verdicts (modes "
            "Rollback and Gate); unset when none rolls."
        ),
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="ConfigCompatible, Available, Progressing, Degraded."
    )
