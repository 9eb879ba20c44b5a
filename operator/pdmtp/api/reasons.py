"""Condition types and the reasons of conditions and events: the one vocabulary status, events,
`pdmtp validate` and the webhook speak.

Every reason is registered with what it belongs to (a condition type, or `EVENT`), what it
means, and, where it reports a problem, what an operator of the cluster sees and what to do about
it. docs/api-reference.md is generated from that table (`REASONS`), and so is the README's
troubleshooting table (`pdmtp.tools.readme`): a reason added here appears in both (and the drift
tests fail until they are regenerated).
"""

from dataclasses import dataclass
from typing import Final

# Condition types.
CONFIG_COMPATIBLE: Final = "ConfigCompatible"
AVAILABLE: Final = "Available"
PROGRESSING: Final = "Progressing"
DEGRADED: Final = "Degraded"
VERIFIED: Final = "Verified"
CONDITION_TYPES: Final = (CONFIG_COMPATIBLE, AVAILABLE, PROGRESSING, DEGRADED, VERIFIED)
EVENT: Final = "Event"
"""What event-only reasons belong to in `REASONS`."""


@dataclass(frozen=True)
class Reason:
    """A reason, what it belongs to (a condition type or EVENT) and what it means.

    `symptom` (what someone looking at the cluster notices) and `action` (what to do) are set
    for reasons that report a problem and empty for those that say all is well or only record
    the operator's work."""

    name: str
    belongs_to: str
    meaning: str
    symptom: str = ""
    action: str = ""


REASONS: list[Reason] = []
"""Every reason, in the order registered (the reference lists them in this order)."""


def _reason(
    belongs_to: str, name: str, meaning: str, *, symptom: str = "", action: str = ""
) -> str:
    REASONS.append(Reason(name, belongs_to, meaning, symptom, action))
    return name


_NOTHING_STARTS = "A spec change starts no rollout; the serving revision keeps serving"
_READ_WAITING_FOR = (
    "Read `status.waitingFor` and the Progressing message: they name each pod that is not "
    "Ready and why (unschedulable, image pull, a missing Secret, a crash loop)"
)


# ConfigCompatible.
COMPATIBLE: Final = _reason(
    CONFIG_COMPATIBLE, "Compatible", "Both roles derive the same lookahead; every rule holds."
)
LOOKAHEAD_MISMATCH: Final = _reason(
    CONFIG_COMPATIBLE,
    "LookaheadMismatch",
    "The roles derive different prefill lookaheads.",
    symptom=_NOTHING_STARTS,
    action=(
        "Make both roles derive one lookahead: the same numSpeculativeTokens, or "
        "spec.model.mtpModules declared; `pdmtp validate FILE` prints each role's"
    ),
)
MTP_MODULES_UNKNOWN: Final = _reason(
    CONFIG_COMPATIBLE,
    "MTPModulesUnknown",
    "The roles' numSpeculativeTokens differ and spec.model.mtpModules is not declared.",
    symptom=_NOTHING_STARTS,
    action=(
        "Declare spec.model.mtpModules (the checkpoint's num_nextn_predict_layers), or give both "
        "roles the same numSpeculativeTokens"
    ),
)
TENSOR_PARALLEL_INDIVISIBLE: Final = _reason(
    CONFIG_COMPATIBLE,
    "TensorParallelIndivisible",
    "The roles' tensor-parallel sizes do not divide one another.",
    symptom=_NOTHING_STARTS,
    action="Choose tensorParallelSize values of which one divides the other (prefill 8, decode 4)",
)
MAX_MODEL_LEN_MISMATCH: Final = _reason(
    CONFIG_COMPATIBLE,
    "MaxModelLenMismatch",
    "The decode's context is shorter than the prefill's.",
    symptom=_NOTHING_STARTS,
    action="Give the decode an engine.maxModelLen at least the prefill's",
)
OWNED_FLAG_IN_EXTRA_ARGS: Final = _reason(
    CONFIG_COMPATIBLE,
    "OwnedFlagInExtraArgs",
    "extraArgs set a flag a typed field owns.",
    symptom=_NOTHING_STARTS,
    action="Remove the flag from extraArgs and set the typed field the message names",
)
SPECULATIVE_OVERRIDE_WITHOUT_METHOD: Final = _reason(
    CONFIG_COMPATIBLE,
    "SpeculativeOverrideWithoutMethod",
    "A role overrides spec.speculative, which is not set.",
    symptom=_NOTHING_STARTS,
    action="Set spec.speculative, or drop the role's speculative override",
)
RDMA_DEVICES_MISSING: Final = _reason(
    CONFIG_COMPATIBLE,
    "RDMADevicesMissing",
    "Protocol rdma without spec.kvTransfer.deviceNames.",
    symptom=_NOTHING_STARTS,
    action=(
        "List the RDMA devices in spec.kvTransfer.deviceNames (per role in "
        "spec.<role>.kvTransfer), or use protocol tcp"
    ),
)
DRAFT_MODEL_MISSING: Final = _reason(
    CONFIG_COMPATIBLE,
    "DraftModelMissing",
    "A method that drafts with a separate model has no spec.speculative.draftModel.",
    symptom=_NOTHING_STARTS,
    action="Set spec.speculative.draftModel",
)
SPECULATIVE_TOKENS_INDIVISIBLE: Final = _reason(
    CONFIG_COMPATIBLE,
    "SpeculativeTokensIndivisible",
    "numSpeculativeTokens exceeds mtpModules without being a multiple of it (vLLM refuses).",
    symptom=_NOTHING_STARTS,
    action="Make numSpeculativeTokens at most mtpModules, or a multiple of it",
)
INVALID_SPEC: Final = _reason(
    CONFIG_COMPATIBLE,
    "InvalidSpec",
    "The object does not parse as a PDDeployment (types, bounds, unknown fields).",
    symptom="The object is stored but nothing is reconciled",
    action="Fix the field the message names; `pdmtp validate FILE` gives the same verdict offline",
)

