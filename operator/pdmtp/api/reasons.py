"""Condition types and the reasons of conditions and events: the one vocabulary status, events,
`pdmtp validate` and the webhook speak.

Every reason is registered with what it belongs to (a condition type, or `EVENT`) and what it
means; docs/api-reference.md is generated from that table (`REASONS`), so a reason added here
appears there (and the drift test fails until the reference is regenerated).
"""

from dataclasses import dataclass
from typing import Final

# Condition types.
CONFIG_COMPATIBLE: Final = "ConfigCompatible"
AVAILABLE: Final = "Available"
PROGRESSING: Final = "Progressing"
DEGRADED: Final = "Degraded"
CONDITION_TYPES: Final = (CONFIG_COMPATIBLE, AVAILABLE, PROGRESSING, DEGRADED)
EVENT: Final = "Event"
"""What event-only reasons belong to in `REASONS`."""


@dataclass(frozen=True)
class Reason:
    """A reason, what it belongs to (a condition type or EVENT) and what it means."""

    name: str
    belongs_to: str
    meaning: str


REASONS: list[Reason] = []
"""Every reason, in the order registered (the reference lists them in this order)."""


def _reason(belongs_to: str, name: str, meaning: str) -> str:
    REASONS.append(Reason(name, belongs_to, meaning))
    return name


# ConfigCompatible.
COMPATIBLE: Final = _reason(
    CONFIG_COMPATIBLE, "Compatible", "Both roles derive the same lookahead; every rule holds."
)
LOOKAHEAD_MISMATCH: Final = _reason(
    CONFIG_COMPATIBLE, "LookaheadMismatch", "The roles derive different prefill lookaheads."
)
MTP_MODULES_UNKNOWN: Final = _reason(
    CONFIG_COMPATIBLE,
    "MTPModulesUnknown",
    "The roles' numSpeculativeTokens differ and spec.model.mtpModules is not declared.",
)
TENSOR_PARALLEL_INDIVISIBLE: Final = _reason(
    CONFIG_COMPATIBLE,
    "TensorParallelIndivisible",
    "The roles' tensor-parallel sizes do not divide one another.",
)
MAX_MODEL_LEN_MISMATCH: Final = _reason(
    CONFIG_COMPATIBLE,
    "MaxModelLenMismatch",
    "The decode's context is shorter than the prefill's.",
)
OWNED_FLAG_IN_EXTRA_ARGS: Final = _reason(
    CONFIG_COMPATIBLE, "OwnedFlagInExtraArgs", "extraArgs set a flag a typed field owns."
)
SPECULATIVE_OVERRIDE_WITHOUT_METHOD: Final = _reason(
    CONFIG_COMPATIBLE,
    "SpeculativeOverrideWithoutMethod",
    "A role overrides spec.speculative, which is not set.",
)
RDMA_DEVICES_MISSING: Final = _reason(
    CONFIG_COMPATIBLE, "RDMADevicesMissing", "Protocol rdma without spec.kvTransfer.deviceNames."
)
DRAFT_MODEL_MISSING: Final = _reason(
    CONFIG_COMPATIBLE,
    "DraftModelMissing",
    "A method that drafts with a separate model has no spec.speculative.draftModel.",
)
SPECULATIVE_TOKENS_INDIVISIBLE: Final = _reason(
    CONFIG_COMPATIBLE,
    "SpeculativeTokensIndivisible",
    "numSpeculativeTokens exceeds mtpModules without being a multiple of it (vLLM refuses).",
)
INVALID_SPEC: Final = _reason(
    CONFIG_COMPATIBLE,
    "InvalidSpec",
    "The object does not parse as a PDDeployment (types, bounds, unknown fields).",
)

# Available.
MINIMUM_REPLICAS_AVAILABLE: Final = _reason(
    AVAILABLE,
    "MinimumReplicasAvailable",
    "Serving revisions have at least replicas - maxUnavailable ready pods per role.",
)
MINIMUM_REPLICAS_UNAVAILABLE: Final = _reason(
    AVAILABLE,
    "MinimumReplicasUnavailable",
    "A revision serves, but with fewer ready pods than the floor.",
)
NO_SERVING_REVISION: Final = _reason(
    AVAILABLE,
    "NoServingRevision",
    "No revision has a ready router with a ready prefill and decode.",
)