# Available.
MINIMUM_REPLICAS_AVAILABLE: Final = _reason(
    AVAILABLE,
    "MinimumReplicasAvailable",
    "Serving revisions have at least replicas - maxUnavailable ready pods per role that "
    "their Ready routers list.",
)
MINIMUM_REPLICAS_UNAVAILABLE: Final = _reason(
    AVAILABLE,
    "MinimumReplicasUnavailable",
    "A revision serves, but with fewer ready pods than the floor.",
    symptom="Serving, but with fewer ready pods than replicas - maxUnavailable",
    action=_READ_WAITING_FOR,
)
NO_SERVING_REVISION: Final = _reason(
    AVAILABLE,
    "NoServingRevision",
    "No revision has a ready router with a ready prefill and decode.",
    symptom="Requests fail or hang: nothing serves",
    action=_READ_WAITING_FOR + "; a first rollout also waits for image pulls and model loading",
)

# Progressing.
ROLLOUT_IN_PROGRESS: Final = _reason(
    PROGRESSING,
    "RolloutInProgress",
    "A paired rollout or a scale is under way; the message names what it waits for, if anything "
    "(status.waitingFor).",
    symptom="A rollout or a scale is running",
    action=(
        "Nothing unless it lasts: `pdmtp rollout status NAME` waits for it and says what it waits"
        " for"
    ),
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
    symptom="The rollout stops with no step it may take (a Warning event)",
    action=(
        "Fix what ConfigCompatible reports, or give the rollout room: maxSurge or maxUnavailable "
        "above 0"
    ),
)
PODS_UNSCHEDULABLE: Final = _reason(
    PROGRESSING,
    "PodsUnschedulable",
    "The scheduler cannot place pods of the update revision (engines or its router); the message "
    "names them with the scheduler's reason.",
    symptom="New pods stay Pending",
    action=(
        "The message quotes the scheduler: free GPUs or fix nodeSelector, affinity and taints; on"
        " a full cluster roll with maxSurge: 0 and maxUnavailable: 1"
    ),
)
PAUSED: Final = _reason(
    PROGRESSING,
    "Paused",
    "spec.rollout.paused: the rollout is frozen (status Unknown).",
    symptom="Progressing=Unknown and nothing moves",
    action="`pdmtp rollout resume NAME` when you want it to go on",
)
CANARY_HOLD: Final = _reason(
    PROGRESSING,
    "CanaryHold",
    "The new revision serves its canary share next to the old one; promote it (status Unknown). "
    "The message names what the hold still waits for (a router or engine pod not Ready), if "
    "anything.",
    symptom="The new revision serves its share and waits",
    action=(
        "Judge the canary, then `pdmtp rollout promote NAME` to go on or `pdmtp rollout undo "
        "NAME` to go back"
    ),
)
AWAITING_VERDICT: Final = _reason(
    PROGRESSING,
    "AwaitingVerdict",
    "spec.verification.mode is Rollback or Gate: the new revision serves and the old revision "
    "keeps its last pods until the new one has a verdict (Gate: until it is Verified; a canary "
    "waits for it to promote by itself). No verdict within progressDeadlineSeconds: Gate fails "
    "the rollout, Rollback goes on unverified (VerdictWaived).",
    symptom="A roll stops with the old revision's last pods serving",
    action=(
        "Read the Verified condition: send traffic through the new revision, or promote it by "
        "hand (`pdmtp rollout promote NAME`)"
    ),
)
PROGRESS_DEADLINE_EXCEEDED: Final = _reason(
    PROGRESSING,
    "ProgressDeadlineExceeded",
    "No progress for spec.rollout.progressDeadlineSeconds; the message says what it waits for.",
    symptom="A rollout stuck for progressDeadlineSeconds (onFailure: Hold; a Warning event)",
    action=_READ_WAITING_FOR + "; fix it and the rollout goes on, or `pdmtp rollout undo NAME`",
)
ROLLOUT_FAILED: Final = _reason(
    PROGRESSING,
    "RolloutFailed",
    "The new revision failed (an engine refused its config or crash-loops) and onFailure is "
    "Hold, or nothing older serves: the rollout stays where it is.",
    symptom=(
        "The new revision's engines refuse to start or crash-loop; the rollout holds (a Warning "
        "event)"
    ),
    action=(
        "Read Degraded's message (the launcher's reason) and the pods' previous logs; apply a "
        "fixed spec, or `pdmtp rollout undo NAME`"
    ),
)
ROLLOUT_ABORTED: Final = _reason(
    PROGRESSING,
    "RolloutAborted",
    "The rollout to the spec's revision was rolled back (see Degraded); a new spec change "
    "starts a new rollout.",
    symptom="The spec's revision is not the one serving",
    action="See Degraded (RolledBack): apply a fixed spec to try again",
)
CHILD_REJECTED: Final = _reason(
    PROGRESSING,
    "ChildRejected",
    "The API server refused a write to a child (admission policy, quota, invalid object, a "
    "persisting conflict); the message is the server's. Cleared by the next write that passes.",
    symptom="A child is missing or stale; a Warning event quotes the API server",
    action=(
        "Fix what the server names (an admission policy, a quota, a field); `pdmtp validate "
        "--server FILE` or the webhook catch it before an apply"
    ),
)
PODS_REJECTED: Final = _reason(
    PROGRESSING,
    "PodsRejected",
    "A child Deployment cannot create its pods (ReplicaFailure: quota, admission); the message "
    "is the server's.",
    symptom="A Deployment has fewer pods than it wants (a Warning event)",
    action="Raise the ResourceQuota, or relax the admission policy, that the message names",
)

# Degraded.
AS_EXPECTED: Final = _reason(
    DEGRADED, "AsExpected", "No engine container has terminated with an error."
)
ENGINE_REFUSED_CONFIG: Final = _reason(
    DEGRADED,
    "EngineRefusedConfig",
    "The engine launcher refused its configuration (exit 3, reason in the message).",
    symptom="Engine pods exit 3 at start",
    action=(
        "The message says what differs from what the operator expects (lookahead, backoff, "
        "connector, kv_role): an image without pdmtp's launcher and connector, or extraArgs that "
        "change the speculative config"
    ),
)
ENGINE_TERMINATED: Final = _reason(
    DEGRADED,
    "EngineTerminated",
    "An engine container ended with an error and a message.",
    symptom="An engine container ended with an error",
    action=(
        "The message is its termination message; read the pod's previous log and its node's events"
    ),
)
ROLLED_BACK: Final = _reason(
    DEGRADED,
    "RolledBack",
    "The new revision failed and was scaled away; the old one serves. The spec is unchanged: a "
    "new spec change starts a new rollout.",
    symptom="A rollout went back by itself; the old revision serves (a Warning event)",
    action=(
        "The message carries the failure (the launcher's reason, a crash loop, the deadline); fix"
        " the spec and apply it again: it was not rewritten"
    ),
)