# Progressing.
ROLLOUT_IN_PROGRESS: Final = _reason(
    PROGRESSING, "RolloutInProgress", "A paired rollout or a scale is under way."
)
ROLLOUT_COMPLETE: Final = _reason(
    PROGRESSING,
    "RolloutComplete",
    "The update revision alone runs, at its replicas, all ready and serving.",
)
ROLLOUT_BLOCKED: Final = _reason(
    PROGRESSING,
    "RolloutBlocked",
    "No step can make progress (an incompatible spec, or a policy that allows no move).",
)
PODS_UNSCHEDULABLE: Final = _reason(
    PROGRESSING, "PodsUnschedulable", "The scheduler cannot place the update revision's pods."
)
PAUSED: Final = _reason(
    PROGRESSING, "Paused", "spec.rollout.paused: the rollout is frozen (status Unknown)."
)
CANARY_HOLD: Final = _reason(
    PROGRESSING,
    "CanaryHold",
    "The new revision serves its canary share next to the old one; promote it (status Unknown).",
)
PROGRESS_DEADLINE_EXCEEDED: Final = _reason(
    PROGRESSING,
    "ProgressDeadlineExceeded",
    "No progress for spec.rollout.progressDeadlineSeconds; the message says what it waits for.",
)
ROLLOUT_FAILED: Final = _reason(
    PROGRESSING,
    "RolloutFailed",
    "The new revision failed (an engine refused its config or crash-loops) and onFailure is "
    "Hold, or nothing older serves: the rollout stays where it is.",
)
ROLLOUT_ABORTED: Final = _reason(
    PROGRESSING,
    "RolloutAborted",
    "The rollout to the spec's revision was rolled back (see Degraded); a new spec change "
    "starts a new rollout.",
)
CHILD_REJECTED: Final = _reason(
    PROGRESSING,
    "ChildRejected",
    "The API server refused a write to a child (admission policy, quota, invalid object, a "
    "persisting conflict); the message is the server's. Cleared by the next write that passes.",
)
PODS_REJECTED: Final = _reason(
    PROGRESSING,
    "PodsRejected",
    "A child Deployment cannot create its pods (ReplicaFailure: quota, admission); the message "
    "is the server's.",
)

# Degraded.
AS_EXPECTED: Final = _reason(
    DEGRADED, "AsExpected", "No engine container has terminated with an error."
)
ENGINE_REFUSED_CONFIG: Final = _reason(
    DEGRADED,
    "EngineRefusedConfig",
    "The engine launcher refused its configuration (exit 3, reason in the message).",
)
ENGINE_TERMINATED: Final = _reason(
    DEGRADED, "EngineTerminated", "An engine container ended with an error and a message."
)
ROLLED_BACK: Final = _reason(
    DEGRADED,
    "RolledBack",
    "The new revision failed and was scaled away; the old one serves. The spec is unchanged: a "
    "new spec change starts a new rollout.",
)

WORKLOAD_API_UNAVAILABLE: Final = _reason(
    CONFIG_COMPATIBLE,
    "WorkloadAPIUnavailable",
    "A role spans nodes (multiNode) but the API server does not serve the Workload API "
    "(scheduling.k8s.io PodGroup) that gang-schedules its groups: nothing is created for the "
    "spec (a half-placed group would hold GPUs and serve nothing); serving pods are left alone.",
)

# Events (besides a condition's reason, which its transitions are posted under).
CREATED: Final = _reason(EVENT, "Created", "A child object was created.")
UPDATED: Final = _reason(
    EVENT,
    "Updated",
    "A child's owned fields were set back to what the spec renders (the message lists them): a "
    "spec change, or a foreign edit reverted.",
)
SCALED: Final = _reason(EVENT, "Scaled", "An old revision's Deployment was scaled.")
POD_LEAVING: Final = _reason(
    EVENT,
    "PodLeaving",
    "An engine pod a scale-down removes left its routers first; it is deleted once no router "
    "lists it.",
)
TRAFFIC_STOPPED: Final = _reason(
    EVENT, "TrafficStopped", "A revision's router was turned off; its pods drain."
)
REVISION_RETIRED: Final = _reason(
    EVENT, "RevisionRetired", "A drained revision's workloads were deleted."
)
ROLLBACK_STARTED: Final = _reason(
    EVENT, "RollbackStarted", "The new revision failed: rolling back to the old one (a Warning)."
)
GROUP_REMOVED: Final = _reason(
    EVENT,
    "GroupRemoved",
    "A multi-node group was deleted whole: a scale-down, or a member failed or went away (vLLM's "
    "ranks cannot rejoin a running engine; a new group takes its place).",
)
PROMOTED: Final = _reason(EVENT, "Promoted", "A canary revision was promoted; the rollout goes on.")
AUTOSCALED_UP: Final = _reason(
    EVENT, "AutoscaledUp", "The autoscaler raised a role's desired count (the reason says why)."
)
AUTOSCALED_DOWN: Final = _reason(
    EVENT, "AutoscaledDown", "The autoscaler lowered a role's desired count (the reason says why)."
)


WARNING_REASONS: Final = frozenset(
    {
        CHILD_REJECTED,
        PODS_REJECTED,
        ROLLOUT_BLOCKED,
        PROGRESS_DEADLINE_EXCEEDED,
        ROLLOUT_FAILED,
        ROLLED_BACK,
    }
)
"""Reasons whose condition, whenever it appears or changes its message, is a Warning event."""


def reasons_of(belongs_to: str) -> list[str]:
    """The reasons registered for a condition type (or EVENT), in order."""
    return [r.name for r in REASONS if r.belongs_to == belongs_to]