WORKLOAD_API_UNAVAILABLE: Final = _reason(
    CONFIG_COMPATIBLE,
    "WorkloadAPIUnavailable",
    "A role spans nodes (multiNode) but the API server does not serve the Workload API "
    "(scheduling.k8s.io PodGroup) that gang-schedules its groups: nothing is created for the "
    "spec (a half-placed group would hold GPUs and serve nothing); serving pods are left alone.",
    symptom="A multi-node PDDeployment has no pods",
    action="Serve the Workload API (see Prerequisites), or drop multiNode",
)

# Verified: the update revision's P/D path judged on what its decodes did
# (`core.verification.verdict`).
_READ_VERIFY = (
    "Run `pdmtp verify NAME`: it prints, per revision, the requests that pulled KV, the tokens "
    "pulled and recomputed, the failures and the acceptance"
)
HANDOFF_VERIFIED: Final = _reason(
    VERIFIED,
    "HandoffVerified",
    "The revision's decodes pulled the prefills' KV for enough requests, recomputed the derived "
    "backoff, fail no more pulls than the serving revision, and the sequential test found their "
    "accepted tokens per draft as high as the reference's.",
)
NO_METRICS: Final = _reason(
    VERIFIED,
    "NoMetrics",
    "No decode pod of the revision has been scraped yet (Pending).",
    symptom="A canary or a paired roll in mode Gate does not move on",
    action=(
        "Check that the operator reaches the engines' metrics port (the NetworkPolicy admits "
        "pods labelled pdmtp.io/metrics-scraper) and that the decode pods are Ready"
    ),
)
AWAITING_REQUESTS: Final = _reason(
    VERIFIED,
    "AwaitingRequests",
    "Too few requests have pulled KV for a verdict (Pending; spec.verification.minRequests).",
    symptom="A canary or a paired roll in mode Gate waits with traffic low",
    action=(
        "The operator's probes (spec.verification.probeRequestsPerMinute) bring the verdict; "
        "if they do not, check pdmtp_verification_probes_total with result failed, and that "
        "the operator reaches the router pods, or promote the canary by hand"
    ),
)
AWAITING_DRAFTS: Final = _reason(
    VERIFIED,
    "AwaitingDrafts",
    "The evidence does not yet decide whether accepted tokens per draft regressed (Pending): "
    "too few drafts (spec.verification.minDrafts) or scrape windows, or a sequential test not "
    "conclusive yet (spec.verification.falseRollbackPercent and smallestRegressionPercent set "
    "how much evidence it needs).",
    symptom="A canary or a paired roll in mode Gate waits with traffic low",
    action=(
        "The operator's probes (spec.verification.probeRequestsPerMinute) bring the verdict; "
        "if they do not, check pdmtp_verification_probes_total with result failed, and that "
        "the operator reaches the router pods, or promote the canary by hand"
    ),
)
HANDOFF_NOT_REPORTED: Final = _reason(
    VERIFIED,
    "HandoffNotReported",
    "A decode exports metrics but no hand-off counts: its engine lacks the fixed Mooncake "
    "connector (Failed).",
    symptom="A rollout rolls back, or the Verified condition is False",
    action="Use the pdmtp engine image (images/engine), whose connector applies the MTP backoff",
)
_READ_TRANSFER_ERRORS = (
    "Read the decode's log for Mooncake transfer errors: a port, protocol or device that differs "
    "between the roles, or a prefill restarted under its pairs. "
)
KV_PULL_FAILED: Final = _reason(
    VERIFIED,
    "KVPullFailed",
    "The decodes' KV receives fail more often than the serving revision's (ten times its rate "
    "is what the test is built to catch), or than a 1 % ceiling where there is no other "
    "revision, or most of them fail; under kvTransfer.loadFailurePolicy recompute, each failed "
    "pull was recomputed by the decode (Failed).",
    symptom="A rollout rolls back, or the Verified condition is False on a serving revision",
    action=_READ_TRANSFER_ERRORS + _READ_VERIFY,
)
KV_LOAD_FAILED: Final = _reason(
    VERIFIED,
    "KVLoadFailed",
    "As KVPullFailed, under kvTransfer.loadFailurePolicy fail (vLLM's default since 0.32): each "
    "failed pull failed its request, so clients saw the errors (Failed).",
    symptom="Clients get errors (finish reason error, or HTTP 500 through the router), a "
    "rollback, or Verified False",
    action=_READ_TRANSFER_ERRORS
    + "Set kvTransfer.loadFailurePolicy: recompute to have the decode recompute instead, at the "
    "cost of its compute. " + _READ_VERIFY,
)
DECODE_ONLY_FALLBACK: Final = _reason(
    VERIFIED,
    "DecodeOnlyFallback",
    "The decodes serve requests with no prefill's KV (recomputing the whole prompt) more often "
    "than the serving revision, or than a 1 % ceiling where there is no other revision, or for "
    "most requests (Failed).",
    symptom="Higher decode load and latency, a rollback, or Verified False",
    action=(
        "Check the router's P/D pairing and the kv-transfer config of both roles. " + _READ_VERIFY
    ),
)
BACKOFF_MISMATCH: Final = _reason(
    VERIFIED,
    "BackoffMismatch",
    "The decodes recomputed a different number of prompt tokens per request than the backoff "
    "derived from the lookahead (Failed): the stale-draft-KV fault of vLLM #55055.",
    symptom="Lower MTP acceptance, a rollback, or Verified False",
    action="Use the pdmtp engine image; compare status.lookahead with the engines' launch log",
)
ACCEPTANCE_REGRESSED: Final = _reason(
    VERIFIED,
    "AcceptanceRegressed",
    "A sequential test found accepted tokens per draft below the serving revision's over the "
    "same span (or spec.verification.expectedAcceptanceLength): the evidence for a drop of "
    "spec.verification.smallestRegressionPercent outweighs the evidence for none by "
    "1 / (falseRollbackPercent / 4) (Failed).",
    symptom="Lower decode throughput, a rollback, or Verified False",
    action=(
        "Compare the revisions' speculative settings and checkpoints; "
        + _READ_VERIFY
        + "; a drop smaller than smallestRegressionPercent that should pass: raise it"
    ),
)
VERIFICATION_OFF: Final = _reason(
    VERIFIED, "VerificationOff", "spec.verification.mode is Off: nothing is judged."
)

# Events (besides a condition's reason, which its transitions are posted under).
CREATED: Final = _reason(EVENT, "Created", "A child object was created.")
UPDATED: Final = _reason(
    EVENT,
    "Updated",
    "A child's owned fields were set back to what the spec renders (the message lists them): a "
    "spec change, or a foreign edit reverted.",
    symptom="Updated events that no spec change explains",
    action=(
        "Something else edits the operator's children (a person, another controller, a mutating "
        "webhook) and is reverted: find it in the child's managedFields"
    ),
)
SCALED: Final = _reason(EVENT, "Scaled", "An old revision's Deployment was scaled.")
POD_LEAVING: Final = _reason(
    EVENT,
    "PodLeaving",
    "An engine pod a scale-down removes left its routers first; it is deleted once no router "
    "lists it.",
)
REPLACING_POD: Final = _reason(
    EVENT,
    "ReplacingPod",
    "A serving decode's KV receives kept failing, at least as often as they succeeded "
    "(spec.verification.replaceAfterFailedPulls; under kvTransfer.loadFailurePolicy fail each "
    "was a failed request): "
    "a new pod is started, and the failing one leaves its routers and goes once it is listed "
    "(a Warning).",
    symptom="A decode pod replaced while nothing changed in the spec",
    action=(
        "One bad pod is replaced and the fault goes with it; if its replacement fails too, the "
        "fault is the revision's or the prefill's: read the decode's log for Mooncake transfer "
        "errors. " + _READ_VERIFY
    ),
)
TRAFFIC_STOPPED: Final = _reason(
    EVENT, "TrafficStopped", "A revision's router was turned off; its pods drain."
)
REVISION_RETIRED: Final = _reason(
    EVENT, "RevisionRetired", "A drained revision's workloads were deleted."
)
ROLLBACK_STARTED: Final = _reason(
    EVENT,
    "RollbackStarted",
    "The new revision failed: rolling back to the old one (a Warning).",
    symptom="A rollout turns back",
    action="See RolledBack",
)
VERDICT_WAIVED: Final = _reason(
    EVENT,
    "VerdictWaived",
    "spec.verification.mode Rollback: the new revision had no verdict within "
    "progressDeadlineSeconds, so the old revision's last pods no longer wait for it and the "
    "rollout goes on unverified (a Warning; status.rollout.verdictWaived says so until the spec "
    "changes).",
    symptom="A rollout completed while the Verified condition was not True",
    action=(
        "Send traffic through the new revision (or raise probeRequestsPerMinute) so a verdict "
        "comes in time; mode Gate fails such a rollout instead of going on"
    ),
)
TEMPLATE_HELD: Final = _reason(
    EVENT,
    "TemplateHeld",
    "A role-local change (env, extraArgs, resources, RDMA devices, pod settings) started rolling "
    "inside the serving revision; spec.verification.mode Rollback or Gate holds the role's roll "
    "at its first new pods until they have a verdict (status.templateRolls).",
)
TEMPLATE_VERIFIED: Final = _reason(
    EVENT, "TemplateVerified", "A role's new pod template was Verified; its roll goes on."
)
TEMPLATE_ROLLED_BACK: Final = _reason(
    EVENT,
    "TemplateRolledBack",
    "A role's new pod template failed its verdict (or, mode Gate, had none within "
    "progressDeadlineSeconds): the role went back to the template that was Verified, and stays "
    "there until its settings change (a Warning).",
    symptom="A role-local change did not roll out; the role runs its previous template",
    action=(
        "Read status.templateRolls and the Verified condition for the verdict, fix the role's "
        "settings (an env var that drops the fixed connector, a wrong RDMA device) and apply again"
    ),
)
GROUP_REMOVED: Final = _reason(
    EVENT,
    "GroupRemoved",
    "A multi-node group was deleted whole: a scale-down, or a member failed or went away (vLLM's "
    "ranks cannot rejoin a running engine; a new group takes its place).",
    symptom="A multi-node group was replaced whole",
    action=(
        "Expected on a scale-down; otherwise a member failed: read its node's events and the "
        "pod's previous log"
    ),
)
PROMOTED: Final = _reason(EVENT, "Promoted", "A canary revision was promoted; the rollout goes on.")
STALLED: Final = _reason(
    EVENT,
    "Stalled",
    "A rollout, canary hold or scale started waiting on something that will not resolve by "
    "itself: a pod the scheduler cannot place, an image it cannot pull, a container that cannot "
    "start or crash-loops, a disruption budget over a stuck role (a Warning, once per new "
    "object and reason; the message names them).",
    symptom="A rollout, canary hold or scale waits (a Warning event)",
    action=(
        "The message names the pod and why: place it (resources, taints), fix the image or the "
        "missing Secret, or let the disruption budget's role become Ready"
    ),
)
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
        HANDOFF_NOT_REPORTED,
        KV_PULL_FAILED,
        KV_LOAD_FAILED,
        DECODE_ONLY_FALLBACK,
        BACKOFF_MISMATCH,
        ACCEPTANCE_REGRESSED,
    }
)
"""Reasons whose condition, whenever it appears or changes its message, is a Warning event."""
